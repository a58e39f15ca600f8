"""`sparkbeam run | job-server | class-archive | bench`."""
from __future__ import annotations

import argparse
import logging
import runpy
import subprocess
import sys

_RUNNER_FLAG = "--runner=sparkbeam.SparkRunner"


def _run(args: argparse.Namespace) -> int:
    """Runs a pipeline script on the in-process SparkRunner (its own flags follow `--`).

    The job's messages, progress lines included (`--progress_interval`), reach the user on
    stderr through the `sparkbeam.runner` logger, which `main` sets up at INFO.
    """
    pipeline_args = list(args.pipeline_args)
    if pipeline_args[:1] == ["--"]:
        pipeline_args = pipeline_args[1:]
    if not any(a.startswith("--runner") for a in pipeline_args):
        pipeline_args.append(_RUNNER_FLAG)
    sys.argv = [args.script, *pipeline_args]
    runpy.run_path(args.script, run_name="__main__")
    return 0


def _job_server(argv: list[str]) -> int:
    """`sparkbeam job-server [flags]`: the flags are the server's own (see --help)."""
    from sparkbeam.jobservice import server

    from sparkbeam.spark_executor import SparkJobExecutor

    return int(server.main(argv, executor_factory=SparkJobExecutor) or 0)


def _class_archive(args: argparse.Namespace) -> int:
    """Makes this machine's JVM class archive for the drivers sparkbeam launches, unless made
    (see `sparkbeam.execute.class_archive`)."""
    from sparkbeam.execute.class_archive import build

    build(force=args.force)
    return 0


def _bench(args: argparse.Namespace) -> int:
    command = [sys.executable, "-m", "bench.run", "--scale", args.scale]
    return subprocess.call(command)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkbeam", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a Beam pipeline script on Spark")
    run.add_argument("script")
    run.add_argument("pipeline_args", nargs=argparse.REMAINDER)
    run.set_defaults(func=_run)
    # The job server parses its own flags (`sparkbeam job-server --help` lists them).
    sub.add_parser("job-server", help="serve Beam's Job API (PortableRunner clients)",
                   add_help=False)
    archive = sub.add_parser(
        "class-archive", help="make the JVM class archive that starts sparkbeam's Spark drivers "
        "faster (once a machine; ~45 s)")
    archive.add_argument("--force", action="store_true", help="make it again")
    archive.set_defaults(func=_class_archive)
    bench = sub.add_parser("bench", help="run the benchmarks against the peers")
    bench.add_argument("--scale", default="quick", choices=["quick", "full"])
    bench.set_defaults(func=_bench)
    args, rest = parser.parse_known_args(argv)
    if args.command == "job-server":
        return _job_server(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    # A job's messages are INFO; making the class archive says one line of its own (Beam's
    # INFO lines as it is imported would only be noise there).
    level = logging.WARNING if args.command == "class-archive" else logging.INFO
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s", force=True
    )
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
