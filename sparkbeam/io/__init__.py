"""Beam transforms for systems Python-only Spark users have: Kafka (`kafka.py`), Spark's own
tables and data sources (`spark.py`).

Plain Beam transforms (splittable DoFns and DoFns), so they run on any Beam runner; no Java
expansion service and no Docker, unlike Beam's cross-language `apache_beam.io.kafka`."""
from __future__ import annotations

from typing import Any

from sparkbeam.io.kafka import KafkaError, ReadFromKafka, WriteToKafka

__all__ = ["KafkaError", "ReadFromKafka", "ReadFromSpark", "UnsupportedSparkType",
           "WriteToKafka", "WriteToSpark", "spark_session"]
_SPARK = {"ReadFromSpark": "spark", "WriteToSpark": "spark", "spark_session": "spark",
          "UnsupportedSparkType": "spark_schema"}


def __getattr__(name: str) -> Any:
    # The Spark transforms load pyspark: only a pipeline that uses them pays for it.
    if name in _SPARK:
        import importlib

        return getattr(importlib.import_module(f"sparkbeam.io.{_SPARK[name]}"), name)
    raise AttributeError(f"module 'sparkbeam.io' has no attribute {name!r}")
