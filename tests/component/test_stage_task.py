"""The task loop without Spark: a GroupByKey consumer stage fed sorted rows directly."""
from __future__ import annotations

import collections

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.transforms.window import GlobalWindows
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.engine import context as worker_context
from sparkbeam.engine.arrow import ArrowRows
from sparkbeam.engine.task import METRICS_TAG, TaskSpec, run_stage_task
from sparkbeam.plan.fuse import plan_pipeline

SEEN: list[tuple] = []


class Record(beam.DoFn):
    def start_bundle(self) -> None:
        self.n = 0

    def process(self, kv):  # type: ignore[no-untyped-def]
        self.n += 1
        SEEN.append(("group", kv[0], tuple(sorted(kv[1]))))

    def finish_bundle(self) -> None:
        SEEN.append(("bundle", self.n))


def _gbk_plan():  # type: ignore[no-untyped-def]
    p = beam.Pipeline()
    _ = (p | beam.Create([(1, 1)]).with_output_types(tuple[int, int])
         | beam.GroupByKey() | beam.ParDo(Record()))
    return plan_pipeline(p.to_runner_api())


PLAN = _gbk_plan()
STAGE = next(s for s in PLAN.stages if s.kind.keyed)


def _rows(data: list[tuple[int, int]]) -> list[tuple[int, bytes, bytes]]:
    grouping = PLAN.groupings[STAGE.inputs[0].buffer_id]
    ctx = worker_context.pipeline_context(PLAN.components)
    element = ctx.coders[grouping.input_coder_id].get_impl()
    key = ctx.coders[grouping.input_coder_id].wrapped_value_coder.key_coder().get_impl()
    rows = [(0, key.encode_nested(k),
             element.encode_nested(GlobalWindows.windowed_value((k, v)))) for k, v in data]
    return sorted(rows, key=lambda r: r[1])


@settings(max_examples=30, deadline=None)
@given(
    data=st.lists(st.tuples(st.integers(0, 6), st.integers(-5, 5)), max_size=40),
    bundle_size=st.integers(1, 5),
)
def test_groups_match_python_grouping_and_bundles_stay_bounded(data, bundle_size) -> None:  # type: ignore[no-untyped-def]
    SEEN.clear()
    spec = TaskSpec(stage=STAGE, components=PLAN.components, groupings=dict(PLAN.groupings),
                    pickle_library="default", bundle_size=bundle_size, bundle_bytes=1 << 20)
    out = list(run_stage_task(spec, _rows(data), {}))
    expected = collections.defaultdict(list)
    for k, v in data:
        expected[k].append(v)
    groups = sorted(x[1:] for x in SEEN if x[0] == "group")
    assert groups == sorted((k, tuple(sorted(vs))) for k, vs in expected.items())
    sizes = [x[1] for x in SEEN if x[0] == "bundle"]
    assert all(n <= bundle_size for n in sizes)
    assert sum(sizes) == len(expected)
    # The stage has no data outputs: only metric rows come back, and only if a bundle ran.
    assert all(tag == METRICS_TAG for tag, _, _ in out)
    assert bool(out) == bool(data)


def test_worker_cache_is_bounded_and_tears_down_what_it_evicts() -> None:
    from sparkbeam.control.embedded import WorkerCache

    torn_down: list[str] = []
    cache = WorkerCache(max_descriptors=2)
    plans = []
    for n in range(3):
        p = beam.Pipeline()
        _ = p | f"Create{n}" >> beam.Create([n]) | f"Map{n}" >> beam.Map(lambda x: x)
        plans.append(plan_pipeline(p.to_runner_api()).stages[0].descriptor)
    for descriptor in plans:
        with cache.lease(descriptor) as worker:
            original = worker.shutdown
            worker.shutdown = lambda d=worker.descriptor.id, f=original: (  # type: ignore[method-assign]
                torn_down.append(d), f())
    assert cache.created == 3
    assert len(torn_down) == 1  # the least recently used descriptor's worker
    with cache.lease(plans[2]):
        pass
    assert cache.created == 3  # still cached: no new set-up


@pytest.mark.parametrize("arrow", [False, True])
def test_a_producers_metric_rows_in_the_input_are_passed_on_once_after_the_tasks_own(
        arrow: bool) -> None:
    # An unpersisted producer's metric rows reach its keyed consumer through the shuffle as
    # input METRICS_TAG (`placement.shuffled_through`): the consumer's task groups the rest
    # as without them and hands them back, key and value as they came.
    SEEN.clear()
    data = [(1, 5), (2, 6), (1, 7)]
    rows = _rows(data)
    producer = [(METRICS_TAG, b'{"stage": "stage-000"}', b"info-%d" % n) for n in range(3)]
    mixed = rows[:1] + producer[:2] + rows[1:] + producer[2:]
    spec = TaskSpec(stage=STAGE, components=PLAN.components, groupings=dict(PLAN.groupings),
                    pickle_library="default", bundle_size=10, bundle_bytes=1 << 20,
                    forwards_metrics=True)
    if arrow:
        batch = pa.RecordBatch.from_arrays(
            [pa.array([r[0] for r in mixed], pa.int32()), pa.array([r[1] for r in mixed]),
             pa.array([r[2] for r in mixed])], names=["input", "key", "value"])
        out = list(run_stage_task(spec, ArrowRows(iter([batch])), {}))
    else:
        out = list(run_stage_task(spec, mixed, {}))
    assert sorted(x[1:] for x in SEEN if x[0] == "group") == [(1, (5, 7)), (2, (6,))]
    assert out[-3:] == producer
    assert all(row not in producer for row in out[:-3])
