"""Side inputs of streaming jobs: lags, per-batch files, readiness by window (no Spark)."""
from __future__ import annotations

import dataclasses

import apache_beam as beam
from apache_beam import coders, pvalue
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners import pipeline_context
from apache_beam.transforms import trigger, window
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from sparkbeam.plan.model import SideInputUse, Stage, StageInput, StageOutput
from sparkbeam.streaming.script import MAX_MICROS, MIN_MICROS
from sparkbeam.engine.watermarks import upstream_holds, watermark_at_start
from sparkbeam.streaming.checkpoint import (
    CheckpointLayout,
    FileHoldStore,
    SideStore,
    write_hold,
    write_side_file,
)
from sparkbeam.streaming.sides import SideReadiness, StreamingSide, is_triggered


def _stage(n: int, inputs: list[bytes], outputs: list[bytes], sides: list[bytes] = ()) -> Stage:
    return Stage(
        index=n, name=f"s{n}", label=f"stage-{n:03d}", description="", transforms=(),
        descriptor=b"",
        inputs=tuple(StageInput(f"in{n}{b!r}", b, "c") for b in inputs),
        outputs=tuple(StageOutput(f"out{n}{b!r}", b, "c") for b in outputs),
        side_inputs=tuple(SideInputUse(f"t{n}", "side0", b, b"", "c") for b in sides),
    )


def test_holds_name_the_side_input_stages_upstream_of_each_buffer() -> None:
    stages = [
        _stage(1, [b"root"], [b"a"]),
        _stage(2, [b"root"], [b"b"], sides=[b"a"]),  # pushes back: holds b
        _stage(3, [b"b"], [b"c"], sides=[b"a"]),  # and c, with stage 2 upstream
        _stage(4, [b"a"], [b"d"], sides=[b"c"]),  # its side input is downstream of 2 and 3
    ]
    assert upstream_holds(stages) == {
        b"a": (), b"b": ("stage-002",), b"c": ("stage-002", "stage-003"),
        b"d": ("stage-002", "stage-003", "stage-004"),
    }


def test_a_holding_grouping_holds_what_reads_its_output_not_itself() -> None:
    stages = [
        _stage(1, [b"root"], [b"a"]),
        _stage(2, [b"a"], [b"b"]),  # reads the holding GroupByKey's output (grouping of a)
        _stage(3, [b"b"], [b"c"]),
    ]
    holds = upstream_holds(stages, {b"a": "gbk-001"})
    assert holds == {b"a": (), b"b": ("gbk-001",), b"c": ("gbk-001",)}


def test_hold_is_the_earliest_waiting_timestamp_of_the_batch_before(tmp_path) -> None:  # type: ignore[no-untyped-def]
    layout = CheckpointLayout(str(tmp_path))
    write_hold(layout.hold_dir("stage-002"), 3, 0, 70)
    write_hold(layout.hold_dir("stage-002"), 3, 1, 50)
    write_hold(layout.hold_dir("stage-003"), 3, 0, 60)
    write_hold(layout.hold_dir("stage-002"), 4, 1, 10)
    write_hold(layout.hold_dir("stage-002"), 4, 1, MAX_MICROS)  # retried: none left
    store = FileHoldStore(layout)
    assert store.hold(["stage-002"], 3) == 50
    assert store.hold(["stage-003"], 3) == 60
    assert store.hold(["stage-002"], 4) == MAX_MICROS
    assert watermark_at_start(55, ("stage-002", "stage-003"), store, 4) == 50
    assert watermark_at_start(40, ("stage-002",), store, 4) == 40
    assert watermark_at_start(99, (), store, 4) == 99
    assert watermark_at_start(99, ("stage-002",), store, 0) == 99  # no batch before the first


def test_store_reads_only_earlier_batches_in_order(tmp_path) -> None:  # type: ignore[no-untyped-def]
    directory = CheckpointLayout(str(tmp_path)).side_dir(7)
    write_side_file(directory, 0, 1, [b"b"])
    write_side_file(directory, 0, 0, [b"a", b""])
    write_side_file(directory, 2, 0, [b"c" * 300])
    store = SideStore(CheckpointLayout(str(tmp_path)))
    assert store.elements(7, 0) == []
    assert store.elements(7, 1) == [b"a", b"", b"b"]
    assert store.elements(7, 3) == [b"a", b"", b"b", b"c" * 300]
    assert store.elements(8, 3) == []  # a buffer nothing was written to yet


def test_rewritten_attempt_replaces_and_empty_attempt_removes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    directory = CheckpointLayout(str(tmp_path)).side_dir(1)
    write_side_file(directory, 4, 0, [b"first"])
    write_side_file(directory, 4, 0, [b"second"])
    write_side_file(directory, 4, 1, [b"x"])
    write_side_file(directory, 4, 1, [])
    assert SideStore(CheckpointLayout(str(tmp_path))).elements(1, 5) == [b"second"]


def _readiness(side: pvalue.AsSideInput, triggered: bool = False
               ) -> tuple[SideReadiness, coders.Coder]:
    p = beam.Pipeline()
    main = p | "main" >> beam.Create([1])
    main | "Read" >> beam.Map(lambda x, s: x, side)  # noqa: B023
    proto = p.to_runner_api()
    transform_id, tag = next(
        (tid, tag) for tid, t in proto.components.transforms.items()
        if t.spec.urn == "beam:transform:pardo:v1"
        for tag in beam_runner_api_pb2.ParDoPayload.FromString(
            t.spec.payload).side_inputs
    )
    use = SideInputUse(transform_id, tag, b"side", b"", "c")
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor(
        transforms={transform_id: proto.components.transforms[transform_id]})
    stage = dataclasses.replace(_stage(1, [], []), descriptor=descriptor.SerializeToString(),
                                side_inputs=(use,))
    coder = coders.WindowedValueCoder(coders.VarIntCoder(), coders.coders.IntervalWindowCoder())
    readiness = SideReadiness(stage, (StreamingSide(use, 3, triggered=triggered),),
                              {0: coder.get_impl()})
    return readiness, coder


def _element(coder: coders.Coder, start: int, end: int) -> tuple[int, bytes]:
    wv = WindowedValue(1, Timestamp(start), (window.IntervalWindow(start, end),))
    return 0, coder.get_impl().encode_nested(wv)


def test_windowed_side_is_ready_once_its_watermark_passes_the_mapped_window() -> None:
    p = beam.Pipeline()
    side = beam.pvalue.AsList(
        p | "side" >> beam.Create([1]) | beam.WindowInto(window.FixedWindows(3)))
    readiness, coder = _readiness(side)
    early, late = _element(coder, 9, 10), _element(coder, 18, 19)  # map to [9,12) and [18,21)
    assert readiness.split([early, late], lambda side: 11_000_000) == (
        [], [early, late], 9_000_000)
    assert readiness.split([early, late], lambda side: 12_000_000) == ([early], [late], 18_000_000)
    assert readiness.split([late], lambda side: 21_000_000) == ([late], [], MAX_MICROS)


def test_global_side_waits_for_the_final_watermark() -> None:
    p = beam.Pipeline()
    side = beam.pvalue.AsList(p | "side" >> beam.Create([1]))
    readiness, coder = _readiness(side)
    element = _element(coder, 0, 1)
    assert readiness.split([element], lambda side: MIN_MICROS) == ([], [element], 0)
    assert readiness.split([element], lambda side: 10**15) == ([], [element], 0)
    assert readiness.split([element], lambda side: MAX_MICROS) == ([element], [], MAX_MICROS)


def test_triggered_side_is_ready_at_its_first_pane_for_the_window() -> None:
    """A side input that updates (global window, repeated trigger) does not wait for the end of
    the global window: the main input runs as soon as the side input has data."""
    p = beam.Pipeline()
    side = beam.pvalue.AsList(p | "side" >> beam.Create([1]))
    readiness, coder = _readiness(side, triggered=True)
    element = _element(coder, 0, 1)
    assert readiness.split([element], lambda side: MIN_MICROS, lambda side: set()) == (
        [], [element], 0)
    assert readiness.split([element], lambda side: MIN_MICROS,
                           lambda side: {window.GlobalWindow()}) == ([element], [], MAX_MICROS)
    untriggered, _ = _readiness(side)
    assert untriggered.split([element], lambda side: MIN_MICROS,
                             lambda side: {window.GlobalWindow()}) == ([], [element], 0)


def test_side_windowing_with_its_own_trigger_is_triggered() -> None:
    p = beam.Pipeline()
    plain = p | "plain" >> beam.Create([1])
    updating = plain | beam.WindowInto(
        window.GlobalWindows(), trigger=trigger.Repeatedly(trigger.AfterCount(1)),
        accumulation_mode=trigger.AccumulationMode.DISCARDING)
    context = pipeline_context.PipelineContext()
    proto = p.to_runner_api(context=context)
    assert not is_triggered(proto.components, context.pcollections.get_id(plain))
    assert is_triggered(proto.components, context.pcollections.get_id(updating))
