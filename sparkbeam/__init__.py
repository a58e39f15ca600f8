"""sparkbeam: run Apache Beam Python pipelines on Apache Spark through PySpark."""
from __future__ import annotations

from sparkbeam.options import SparkOptions
from sparkbeam.runner import SparkPipelineResult, SparkRunner

__all__ = ["SparkOptions", "SparkPipelineResult", "SparkRunner"]
__version__ = "0.1.0"
