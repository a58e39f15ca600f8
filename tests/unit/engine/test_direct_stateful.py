"""The direct stateful path without Spark: a stateful stage's rows, run directly and by Beam's
bundle processor in-process, are the same rows (`engine/direct_stateful.py`), for generated keys
and timestamps down to the microsecond, in bundles of one key and of many; what the two paths
report as metrics matches too."""
from __future__ import annotations

import dataclasses
from collections import Counter

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.engine.context import pipeline_context
from sparkbeam.engine.task import METRICS_TAG, TaskSpec, run_stage_task
from sparkbeam.plan.batch import plan_batch
from tests.support.stateful_dofns import IN_PROCESS_DOFNS as DOFNS


def _stage(dofn: str):  # type: ignore[no-untyped-def]
    p = beam.Pipeline()
    _ = (p | beam.Create([("k", 1)]).with_output_types(tuple[str, int])
         | "Stateful" >> beam.ParDo(DOFNS[dofn]()) | "Out" >> beam.Map(str))
    plan = plan_batch(p.to_runner_api())
    stage = next(s for s in plan.stages if s.kind.stateful)
    assert stage.direct_stateful is not None
    return plan, stage


PLANS = {name: _stage(name) for name in DOFNS}


def _rows(plan, stage, events: list[tuple[str, int, int]]) -> list[tuple[int, bytes, bytes]]:  # type: ignore[no-untyped-def]
    coder = pipeline_context(plan.components).coders[stage.inputs[0].coder_id]
    impl, key = coder.get_impl(), coder.wrapped_value_coder.key_coder().get_impl()
    rows = [(0, key.encode_nested(k), impl.encode_nested(
        WindowedValue((k, v), Timestamp(micros=t), [GlobalWindow()]))) for k, v, t in events]
    return sorted(rows, key=lambda r: r[1])  # by key, each key's rows in arrival order


def _both(dofn: str, events: list[tuple[str, int, int]], bundle_size: int):  # type: ignore[no-untyped-def]
    plan, stage = PLANS[dofn]
    spec = TaskSpec(stage=stage, components=plan.components, groupings=dict(plan.groupings),
                    pickle_library="default", bundle_size=bundle_size, bundle_bytes=64 << 20)
    general = dataclasses.replace(spec, stage=dataclasses.replace(stage, direct_stateful=None))
    rows = _rows(plan, stage, events)

    def run(s: TaskSpec) -> tuple[Counter, dict]:  # type: ignore[type-arg]
        out = list(run_stage_task(s, iter(rows), {}))
        from apache_beam.portability.api import metrics_pb2

        counts = {}
        for tag, _, value in out:
            if tag == METRICS_TAG:
                info = metrics_pb2.MonitoringInfo.FromString(value)
                if info.urn == "beam:metric:element_count:v1":
                    counts[info.labels["PCOLLECTION"]] = info.payload
        return Counter((tag, key, bytes(value)) for tag, key, value in out
                       if tag != METRICS_TAG), counts

    return run(spec), run(general)


_EVENTS = st.lists(st.tuples(st.sampled_from(["a", "b", "é☃", ""]),
                             st.integers(0, 2**63 - 1),
                             st.integers(-(10**10), 10**12) | st.sampled_from([0, -1, 999, 1001])),
                   max_size=30)


@settings(max_examples=60, deadline=None)
@given(dofn=st.sampled_from(sorted(DOFNS)), events=_EVENTS, bundle_size=st.sampled_from([1, 1000]))
def test_direct_rows_are_the_bundle_processors(dofn: str, events: list[tuple[str, int, int]],
                                               bundle_size: int) -> None:
    (direct, direct_counts), (general, general_counts) = _both(dofn, events, bundle_size)
    assert direct == general
    assert bool(direct) == bool(events)
    # Element counts of the DoFn's input and output PCollections, as the bundle processor's.
    assert direct_counts == general_counts


def test_each_dofn_is_called_without_beams_per_element_invoker() -> None:
    # The byte-equality test above would pass through `DoFnRunner.process` too: the shortcut
    # that places the arguments once per key must really be the one taken.
    from sparkbeam.engine.direct_stateful import StatefulProgram

    for name, (plan, stage) in PLANS.items():
        assert StatefulProgram(stage, plan.components).process.usable, name
