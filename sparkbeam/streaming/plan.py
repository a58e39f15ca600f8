"""A batch Plan seen as a streaming job: roots become endpoints, buffers get numbers (driver).

Every DataFrame of the streaming query has the rows (tag, key, value) where `tag` is the number
of the buffer the row belongs to; the roots (TestStream transforms and Impulses) are read by one
source whose rows are already tagged, and every other stage reads the tags of its inputs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners.common import ENCODED_IMPULSE_VALUE
from apache_beam.runners.portability.fn_api_runner import translations
from apache_beam.testing.test_stream import (
    ElementEvent,
    Event,
    ProcessingTimeEvent,
    WatermarkEvent,
    WindowedValueHolder,
)
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from sparkbeam import urns
from sparkbeam.engine.context import pipeline_context
from sparkbeam.engine.watermarks import upstream_holds
from sparkbeam.plan.model import IMPULSE_BUFFER, Plan, Stage, StageKind
from sparkbeam.streaming.sides import (
    StreamingSide,
    is_discarding,
    is_triggered,
    side_lateness,
)
from sparkbeam.streaming.script import MAX_MICROS, MIN_MICROS, Endpoint, Item, Script

IMPULSE_TAG = 0
IMPULSE_ENDPOINT = "impulse"


@dataclass(frozen=True)
class StreamingPlan:
    plan: Plan
    script: Script
    tags: dict[bytes, int]  # buffer id -> tag of its rows
    stages: tuple[Stage, ...]  # the stages run per micro-batch (roots excluded)
    sides: dict[str, tuple[StreamingSide, ...]] = dataclasses.field(default_factory=dict)
    # buffer id -> side-input stages upstream of it (their holds bound its watermark)
    holds: dict[bytes, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    steps: dict[str, str] = dataclasses.field(default_factory=dict)  # endpoint -> its transform

    def tag(self, buffer_id: bytes) -> int:
        return self.tags[buffer_id]

    @property
    def side_tags(self) -> set[int]:
        """Tags of the buffers read as side inputs (written per batch, `sides.py`)."""
        return {s.tag for uses in self.sides.values() for s in uses}

    def holds_of(self, buffer_ids: list[bytes]) -> tuple[str, ...]:
        return tuple(sorted({label for b in buffer_ids for label in self.holds.get(b, ())}))

    @property
    def holding(self) -> tuple[str, ...]:
        """Labels of the stages that keep work across micro-batches (`watermarks.holds_back`)."""
        return tuple(sorted({label for labels in self.holds.values() for label in labels}))

    @property
    def extra_batches(self) -> int:
        """Batches run after the one that reached the final watermark with nothing held: one,
        and two more per holding stage (it releases what waited for the end, its consumers fire
        the batch after)."""
        return 1 + 2 * len(self.holding)


def _test_streams(plan: Plan) -> dict[str, beam_runner_api_pb2.PTransform]:
    """TestStream transforms by unique name (fusion turns each into a stage's data input)."""
    comps = beam_runner_api_pb2.Components.FromString(plan.components)
    return {t.unique_name: t for t in comps.transforms.values() if t.spec.urn == urns.TEST_STREAM}


def test_stream_of(stage: Stage, test_streams: dict[str, beam_runner_api_pb2.PTransform]
                   ) -> beam_runner_api_pb2.PTransform | None:
    for inp in stage.inputs:
        if inp.buffer_id == IMPULSE_BUFFER and inp.transform_id in test_streams:
            return test_streams[inp.transform_id]
    return None


def streaming_plan(plan: Plan) -> StreamingPlan:
    """The plan as one streaming query sees it (Prepare has checked it: `plan.check`)."""
    tags: dict[bytes, int] = {IMPULSE_BUFFER: IMPULSE_TAG}
    for stage in plan.stages:
        for buffer_id in [i.buffer_id for i in stage.inputs] + [o.buffer_id for o in stage.outputs]:
            tags.setdefault(buffer_id, len(tags))
    endpoints = []
    stages = []
    steps = {}
    test_streams = _test_streams(plan)
    for stage in plan.stages:
        transform = test_stream_of(stage, test_streams)
        if transform is not None:
            endpoints.append(_test_stream_endpoint(plan, stage, transform, tags))
            steps[endpoints[-1].name] = transform.unique_name
        else:
            stages.append(stage)
    if any(i.buffer_id == IMPULSE_BUFFER for s in stages for i in s.inputs):
        impulse = Item(rows=((IMPULSE_TAG, None, ENCODED_IMPULSE_VALUE),))
        endpoints.append(Endpoint(IMPULSE_ENDPOINT, (impulse,)))
    # Splittable reads (e.g. PeriodicImpulse) and Spark's streams follow the wall clock;
    # TestStreams their own.
    script = Script(tuple(endpoints),
                    test_clock=not any(s.kind is StageKind.SPLITTABLE for s in stages)
                    and not plan.spark_reads)
    comps = beam_runner_api_pb2.Components.FromString(plan.components)
    holding_groupings = {
        buffer_id: grouping_hold_label(tags[buffer_id])
        for buffer_id, grouping in plan.groupings.items()
        if comps.windowing_strategies[grouping.windowing_strategy_id].output_time
        in _HOLDING_OUTPUT_TIMES
    }
    holds = upstream_holds(stages, holding_groupings)
    sides = {stage.label: _sides_of(stage, comps, tags, holds)
             for stage in stages if stage.side_inputs}
    return StreamingPlan(_without_events(plan), script, tags, tuple(stages), sides, holds, steps)


def _sides_of(stage: Stage, comps: beam_runner_api_pb2.Components, tags: dict[bytes, int],
              holds: dict[bytes, tuple[str, ...]]) -> tuple[StreamingSide, ...]:
    main_holds = tuple(sorted({h for i in stage.inputs for h in holds.get(i.buffer_id, ())}))
    out = []
    # A splittable DoFn's residuals read the side windows of their elements for as long as
    # they run, past any watermark: its side inputs are kept whole (no reader bound).
    unbounded = stage.kind is StageKind.SPLITTABLE
    for use in stage.side_inputs:
        pcoll = translations.split_buffer_id(use.buffer_id)[1]
        triggered = is_triggered(comps, pcoll)
        out.append(StreamingSide(use, tags[use.buffer_id], holds.get(use.buffer_id, ()),
                                 triggered, triggered and is_discarding(comps, pcoll),
                                 None if unbounded else side_lateness(stage, use), main_holds,
                                 stage.label))
    return tuple(out)


# A GroupByKey whose panes are timestamped before their window's end holds the watermark of
# what is downstream at its earliest pending output time (Beam's trigger driver keeps that hold);
# END_OF_WINDOW panes need none (they carry the end of a window the watermark has just passed).
_HOLDING_OUTPUT_TIMES = (beam_runner_api_pb2.OutputTime.EARLIEST_IN_PANE,
                         beam_runner_api_pb2.OutputTime.LATEST_IN_PANE)


def grouping_hold_label(tag: int) -> str:
    """The hold label of the GroupByKey that groups buffer `tag` (a path segment)."""
    return f"gbk-{tag:03d}"


def _without_events(plan: Plan) -> Plan:
    """The plan with its TestStreams' events dropped from the components: they now live in the
    script, and the components travel with every task and keyed operator (a large payload
    there makes Spark broadcast the operator, which transformWithState cannot load)."""
    comps = beam_runner_api_pb2.Components.FromString(plan.components)
    for transform in comps.transforms.values():
        if transform.spec.urn == urns.TEST_STREAM:
            payload = beam_runner_api_pb2.TestStreamPayload.FromString(transform.spec.payload)
            del payload.events[:]
            transform.spec.payload = payload.SerializeToString()
    return dataclasses.replace(plan, components=comps.SerializeToString())


def _test_stream_endpoint(plan: Plan, stage: Stage, transform: beam_runner_api_pb2.PTransform,
                          tags: dict[bytes, int]) -> Endpoint:
    """A TestStream's events as items: elements encoded for the stage's outputs."""
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
    ctx = pipeline_context(plan.components)
    payload = beam_runner_api_pb2.TestStreamPayload.FromString(transform.spec.payload)
    element_coder = ctx.coders[payload.coder_id]
    by_pcoll = {}
    for output in stage.outputs:
        pcoll = next(iter(descriptor.transforms[output.transform_id].inputs.values()))
        by_pcoll[pcoll] = output
    outputs_by_tag = {}
    for tag_name, pcoll in transform.outputs.items():
        if pcoll in by_pcoll:
            outputs_by_tag[None if tag_name == "None" else tag_name] = by_pcoll[pcoll]
    watermarks: dict[object, int] = {tag: MIN_MICROS for tag in outputs_by_tag}
    items = []
    if payload.endpoint.url:
        from apache_beam.runners.direct.test_stream_impl import _TestStream

        # As Beam's DirectRunner reads a TestStreamService (its timestamps included).
        beam_events = [
            _TestStream.test_stream_payload_to_events(e, element_coder)
            for e in _events_from_service(payload.endpoint.url, list(transform.outputs))
        ]
    else:
        beam_events = [Event.from_runner_api(e, element_coder) for e in payload.events]
    for event in beam_events:
        if isinstance(event, ElementEvent):
            target = outputs_by_tag.get(_tag(event.tag))
            rows = []
            if target is not None:
                impl = ctx.coders[target.coder_id].get_impl()
                key_impl = (
                    ctx.coders[target.key_coder_id].get_impl() if target.key_coder_id else None
                )
                for tv in event.timestamped_values:
                    if isinstance(tv.value, WindowedValueHolder):
                        wv = tv.value.windowed_value  # type: ignore[attr-defined]  # test-given
                    else:
                        wv = WindowedValue(tv.value, Timestamp.of(tv.timestamp),
                                           (GlobalWindow(),))
                    key = key_impl.encode_nested(wv.value[0]) if key_impl is not None else None
                    rows.append((tags[target.buffer_id], key, impl.encode_nested(wv)))
            items.append(Item(rows=tuple(rows)))
        elif isinstance(event, WatermarkEvent):
            micros = min(event.new_watermark.micros, MAX_MICROS)
            tag = _tag(event.tag)
            watermarks[tag] = max(watermarks.get(tag, micros), micros)
            items.append(Item(watermark=min(watermarks.values())))
        elif isinstance(event, ProcessingTimeEvent):
            items.append(Item(advance=int(event.advance_by.micros)))
    return Endpoint(f"teststream:{stage.label}", tuple(items))


def _tag(tag: Any) -> Any:
    """The main output's tag: None in Python events, '' or 'None' in protos."""
    return None if tag in (None, "", "None") else tag


def _events_from_service(url: str, output_tags: list[str]) -> list[Any]:
    """A TestStream's events read from its TestStreamService (read once, when the job is
    planned, so the script stays deterministic)."""
    import grpc
    from apache_beam.portability.api import beam_interactive_api_pb2, beam_interactive_api_pb2_grpc

    with grpc.insecure_channel(url) as channel:
        stub = beam_interactive_api_pb2_grpc.TestStreamServiceStub(channel)
        request = beam_interactive_api_pb2.EventsRequest(output_ids=output_tags)
        return list(stub.Events(request, timeout=60))
