"""Streaming GroupByKey of one key: Beam's trigger driver over a state blob, exact panes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.transforms import trigger, window
from apache_beam.transforms.core import Windowing
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue
import pytest
from sparkbeam.engine import context as worker_context
from sparkbeam.plan.fuse import plan_pipeline
from sparkbeam.plan.model import Grouping
from sparkbeam.streaming.gbk import (
    KeyGrouper,
    RunnerClock,
    dump_state,
    has_timers,
    load_state,
    pending_of,
    to_timestamp,
)
from sparkbeam.streaming.script import MAX_MICROS, MIN_MICROS, Pending, RunnerTime

S = 1_000_000  # micros per second
W0 = window.IntervalWindow(0, 10)
W0_END = 9_999_000  # W0's max timestamp as the windowed value coder keeps it (millis)
Pane = tuple[list[Any], Any, int, PaneInfo]  # values, window, timestamp micros, pane info
Batch = tuple[list[int], int, int]  # element timestamps (seconds; value == timestamp), wm0, wm


@dataclass
class Harness:
    """A KeyGrouper for key "a" of a planned `Create | WindowInto(FixedWindows(10)) | GBK`."""

    grouper: KeyGrouper
    components: bytes
    grouping: Grouping
    input_impl: Any
    output_impl: Any
    key: bytes

    def run(self, state: Any, seconds: list[int], wm0: int, wm: int, pt0: int = 0,
            pt: int = 0) -> list[Pane]:
        """One micro-batch: an element of value s at time s for each s of `seconds`."""
        data = [self.input_impl.encode_nested(element(("a", s), s)) for s in seconds]
        out = self.grouper.process(self.key, state, data, wm0, wm, pt0, pt)
        return [decode(self.output_impl.decode_nested(o)) for o in out]


def element(value: Any, seconds: int) -> WindowedValue:
    """As the GroupByKey receives it: already in its FixedWindows(10) window (WindowInto)."""
    start = seconds // 10 * 10
    return WindowedValue(value, Timestamp(seconds), [window.IntervalWindow(start, start + 10)])


def decode(wv: WindowedValue) -> Pane:
    key, values = wv.value
    assert key == "a"
    (win,) = wv.windows
    return (list(values), win, wv.timestamp.micros, wv.pane_info)


def harness(**windowing: Any) -> Harness:
    p = beam.Pipeline()
    windowed = p | beam.Create([("a", 1)]) | beam.WindowInto(window.FixedWindows(10), **windowing)
    _ = windowed | beam.GroupByKey()
    plan = plan_pipeline(p.to_runner_api(), streaming=True)
    (grouping,) = plan.groupings.values()
    coders = worker_context.pipeline_context(plan.components).coders
    pre = coders[grouping.input_coder_id]
    return Harness(
        grouper=KeyGrouper(grouping, plan.components),
        components=plan.components,
        grouping=grouping,
        input_impl=pre.get_impl(),
        output_impl=coders[grouping.output_coder_id].get_impl(),
        key=pre.key_coder().get_impl().encode_nested("a"),
    )


def pane(values: list[int], timing: PaneInfoTiming, index: int, nonspec: int) -> Pane:
    """A non-final pane of window [0, 10), output at its end (default timestamp combiner)."""
    return (values, W0, W0_END, PaneInfo(index == 0, False, timing, index, nonspec))


def test_time_helpers() -> None:
    assert to_timestamp(1_500_000) == Timestamp(1.5)
    assert to_timestamp(MAX_MICROS) == to_timestamp(MAX_MICROS + 1) == MAX_TIMESTAMP
    assert to_timestamp(MIN_MICROS) == to_timestamp(MIN_MICROS - 1) == MIN_TIMESTAMP
    clock = RunnerClock()
    assert clock.time() == 0.0
    clock.now = Timestamp(micros=2_500_000)
    assert clock.time() == 2.5


def test_default_trigger_fires_one_on_time_pane_at_window_end() -> None:
    h = harness()
    state = load_state(None)
    assert h.run(state, [1, 2], MIN_MICROS, 9 * S) == []
    assert has_timers(state)
    assert h.run(state, [], 9 * S, 10 * S - 1) == []  # still below the window's end
    assert h.run(state, [], 10 * S - 1, 10 * S) == [pane([1, 2], PaneInfoTiming.ON_TIME, 0, 0)]
    assert not has_timers(state)
    assert h.run(state, [], 10 * S, MAX_MICROS) == []  # fired once only


def test_elements_and_watermark_in_one_batch() -> None:
    """Elements arrive at the watermark before the batch, timers fire at the one after."""
    expected = [pane([1, 2], PaneInfoTiming.ON_TIME, 0, 0)]
    assert harness().run(load_state(None), [1, 2], MIN_MICROS, 10 * S) == expected


def test_state_survives_the_blob_between_micro_batches() -> None:
    h = harness()
    first = load_state(None)
    assert h.run(first, [1, 2], MIN_MICROS, 5 * S) == []
    blob = dump_state(first)
    assert isinstance(blob, bytes)
    restored = load_state(blob)
    assert has_timers(restored)
    other = Harness(**{**h.__dict__, "grouper": KeyGrouper(h.grouping, h.components)})
    expected = [pane([1, 2, 3], PaneInfoTiming.ON_TIME, 0, 0)]
    assert other.run(restored, [3], 5 * S, 10 * S) == expected


def test_late_data_within_allowed_lateness_then_dropped() -> None:
    h = harness(allowed_lateness=5)
    state = load_state(None)
    assert h.run(state, [1], MIN_MICROS, 10 * S) == [pane([1], PaneInfoTiming.ON_TIME, 0, 0)]
    # end (10) + lateness (5) = 15: at watermark 12 the window is still open, the pane is late
    assert h.run(state, [2], 12 * S, 13 * S) == [pane([2], PaneInfoTiming.LATE, 1, 1)]
    # at watermark 16 the window has expired: the element is dropped
    assert h.run(state, [3], 16 * S, 17 * S) == []
    assert h.run(state, [], 17 * S, MAX_MICROS) == []


def test_late_element_for_a_never_seen_window_is_dropped_and_keeps_no_state() -> None:
    h = harness(allowed_lateness=5)
    state = load_state(None)
    assert h.run(state, [4], 16 * S, 17 * S) == []
    assert dump_state(state) is None


EARLY_COUNT = dict(
    trigger=trigger.AfterWatermark(early=trigger.AfterCount(2), late=trigger.AfterCount(1)),
    accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
    allowed_lateness=5,
)
EARLY_BATCHES: list[Batch] = [
    ([1, 2, 3], MIN_MICROS, 5 * S),
    ([4], 5 * S, 9 * S),
    ([], 9 * S, 10 * S),
    ([5], 12 * S, 13 * S),
    ([6], 16 * S, 17 * S),
    ([], 17 * S, MAX_MICROS),
]


def reference_panes(windowing: Windowing, batches: list[Batch], output: Any) -> list[Pane]:
    """Beam's trigger driver run directly on decoded values, in the same event order (panes
    through the GroupByKey's `output` coder, as the runner emits them)."""
    driver = trigger.create_trigger_driver(windowing, is_batch=False)
    state = trigger.InMemoryUnmergedState()
    out: list[Pane] = []

    def emit(panes: Any) -> None:
        for p in panes:
            out.append(decode(output.decode_nested(output.encode_nested(
                p.with_value(("a", p.value))))))

    def fire(wm: Timestamp) -> None:
        while True:
            due, _ = state.get_timers(clear=True, watermark=wm, processing_time=Timestamp(0))
            if not due:
                return
            for win, (name, domain, ts, _tag) in due:
                emit(driver.process_timer(win, name, domain, ts, state, wm))

    for seconds, wm0, wm in batches:
        before = to_timestamp(wm0)
        fire(before)
        emit(driver.process_elements(state, [element(s, s) for s in seconds], before, before))
        fire(to_timestamp(wm))
    return out


def test_early_count_accumulating_matches_beams_driver() -> None:
    h = harness(**EARLY_COUNT)
    blob = None
    got: list[Pane] = []
    for seconds, wm0, wm in EARLY_BATCHES:  # each batch from the previous batch's blob
        state = load_state(blob)
        got += h.run(state, seconds, wm0, wm)
        blob = dump_state(state)
    c = EARLY_COUNT
    windowing = Windowing(window.FixedWindows(10), triggerfn=c["trigger"],
                          accumulation_mode=c["accumulation_mode"],
                          allowed_lateness=c["allowed_lateness"])
    expected = reference_panes(windowing, EARLY_BATCHES, h.output_impl)
    assert got == expected
    assert got == [
        pane([1, 2, 3], PaneInfoTiming.EARLY, 0, -1),
        pane([1, 2, 3, 4], PaneInfoTiming.ON_TIME, 1, 0),
        pane([1, 2, 3, 4, 5], PaneInfoTiming.LATE, 2, 1),
    ]


def test_processing_time_trigger_fires_at_the_batch_processing_time() -> None:
    h = harness(
        trigger=trigger.Repeatedly(trigger.AfterProcessingTime(5)),
        accumulation_mode=trigger.AccumulationMode.DISCARDING,
    )
    state = load_state(None)
    assert h.run(state, [1], MIN_MICROS, MIN_MICROS, 0, 0) == []
    assert has_timers(state)
    state = load_state(dump_state(state))
    assert h.run(state, [], MIN_MICROS, MIN_MICROS, 0, 4 * S) == []
    assert h.run(state, [2], MIN_MICROS, MIN_MICROS, 4 * S, 5 * S) == [
        pane([1, 2], PaneInfoTiming.EARLY, 0, -1)
    ]
    assert not has_timers(state)
    # the next element re-arms the trigger from the batch's processing time before (5s);
    # its pane's timing is test_processing_time_pane_before_the_window_end_is_early's matter
    assert h.run(state, [3], MIN_MICROS, MIN_MICROS, 5 * S, 9 * S) == []
    ((values, win, ts, info),) = h.run(state, [], MIN_MICROS, MIN_MICROS, 9 * S, 10 * S)
    assert (values, win, ts, info.is_first, info.is_last, info.index) == (
        [3], W0, W0_END, False, False, 1)


@pytest.mark.xfail(strict=True, reason="Beam's driver times processing-time panes against the "
                   "timer's processing time instead of the watermark: LATE, not EARLY")
def test_processing_time_pane_before_the_window_end_is_early() -> None:
    """With a wall clock, a processing-time pane while the watermark is below the window's end
    is EARLY (Beam's model: timing compares the watermark with the window)."""
    h = harness(
        trigger=trigger.Repeatedly(trigger.AfterProcessingTime(5)),
        accumulation_mode=trigger.AccumulationMode.DISCARDING,
    )
    now = 1_700_000_000 * S
    state = load_state(None)
    assert h.run(state, [1], MIN_MICROS, 2 * S, now, now) == []
    assert h.run(state, [], 2 * S, 3 * S, now, now + 5 * S) == [
        pane([1], PaneInfoTiming.EARLY, 0, -1)
    ]


def test_dump_state_is_none_when_empty_and_has_timers_tracks_timers() -> None:
    empty = load_state(None)
    assert dump_state(empty) is None
    assert not has_timers(empty)
    assert dump_state(load_state(b"")) is None
    h = harness()
    state = load_state(None)
    assert h.run(state, [], MIN_MICROS, 10 * S) == []
    assert dump_state(state) is None
    h.run(state, [3], MIN_MICROS, 5 * S)
    assert has_timers(state) and has_timers(load_state(dump_state(state)))


def test_state_of_expired_windows_is_cleared() -> None:
    """Once the watermark passes a window's end plus the allowed lateness nothing more can be
    emitted for it, so a key with no live window should hold no state."""
    h = harness(**EARLY_COUNT)
    state = load_state(None)
    for seconds, wm0, wm in EARLY_BATCHES:
        h.run(state, seconds, wm0, wm)
    assert dump_state(state) is None


def test_earliest_hold_is_the_trigger_drivers_watermark_hold() -> None:
    from apache_beam.transforms import trigger
    from apache_beam.transforms.window import IntervalWindow
    from apache_beam.utils.timestamp import Timestamp

    from sparkbeam.streaming.gbk import earliest_hold
    from sparkbeam.streaming.script import MAX_MICROS

    state = trigger.InMemoryUnmergedState()
    assert earliest_hold(state) == MAX_MICROS
    tag = trigger._WatermarkHoldStateTag("watermark", trigger.TimestampCombiner.OUTPUT_AT_EARLIEST)
    state.add_state(IntervalWindow(0, 10), tag, Timestamp(3))
    state.add_state(IntervalWindow(10, 20), tag, Timestamp(12))
    assert earliest_hold(state) == 3_000_000 - 1  # Beam's hold is one granule before


def runner_time(wm0: int, wm: int, pt0: int = 0, pt: int = 0) -> RunnerTime:
    return RunnerTime(watermark_before=wm0, watermark=wm, processing_before=pt0, processing=pt)


def test_pending_names_the_earliest_timer_and_a_key_not_due_is_untouched_by_its_batch() -> None:
    """A woken key whose timers are not due is passed over without its blob: running it would
    emit nothing and change nothing."""
    h = harness()
    state = load_state(None)
    assert pending_of(state) is None
    h.run(state, [1, 2], MIN_MICROS, 5 * S)
    pending = pending_of(state)
    assert pending == Pending(event=10 * S)  # the end-of-window timer, no hold asked for
    blob = dump_state(state)
    for wm in (5 * S, 10 * S - 1):
        assert not pending.due(runner_time(5 * S, wm))
        assert h.run(state, [], 5 * S, wm) == []
        assert dump_state(state) == blob
    assert pending.due(runner_time(5 * S, 10 * S))
    assert h.run(state, [], 5 * S, 10 * S) == [pane([1, 2], PaneInfoTiming.ON_TIME, 0, 0)]
    assert pending_of(state) is None


def test_pending_processing_time_timer_is_due_at_its_processing_time() -> None:
    h = harness(
        trigger=trigger.Repeatedly(trigger.AfterProcessingTime(5)),
        accumulation_mode=trigger.AccumulationMode.DISCARDING,
    )
    state = load_state(None)
    h.run(state, [1], MIN_MICROS, MIN_MICROS, 0, 0)
    pending = pending_of(state)
    assert pending is not None and pending.processing == 5 * S
    assert not pending.due(runner_time(MIN_MICROS, MIN_MICROS, 0, 4 * S))
    assert pending.due(runner_time(MIN_MICROS, MIN_MICROS, 4 * S, 5 * S))
    assert pending.due(runner_time(MIN_MICROS, MAX_MICROS))  # the final watermark: all of it


def test_pending_keeps_a_hold_without_timers() -> None:
    assert pending_of(load_state(None), hold=7) == Pending(hold=7)


def test_combining_tags_make_their_non_extracting_twin_once() -> None:
    """Beam's MergeableStateAdapter asks for a combining tag's twin on every state access; once
    memoized, the same tag name and CombineFn give the same twin (a prefixed copy too), and the
    twin still accumulates without extracting."""
    from sparkbeam.streaming.gbk import memoize_without_extraction

    memoize_without_extraction()
    tag = trigger.AfterCount.COUNT_TAG
    twin = tag.without_extraction()
    assert tag.without_extraction() is twin
    assert tag.with_prefix("p-").without_extraction() is tag.with_prefix("p-").without_extraction()
    assert tag.with_prefix("p-").without_extraction() is not twin
    fn = twin.combine_fn
    assert fn.extract_output(fn.add_input(fn.create_accumulator(), 1)) == 1
    other = trigger._CombiningValueStateTag("count", sum)  # same name, another CombineFn
    assert other.without_extraction() is not twin
