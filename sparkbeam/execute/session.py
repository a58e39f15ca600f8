"""The SparkSession a job runs on: the active one, or one made from the options, once.

Sessions are made single-flight (`SingleFlight`): jobs that arrive together at a fresh job
server wait for the one start under way instead of racing to launch a second JVM gateway,
share its outcome, and a failed start is tried again by the next job. A gateway JVM that exits
as it launches is launched again, up to `GATEWAY_ATTEMPTS` times in all.
"""
from __future__ import annotations

import logging
import os
import re
import sys
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.utils import is_remote

from sparkbeam.errors import ExecutionError
from sparkbeam.execute.class_archive import driver_java_options
from sparkbeam.execute.single_flight import SingleFlight
from sparkbeam.options import SparkOptions, parse_spark_conf, positive_or_none

_LOG = logging.getLogger(__name__)

_STARTS: SingleFlight[SparkSession] = SingleFlight()
LOG4J_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")
_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


# What Spark's file sources count a file as costing to open, in bytes (its default: 4 MB).
# Spark splits files at min(128 MB, max(open cost, (bytes + files * open cost) / cores)), so
# one file on two cores was split at half of its bytes plus 2 MB: the bench's sessions input
# (14.7 MB) gave its two map tasks 9.4 and 5.2 MB, and the stage took the longer one's time,
# where hand-written PySpark's `textFile` splits it in halves. At 1 MB the excess is 0.5 MB
# (52/48 there), and an input under 1 MB is still one task (bench/ANALYSIS.md).
FILE_OPEN_COST = 1 << 20


_BYTES = re.compile(r"^\s*(\d+)\s*([kmgtp]?)i?b?\s*$", re.IGNORECASE)


def bytes_setting(spark: Any, name: str, default: int) -> int:
    """A byte-size setting of the session (Spark writes "4194304b", a user may write "1m");
    `default` when it cannot be read."""
    try:
        found = _BYTES.match(str(spark.conf.get(name)))
    except Exception:  # noqa: BLE001 - an estimate: the default serves
        return default
    if found is None:
        return default
    return int(found.group(1)) << (10 * "kmgtp".find(found.group(2).lower()) + 10
                                   if found.group(2) else 0)


def session_config() -> dict[str, str]:
    """Static Spark settings sparkbeam applies to sessions it creates (also for tests)."""
    return {
        # Workers forked from a daemon that has already imported Beam start warm.
        "spark.python.daemon.module": "sparkbeam.execute.daemon",
        # Not set here: Arrow batches' rows (Spark's 10,000) and bytes are each batch job's
        # own (`Datasets.arrow_batch_limits`), and a session's setting would override them.
        "spark.ui.showConsoleProgress": "false",
        # Adaptive execution re-plans nothing in a sparkbeam plan (every shuffle has its
        # partition count, no joins) but runs each shuffle as a Spark job of its own (seven
        # to nine for the one action of a small catalogue pipeline): off, one action is one
        # Spark job.
        "spark.sql.adaptive.enabled": "false",
        # Even splits of a large file (`FILE_OPEN_COST`).
        "spark.sql.files.openCostInBytes": str(FILE_OPEN_COST),
        # Spark keeps a Python daemon per distinct worker environment. Its SQL runners add
        # this variable (simplified tracebacks, on by default) to the UDF's environment, but
        # the runner of a streaming `transformWithState` does not: a streaming job then
        # started a second sparkbeam daemon, importing Beam again (~1.4 s of CPU) as its
        # first stateful micro-batch waited. Set for every worker, the environments match.
        "spark.executorEnv.SPARK_SIMPLIFIED_TRACEBACK": "1",
    }


def is_connect(spark: Any) -> bool:
    """Whether `spark` is a Spark Connect session (no SparkContext, no JVM in this process)."""
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError:  # pyspark without its `connect` extras
        return False
    return isinstance(spark, ConnectSession)


def active_session() -> SparkSession | None:
    """The active session, classic or Connect. A Connect session is active per thread only,
    and jobs run in threads of their own: fall back to its default (first) session."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    connect = sys.modules.get("pyspark.sql.connect.session")  # loaded once a client exists
    if connect is not None:
        try:
            return connect.SparkSession.active()  # type: ignore[no-any-return]
        except Exception:  # noqa: BLE001 - none active or default
            return None
    return None


def _users_session() -> SparkSession | None:
    """The classic session this process made, seen from a thread where it is not active (a
    classic session is active per thread: PySpark reads it from a JVM thread-local); None
    in a Connect client's process, or once it is stopped (as `getOrCreate` judges it)."""
    if is_remote():
        return None
    try:
        default = SparkSession.active()
    except Exception:  # noqa: BLE001 - none made in this process, or it was stopped
        return None
    return default if getattr(default.sparkContext, "_jsc", None) is not None else None


def get_session(options: SparkOptions, defaults: dict[str, str] | None = None) -> SparkSession:
    """The active SparkSession (classic or Connect) if there is one, else a new one from the
    options: a Spark Connect client when `--spark_remote` is set, a classic one otherwise.
    `defaults` are Spark settings for a new session that the options' `--spark_conf` may
    override (the job server's own).

    Raises `ExecutionError` naming the master when the session cannot start; every caller
    waiting on that start gets the same error.
    """
    active = active_session()
    if active is not None:
        return active
    if not defaults and not getattr(options, "spark_remote", None):
        # A session the user made, in another thread than this job's: without this, the
        # job asked for a new one with sparkbeam's settings, and `getOrCreate` applied them
        # to the user's (its shuffle partitions and adaptive execution changed under it).
        # Not for the job server (`defaults`), whose jobs bring their own SQL settings to
        # its session, nor under --spark_remote, which such a session cannot serve.
        users = _users_session()
        if users is not None:
            return users
    return _STARTS.run(lambda: active_session() or _start(options, defaults or {}))


def _start(options: SparkOptions, extra_defaults: dict[str, str]) -> SparkSession:
    # Workers must run the driver's interpreter (the one with apache_beam installed), unless
    # spark.pyspark.python says otherwise (a packed environment shipped with spark.archives):
    # PySpark reads only the environment variable when it is not launched by spark-submit.
    python = parse_spark_conf(options.spark_conf).get("spark.pyspark.python")
    if python:
        os.environ["PYSPARK_PYTHON"] = python
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    remote = getattr(options, "spark_remote", None)
    builder = SparkSession.builder
    master = None
    if remote:
        builder = builder.remote(remote)
    else:
        master = options.spark_master or _submitted_master() or "local[*]"
        builder = builder.master(master)
    builder = builder.appName(options.spark_app_name)
    defaults = {
        **session_config(),
        "spark.sql.shuffle.partitions": str(positive_or_none(options.parallelism) or 8),
        **extra_defaults,
    }
    if not (master or "").startswith("local"):
        # Executors elsewhere may not have sparkbeam installed: start their Python workers
        # with PySpark's own daemon; sparkbeam reaches them as a shipped zip.
        defaults.pop("spark.python.daemon.module", None)
    if remote and remote.startswith("sc://"):
        # A running Connect server takes runtime SQL settings only (the rest is its own).
        defaults = {k: v for k, v in defaults.items() if k.startswith("spark.sql.")}
    else:
        defaults[_JAVA_OPTIONS] = launched_driver_options(options, defaults.get(_JAVA_OPTIONS))
    for key, value in {**defaults, **parse_spark_conf(options.spark_conf)}.items():
        builder = builder.config(key, value)
    where = f"Spark Connect server {remote}" if remote else f"master {master}"
    for attempt in range(1, GATEWAY_ATTEMPTS + 1):
        _LOG.info("starting a SparkSession on %s", where)
        try:
            return builder.getOrCreate()
        except Exception as exc:  # noqa: BLE001 - any start failure is reported with its cause
            if remote or attempt == GATEWAY_ATTEMPTS or not _gateway_exited(exc):
                raise ExecutionError(
                    f"the SparkSession could not start on {where}: {type(exc).__name__}: {exc}"
                ) from exc
            _LOG.warning("the JVM gateway exited as it launched (PySpark's JAVA_GATEWAY_EXITED, "
                         "attempt %d of %d); launching it again", attempt, GATEWAY_ATTEMPTS)
    raise AssertionError("unreachable")


def launched_driver_options(options: SparkOptions, others: str | None = None) -> str:
    """The Java options of a driver JVM launched here, before `others` (a job server's)."""
    # The driver JVM logs at --spark_log_level from its first line (Spark's default profile
    # prints itself and every WARN of a local start before setLogLevel could act).
    quiet = (f"-Dlog4j2.configurationFile={LOG4J_CONFIG} "
             f"-Dsparkbeam.spark.log.level={options.spark_log_level}")
    # It maps this machine's class archive, if one was made (class_archive.py).
    archive = driver_java_options(options.spark_class_archive)
    return " ".join(filter(None, [quiet, archive, others]))


# A gateway JVM launched while the job server's gRPC threads are busy has, rarely (2 of ~20
# fresh-server load runs, never alone), exited before writing its port, with a gRPC poller in
# the same process reporting a closed descriptor at that moment: a launch that died at birth,
# not a setting that cannot work. A broken installation fails every attempt, in ~1 s each.
GATEWAY_ATTEMPTS = 3


def _gateway_exited(exc: BaseException) -> bool:
    get_class = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    return callable(get_class) and get_class() == "JAVA_GATEWAY_EXITED"


def _submitted_master() -> str | None:
    """The master spark-submit passed to this driver (it starts the JVM first and hands us
    the gateway), so a plain `--runner=sparkbeam.SparkRunner` runs where it was submitted."""
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # attach to spark-submit's JVM, whose conf has the master
    master = SparkConf().get("spark.master", None)
    return str(master) if master else None
