"""sparkbeam: run Apache Beam Python pipelines on Apache Spark through PySpark."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkbeam.logs import quiet_beam_imports

quiet_beam_imports()  # before anything loads apache_beam

if TYPE_CHECKING:
    from sparkbeam.options import SparkOptions
    from sparkbeam.runner import SparkPipelineResult, SparkRunner

__all__ = ["SparkOptions", "SparkPipelineResult", "SparkRunner"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Loaded on first use: the Python processes Spark starts to plan a streaming query (its
    # source's batches, its stateful operators' state) import sparkbeam's light modules only,
    # and must not pay for apache_beam (~1 s each, on every query's start). Beam parses
    # --spark_* flags whenever the options are viewed as SparkOptions, which needs this class.
    if name == "SparkOptions":
        from sparkbeam.options import SparkOptions

        return SparkOptions
    if name in ("SparkRunner", "SparkPipelineResult"):
        from sparkbeam import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'sparkbeam' has no attribute {name!r}")
