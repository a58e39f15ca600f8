"""The Beam Job API for sparkbeam: `sparkbeam job-server`.

The executor is injected (`JobServer(executor)`); this package never imports the Spark
executor or pyspark. See protocol.py for what an executor must do.
"""
from __future__ import annotations

from sparkbeam.jobservice.protocol import JobExecutor, RunHandle, StagingArea
from sparkbeam.jobservice.server import JobServer, build_parser, main
from sparkbeam.jobservice.servicer import JobService

__all__ = ["JobExecutor", "JobServer", "JobService", "RunHandle", "StagingArea", "build_parser",
           "main"]
