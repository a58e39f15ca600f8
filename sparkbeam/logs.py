"""Quiet by default: Beam's harmless import-time warnings do not reach the user.

Importing apache_beam logs, on the root logger, that the optional Google Cloud client libraries
are missing ("apitools not found ..."), once per process: in the driver and in every Spark
Python worker. They say nothing about the pipeline. `quiet_beam_imports` drops exactly those
messages; it must run before apache_beam is first imported (`import sparkbeam` first does it
in the driver; the worker daemon does it before it loads Beam).
"""
from __future__ import annotations

import logging

HARMLESS = (
    "apitools not found, and bigquery client libraries are not available",
)


class _DropHarmless(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in HARMLESS)


def quiet_beam_imports() -> None:
    """Drops Beam's harmless import warnings from the root logger (idempotent)."""
    root = logging.getLogger()
    if not any(isinstance(f, _DropHarmless) for f in root.filters):
        root.addFilter(_DropHarmless())
