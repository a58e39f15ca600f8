"""The Spark executor injected into the job server (the job service never imports execute/)."""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_job_api_pb2, beam_runner_api_pb2
from google.protobuf import json_format, struct_pb2

from sparkbeam.errors import SparkBeamError
from sparkbeam.options import SparkOptions
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
    """Beam's portable options (`beam:option:<name>:v1` keys) as PipelineOptions."""
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
        return PipelineOptions.from_dictionary(plain)
    except Exception as exc:  # noqa: BLE001 - any parse failure is bad input
        raise SparkBeamError(f"the pipeline options could not be read: {exc}") from exc


class SparkJobExecutor:
    """Runs the job server's pipelines with SparkRunner's planner and executor."""

    def __init__(self, args: argparse.Namespace | None = None) -> None:
        self._args = args

    def describe_options(self) -> list[beam_job_api_pb2.PipelineOptionDescriptor]:
        parser = argparse.ArgumentParser()
        SparkOptions._add_argparse_args(parser)
        out = []
        for action in parser._actions:
            if not action.option_strings or action.dest == "help":
                continue
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
    """
    staged = _materialise(artifacts)
    if not staged:
        return []
    root, names = staged
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
    if not sdists and not os.path.exists(requirements):
        return ready
    target = tempfile.mkdtemp(prefix=f"sparkbeam-{job_id}-site-")
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
    archive = shutil.make_archive(target, "zip", target)
    return ready + [archive]


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
