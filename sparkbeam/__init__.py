"""sparkbeam: run Apache Beam Python pipelines on Apache Spark through PySpark."""
from __future__ import annotations

from sparkbeam.logs import quiet_beam_imports

quiet_beam_imports()  # before the imports below load apache_beam

from sparkbeam.options import SparkOptions  # noqa: E402
from sparkbeam.runner import SparkPipelineResult, SparkRunner  # noqa: E402

__all__ = ["SparkOptions", "SparkPipelineResult", "SparkRunner"]
__version__ = "0.1.0"
