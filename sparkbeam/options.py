"""SparkOptions: the pipeline options sparkbeam reads."""
from __future__ import annotations

import argparse

from apache_beam.options.pipeline_options import PipelineOptions

LOG_LEVELS = ("OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL")
DEFAULT_BUNDLE_SIZE = 1000
# A batch stage with no keys, state or splitting (a read's or a Map chain's) takes bundles this
# large unless --bundle_size says otherwise: each bundle costs a round of the SDK's bundle
# life cycle and ends lifted combiners' pre-combining (a 1,000-line bundle of a word count
# sends most of its words on uncombined); --bundle_bytes still bounds them.
PLAIN_BUNDLE_SIZE = 1_000_000
DEFAULT_BUNDLE_BYTES = 64 << 20


class SparkOptions(PipelineOptions):
    """Options of the Spark runner (`--spark_master`, `--spark_conf`, bundle bounds...)."""

    @classmethod
    def _add_argparse_args(cls, parser) -> None:  # type: ignore[no-untyped-def]
        def add_argument(flag: str, **kwargs) -> None:  # type: ignore[no-untyped-def]
            # Beam's FlinkRunnerOptions defines --parallelism too: share it, don't clash.
            if flag not in getattr(parser, "_option_string_actions", {}):
                parser.add_argument(flag, **kwargs)

        add_argument(
            "--spark_master",
            default=None,
            help="Spark master URL for a new session (local[*], spark://host:port, yarn, "
            "k8s://...). Default: the master spark-submit was given, else local[*]. "
            "An active SparkSession is reused when there is one.",
        )
        add_argument(
            "--spark_remote",
            default=None,
            help="Spark Connect URL (sc://host:port) for a new session; an active Connect "
            "session is reused.",
        )
        add_argument(
            "--spark_conf",
            action="append",
            default=None,
            help="Extra Spark configuration as key=value; repeatable.",
        )
        add_argument(
            "--parallelism",
            type=int,
            default=None,
            help="Number of partitions for shuffles and spread stages "
            "(default: Spark's default parallelism).",
        )
        add_argument(
            "--bundle_size",
            type=int,
            default=None,
            help=f"Most elements fed to the bundle processor in one bundle (default: "
            f"{PLAIN_BUNDLE_SIZE:,} for stages without keys, state or splitting, "
            f"{DEFAULT_BUNDLE_SIZE:,} for the others).",
        )
        add_argument(
            "--bundle_bytes",
            type=int,
            default=DEFAULT_BUNDLE_BYTES,
            help="Most encoded input bytes fed to the bundle processor in one bundle.",
        )
        add_argument(
            "--dynamic_splitting",
            choices=["on", "off"],
            default="on",
            help="Split straggling bundles of splittable DoFns and give the residual to idle "
            "tasks of the same stage (dynamic work rebalancing).",
        )
        add_argument(
            "--spark_native",
            choices=["on", "off"],
            default="on",
            help="Batch: let Spark's own operators do what they do exactly as Beam would "
            "(ReadFromText through Spark's text source), group windowed GroupByKeys "
            "under the default trigger per window without Beam's trigger driver, and call "
            "plain stages' Map/FlatMap/Filter functions without Beam's bundle processor; "
            "'off' keeps Beam's transforms, trigger driver and bundle processor everywhere. "
            "The job's log says which path each transform took.",
        )
        add_argument(
            "--arrow_batch_bytes",
            default="auto",
            help="Batch: the most bytes of rows Spark puts in one Arrow batch for a stage's "
            "Python workers (besides 10,000 rows). 'auto' (default): no byte limit when every "
            "row the plan's stages read is provably small (their coders bound them), and as "
            "many rows as 64 MB holds of the largest, up to 100,000; else Spark's limits "
            "(64 MB, 10,000 rows); 'rows': no byte limit (Spark then skips a size check per row: "
            "~20 %% faster on 10 M small rows; a batch holds 10,000 elements however large "
            "they are); a number: that many bytes.",
        )
        add_argument(
            "--worker_connect_timeout",
            type=float,
            default=60.0,
            help="Seconds an SDK worker of a PROCESS or EXTERNAL environment has to connect.",
        )
        add_argument(
            "--progress_interval",
            type=float,
            default=5.0,
            help="Seconds between progress lines (elements read, bytes, tasks done per stage) "
            "in the job's messages and log; 0 disables them.",
        )
        add_argument(
            "--checkpoint_dir",
            default=None,
            help="Streaming (--streaming): the query's checkpoint directory (required); a job "
            "restarted on the same directory resumes where it stopped. Executors read its "
            "offset log, so it must be a path they share with the driver.",
        )
        add_argument(
            "--trigger_interval",
            default="0 seconds",
            help="Streaming: the micro-batch trigger interval, e.g. '1 second' (default: start "
            "the next batch as soon as the previous one ends).",
        )
        add_argument(
            "--max_items_per_batch",
            type=int,
            default=None,
            help="Streaming: the work budget, most source elements one micro-batch reads, split "
            "evenly over the sources with work (default: no limit).",
        )
        add_argument(
            "--max_bytes_per_batch",
            type=int,
            default=None,
            help="Streaming: the work budget in encoded bytes per micro-batch (default: no "
            "limit); a single element larger than its share is read alone.",
        )
        add_argument(
            "--spark_log_level",
            default="ERROR",
            choices=LOG_LEVELS,
            help="Log level of the Spark driver of a session sparkbeam creates (default ERROR: "
            "Spark's warnings stay out of the way; WARN or INFO to see them).",
        )
        add_argument(
            "--spark_class_archive",
            default="auto",
            choices=["auto", "off"],
            help="auto: a Spark driver sparkbeam launches maps this machine's JVM class archive "
            "for its Java and Spark, when one was made (`sparkbeam class-archive`; ~2 s off "
            "the session's start, ~1 s off its first job); off: never.",
        )
        add_argument(
            "--spark_app_name",
            default="sparkbeam",
            help="Application name of a SparkSession that sparkbeam creates.",
        )


def option_actions() -> list[argparse.Action]:
    """The flags SparkOptions defines (what the Job API's DescribePipelineOptions lists)."""
    parser = argparse.ArgumentParser()
    SparkOptions._add_argparse_args(parser)
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


def positive_or_none(value: int | None) -> int | None:
    """Beam's shared --parallelism defaults to -1 (Flink's "unset")."""
    return value if value is not None and value > 0 else None


def parse_spark_conf(entries: list[str] | None) -> dict[str, str]:
    """Turns repeated `key=value` entries into a dict; a malformed entry is a clear error."""
    from sparkbeam.errors import SparkBeamError

    conf: dict[str, str] = {}
    for entry in entries or []:
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise SparkBeamError(
                f"--spark_conf expects key=value, got {entry!r}"
            )
        conf[key.strip()] = value.strip()
    return conf
