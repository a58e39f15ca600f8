"""Per-process set-up of a Spark Python worker that runs Beam stages (no pyspark here)."""
from __future__ import annotations

import hashlib
import threading

from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import pipeline_context as beam_pipeline_context

_LOCK = threading.Lock()
_CONTEXTS: dict[str, beam_pipeline_context.PipelineContext] = {}
_PICKLER: list[str] = []


def prepare(pickle_library: str) -> None:
    """Selects the pickler the pipeline was built with, once per process (as sdk_worker_main)."""
    with _LOCK:
        if _PICKLER and _PICKLER[0] == pickle_library:
            return
        from apache_beam.internal import pickler

        pickler.set_library(pickle_library)
        _PICKLER[:] = [pickle_library]


def pipeline_context(components: bytes) -> beam_pipeline_context.PipelineContext:
    """A PipelineContext over the plan's components, built once per process."""
    digest = hashlib.sha1(components).hexdigest()
    with _LOCK:
        ctx = _CONTEXTS.get(digest)
        if ctx is None:
            if len(_CONTEXTS) > 16:
                _CONTEXTS.clear()
            ctx = beam_pipeline_context.PipelineContext(
                beam_runner_api_pb2.Components.FromString(components)
            )
            _CONTEXTS[digest] = ctx
        return ctx
