"""Beam transforms for systems Python-only Spark users have: Kafka (`kafka.py`).

Plain Beam transforms (splittable DoFns and DoFns), so they run on any Beam runner; no Java
expansion service and no Docker, unlike Beam's cross-language `apache_beam.io.kafka`."""
from __future__ import annotations

from sparkbeam.io.kafka import KafkaError, ReadFromKafka, WriteToKafka

__all__ = ["KafkaError", "ReadFromKafka", "WriteToKafka"]
