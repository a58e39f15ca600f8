"""The Spark executor injected into the job server (the job service never imports execute/)."""
from __future__ import annotations

import argparse
import atexit
import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable
from typing import Any

from apache_beam.options import pipeline_options as beam_options
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_job_api_pb2, beam_runner_api_pb2
from google.protobuf import json_format, struct_pb2

from sparkbeam.errors import SparkBeamError
from sparkbeam.options import option_actions
from sparkbeam.runner import SparkJob, prepare

_LOG = logging.getLogger(__name__)

_TYPES = {
    int: beam_job_api_pb2.PipelineOptionType.INTEGER,
    float: beam_job_api_pb2.PipelineOptionType.NUMBER,
    bool: beam_job_api_pb2.PipelineOptionType.BOOLEAN,
}
# Staged files Spark executors can import from directly (zipimport).
_IMPORTABLE = (".whl", ".zip", ".egg")


def options_from_struct(options: struct_pb2.Struct) -> PipelineOptions:
    """Beam's portable options (`beam:option:<name>:v1` keys) as PipelineOptions.

    Every option is parsed here, once, so a value of the wrong type is refused at Prepare
    with a SparkBeamError naming it. (Beam parses options lazily, in each `view_as`, and its
    parser ends the process on a bad value: in a server, that would be a handler thread
    killed mid-request and a client waiting forever.)
    """
    raw = json_format.MessageToDict(options)
    plain: dict[str, Any] = {}
    for key, value in raw.items():
        name = key
        if name.startswith("beam:option:") and name.endswith(":v1"):
            name = name[len("beam:option:"):-len(":v1")]
        if value is None:
            continue
        plain[name] = value
    try:
        parsed = PipelineOptions.from_dictionary(plain)
        _check_option_values(parsed._flags)  # type: ignore[attr-defined]
    except SparkBeamError:
        raise
    except Exception as exc:  # noqa: BLE001 - any parse failure is bad input
        raise SparkBeamError(f"the pipeline options could not be read: {exc}") from exc
    return parsed


class _StrictParser(beam_options._BeamArgumentParser):
    """Beam's option parser, raising instead of exiting on a bad value."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("ambiguous option: "):
            return  # Beam's parser ignores these too
        raise SparkBeamError(f"the pipeline options could not be read: {message}")


def _check_option_values(flags: list[str]) -> None:
    """Parses `flags` with every known PipelineOptions class, as Beam's `get_all_options`."""
    parser = _StrictParser(allow_abbrev=False)
    classes: dict[str, type[PipelineOptions]] = {}
    for cls in PipelineOptions.__subclasses__():
        classes.setdefault(str(cls), cls)
    for cls in classes.values():
        cls._add_argparse_args(parser)  # type: ignore[attr-defined]
    parser.parse_known_args(flags)


# Settings of the SparkSession the job server starts (a job's --spark_conf may override them).
# The driver JVM of a long-lived server gives back heap it does not use: by default G1 grows the
# heap to its maximum with garbage between collections and keeps it, so the server's memory
# would climb for its first hundreds of jobs whatever it retains. A periodic collection when
# idle and tighter free-heap ratios keep the committed heap near the live set.
SERVER_SESSION_DEFAULTS = {
    "spark.driver.extraJavaOptions": (
        "-XX:+UseG1GC -XX:G1PeriodicGCInterval=15000 -XX:MinHeapFreeRatio=10 "
        "-XX:MaxHeapFreeRatio=30"
    ),
}


class SparkJobExecutor:
    """Runs the job server's pipelines with SparkRunner's planner and executor."""

    def __init__(self, args: argparse.Namespace | None = None) -> None:
        self._args = args

    def describe_options(self) -> list[beam_job_api_pb2.PipelineOptionDescriptor]:
        out = []
        for action in option_actions():
            out.append(
                beam_job_api_pb2.PipelineOptionDescriptor(
                    name=action.dest,
                    type=_option_type(action.type),
                    description=action.help or "",
                    default_value=str(action.default) if action.default is not None else "",
                    group="SparkOptions",
                )
            )
        return out

    def prepare(self, pipeline: beam_runner_api_pb2.Pipeline, options: struct_pb2.Struct) -> None:
        prepare(pipeline, options_from_struct(options))

    def start(
        self,
        job_id: str,
        pipeline: beam_runner_api_pb2.Pipeline,
        options: struct_pb2.Struct,
        artifacts: dict[str, list[beam_runner_api_pb2.ArtifactInformation]],
        on_message: Callable[[str], None],
        on_state: Callable[[str], None],
    ) -> SparkJob:
        pipeline_options = options_from_struct(options)
        plan = prepare(pipeline, pipeline_options)
        job = SparkJob(
            plan, pipeline_options, job_id=job_id, on_message=on_message, on_state=on_state,
            py_files=_python_packages(artifacts, job_id),
            session_defaults=SERVER_SESSION_DEFAULTS,
        )
        job.start()
        return job


def _option_type(kind: Any) -> beam_job_api_pb2.PipelineOptionType.Enum.ValueType:
    for python_type, option_type in _TYPES.items():
        if kind is python_type:
            return option_type
    return beam_job_api_pb2.PipelineOptionType.STRING


def _python_packages(
    artifacts: dict[str, list[beam_runner_api_pb2.ArtifactInformation]], job_id: str
) -> list[str]:
    """Importable archives for the executors, made from the job's staged Python artifacts.

    Wheels, zips and eggs ship as they are. `--extra_package` sdists and `--requirements_file`
    (with the packages Beam's client cached and staged next to it) are installed offline, from
    the staged files only, into one directory that ships as a zip: what the SDK container's
    boot would install into a worker, made available to Spark's Python workers.

    The archives are kept under a name made from their content (`_shipped`): Spark serves a
    file added to its context to executors for the context's whole life, so it must outlive
    the job (and the staged artifacts, which the job server deletes when it evicts the job),
    and a package shipped by many jobs is kept, and added, once. The job's working
    directories are deleted before this returns.
    """
    staged = _materialise(artifacts)
    if not staged:
        return []
    root, names = staged
    target = ""
    try:
        ready = [os.path.join(root, n) for n in names
                 if n.endswith(_IMPORTABLE) and zipfile.is_zipfile(os.path.join(root, n))]
        extra_list = os.path.join(root, "extra_packages.txt")
        extras = []
        if os.path.exists(extra_list):
            with open(extra_list) as f:
                extras = [ln.strip() for ln in f if ln.strip()]
        sdists = [os.path.join(root, n) for n in extras
                  if not n.endswith(_IMPORTABLE) and os.path.exists(os.path.join(root, n))]
        requirements = os.path.join(root, "requirements.txt")
        if sdists or os.path.exists(requirements):
            target = tempfile.mkdtemp(prefix=f"sparkbeam-{job_id}-site-")
            _install_offline(root, target, sdists, requirements, job_id)
            ready.append(shutil.make_archive(target, "zip", target))
        return [_shipped(path) for path in ready]
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if target:
            shutil.rmtree(target, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.remove(f"{target}.zip")


def _install_offline(
    root: str, target: str, sdists: list[str], requirements: str, job_id: str
) -> None:
    base = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--no-index", "--find-links", root, "--target", target, "--no-build-isolation"]
    commands = []
    if sdists:
        commands.append(base + ["--no-deps", *sdists])
    if os.path.exists(requirements):
        commands.append(base + ["-r", requirements])
    for command in commands:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SparkBeamError(
                f"{job_id}: installing the staged Python packages for the executors failed "
                f"({' '.join(command[5:])}): {done.stderr.strip()[-2000:]}"
            )


_SHIPPED_DIR: list[str] = []
_SHIPPED_LOCK = threading.Lock()


def _shipped(path: str) -> str:
    """A copy of `path` named by its content, in this process's directory of shipped
    packages (made on first use, removed at exit)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    with _SHIPPED_LOCK:
        if not _SHIPPED_DIR:
            _SHIPPED_DIR.append(tempfile.mkdtemp(prefix="sparkbeam-shipped-"))
            atexit.register(shutil.rmtree, _SHIPPED_DIR[0], True)
        kept = os.path.join(_SHIPPED_DIR[0], f"{digest.hexdigest()[:16]}-{os.path.basename(path)}")
        if not os.path.exists(kept):
            shutil.copyfile(path, f"{kept}.tmp")
            os.replace(f"{kept}.tmp", kept)
    return kept


def _materialise(
    artifacts: dict[str, list[beam_runner_api_pb2.ArtifactInformation]],
) -> tuple[str, list[str]] | None:
    """Links the staged files that are local under the names the client gave them."""
    root = ""
    names = []
    for infos in artifacts.values():
        for info in infos:
            if info.type_urn != common_urns.artifact_types.FILE.urn:
                continue
            path = beam_runner_api_pb2.ArtifactFilePayload.FromString(info.type_payload).path
            if not os.path.exists(path):
                continue  # e.g. staged to an fsspec URL: not shipped from here
            if info.role_urn == common_urns.artifact_roles.STAGING_TO.urn:
                name = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(
                    info.role_payload).staged_name
            elif info.role_urn == common_urns.artifact_roles.PIP_REQUIREMENTS_FILE.urn:
                name = "requirements.txt"
            else:
                name = os.path.basename(path)
            name = os.path.basename(name)
            if not name or name in names:
                continue
            root = root or tempfile.mkdtemp(prefix="sparkbeam-staged-")
            os.symlink(os.path.abspath(path), os.path.join(root, name))
            names.append(name)
    return (root, names) if names else None
