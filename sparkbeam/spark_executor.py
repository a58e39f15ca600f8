"""The Spark executor injected into the job server (the job service never imports execute/)."""
from __future__ import annotations

import argparse
import logging
import os
import zipfile
from collections.abc import Callable
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions
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
            py_files=_importable(artifacts),
        )
        job.start()
        return job


def _option_type(kind: Any) -> beam_job_api_pb2.PipelineOptionType.Enum.ValueType:
    for python_type, option_type in _TYPES.items():
        if kind is python_type:
            return option_type
    return beam_job_api_pb2.PipelineOptionType.STRING


def _importable(artifacts: dict[str, list[beam_runner_api_pb2.ArtifactInformation]]) -> list[str]:
    """Staged files that executors can import from (wheels, zips, eggs) as local paths."""
    paths = []
    for infos in artifacts.values():
        for info in infos:
            payload = beam_runner_api_pb2.ArtifactFilePayload.FromString(info.type_payload)
            path = payload.path
            if path.endswith(_IMPORTABLE) and os.path.exists(path) and zipfile.is_zipfile(path):
                paths.append(path)
    return sorted(set(paths))
