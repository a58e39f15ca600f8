"""Which WindowInto(GlobalWindows) transforms the embedded SDK worker runs without a DoFn
(no pyspark).

Beam's bundle processor runs a WindowInto as a ParDo of its `WindowIntoDoFn`, called once per
window of each element with Beam's per-window invoker; into the global window its output is
known without calling it (`control/window_into.py`). Every `WriteToText` and `FileBasedSink`
has one (Beam's `WriteImpl` re-windows what it writes), and it ran in whichever stage fed the
write: ~22 % of a sessions reduce stage (bench/ANALYSIS.md).

A WindowInto is rewritten here when all of these hold, and a line says so:
- its window function is Beam's `GlobalWindows` (`beam:window_fn:global_windows:v1`), which
  cannot fail and gives every element the same one window;
- its stage runs in sparkbeam's embedded SDK worker (not a PROCESS or EXTERNAL environment,
  whose Beam SDK worker knows only Beam's URNs);
- its stage is not run directly (`direct_paths`, `direct_stateful`): those call WindowInto
  themselves, and hand over to the bundle processor only with the descriptor as it was made.
"""
from __future__ import annotations

import dataclasses

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2

from sparkbeam import urns
from sparkbeam.plan.model import Plan, Stage, runs_embedded


def with_global_window_operation(plan: Plan) -> tuple[Plan, tuple[str, ...]]:
    """`plan` with each qualifying WindowInto(GlobalWindows) given `urns.INTO_GLOBAL_WINDOW`,
    and a line for each one rewritten."""
    stages: list[Stage] = []
    lines: list[str] = []
    for stage in plan.stages:
        direct = stage.direct is not None or stage.direct_stateful
        if direct or not runs_embedded(stage.environment):
            stages.append(stage)
            continue
        descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
        rewritten = [t for t in descriptor.transforms.values() if _into_global_window(t)]
        for transform in rewritten:
            transform.spec.urn = urns.INTO_GLOBAL_WINDOW
            lines.append(f"{transform.unique_name}: into the global window by sparkbeam's "
                         "operation (Beam's WindowInto DoFn left out)")
        stages.append(dataclasses.replace(stage, descriptor=descriptor.SerializeToString())
                      if rewritten else stage)
    return dataclasses.replace(plan, stages=tuple(stages)), tuple(lines)


def _into_global_window(transform: beam_runner_api_pb2.PTransform) -> bool:
    if transform.spec.urn != urns.ASSIGN_WINDOWS:
        return False
    # The payload as Beam's bundle processor reads it: a WindowingStrategy.
    strategy = beam_runner_api_pb2.WindowingStrategy.FromString(transform.spec.payload)
    return strategy.window_fn.urn == common_urns.global_windows.urn
