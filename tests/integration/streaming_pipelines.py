"""Streaming pipelines fed by TestStream, each ending in the records it should produce.

Each `build(p)` returns a PCollection of plain records: (key, values, window, timestamp, pane
timing, first, last, index), so panes and their timing are compared, not just values.
"""
from __future__ import annotations

from collections.abc import Callable

import apache_beam as beam
from apache_beam.testing.test_stream import TestStream
from apache_beam.coders import VarIntCoder
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.transforms import trigger, userstate, window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Timestamp


class Describe(beam.DoFn):
    """An element of a GroupByKey's output as a comparable record of its pane."""

    def process(self, kv, ts=beam.DoFn.TimestampParam, w=beam.DoFn.WindowParam,
                pane=beam.DoFn.PaneInfoParam):
        key, values = kv
        values = sorted(values)
        where = (
            "global" if isinstance(w, window.GlobalWindow) else f"[{float(w.start)},{float(w.end)})"
        )
        # The portable data plane carries timestamps in milliseconds (the DirectRunner keeps
        # microseconds): compare at millisecond precision.
        when = ts.micros // 1000 / 1000 if ts > Timestamp(-1e12) else "min"
        yield (key, values, where, when,
               int(pane.timing), pane.is_first, pane.is_last, pane.index)


def events(*script) -> TestStream:
    """('add', [(key, value, t)]) | ('wm', t) | ('pt', seconds); ends at +inf."""
    ts = TestStream()
    for kind, arg in script:
        if kind == "add":
            ts = ts.add_elements([window.TimestampedValue((k, v), t) for k, v, t in arg])
        elif kind == "wm":
            ts = ts.advance_watermark_to(arg)
        else:
            ts = ts.advance_processing_time(arg)
    return ts.advance_watermark_to_infinity()


def fixed_default(p):
    return (p | events(("add", [("a", 1, 1), ("b", 2, 2)]), ("wm", 10),
                        ("add", [("a", 3, 12)]), ("wm", 20), ("add", [("a", 4, 21)]))
            | beam.WindowInto(window.FixedWindows(5)) | beam.GroupByKey()
            | beam.ParDo(Describe()))


SPIKE_SCRIPT = (
    ("add", [("a", 1, 1), ("a", 2, 2)]), ("add", [("b", 5, 5)]), ("pt", 5),
    ("add", [("a", 3, 3), ("b", 6, 6), ("b", 7, 7), ("c", 9, 9)]), ("wm", 10),
    ("add", [("a", 4, 4), ("b", 8, 8)]), ("add", [("a", 12, 12), ("b", 15, 15), ("a", 13, 13)]),
    ("pt", 5), ("wm", 14), ("add", [("a", 11, 11), ("c", 14, 14), ("c", 16, 16), ("a", 0, 0)]),
    ("wm", 20), ("add", [("a", 8, 8), ("b", 25, 25)]), ("pt", 5), ("wm", 30),
    ("add", [("c", 31, 31)]),
)


def early_accumulating_late(p):
    """The design spike's script: early panes every 2 elements, on-time, late within 5 s,
    dropped after it."""
    return (p | events(*SPIKE_SCRIPT)
            | beam.WindowInto(window.FixedWindows(10),
                              trigger=trigger.AfterWatermark(early=trigger.AfterCount(2)),
                              accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
                              allowed_lateness=5)
            | beam.GroupByKey() | beam.ParDo(Describe()))


def processing_time_trigger(p):
    return (p | events(("add", [("a", 1, 1), ("a", 2, 2)]), ("pt", 3), ("add", [("a", 3, 3)]),
                        ("pt", 3), ("add", [("a", 4, 4)]), ("pt", 10))
            | beam.WindowInto(window.GlobalWindows(),
                              trigger=trigger.Repeatedly(trigger.AfterProcessingTime(5)),
                              accumulation_mode=trigger.AccumulationMode.DISCARDING)
            | beam.GroupByKey() | beam.ParDo(Describe()))


def sessions(p):
    return (p | events(("add", [("a", 1, 1), ("a", 2, 3)]), ("add", [("a", 3, 20)]),
                        ("wm", 10), ("add", [("a", 4, 6), ("b", 5, 30)]), ("wm", 40))
            | beam.WindowInto(window.Sessions(5)) | beam.GroupByKey()
            | beam.ParDo(Describe()))


def flatten_with_create_and_two_groupings(p):
    stream = p | events(("add", [("a", 1, 1), ("b", 2, 2)]), ("wm", 5),
                         ("add", [("a", 3, 7)]), ("wm", 12))
    created = p | beam.Create([("a", 10), ("c", 20)]) | beam.Map(
        lambda kv: window.TimestampedValue(kv, 3))
    sums = ((stream, created) | beam.Flatten() | beam.WindowInto(window.FixedWindows(10))
            | "Group" >> beam.GroupByKey() | beam.MapTuple(lambda k, vs: ("all", sum(vs))))
    return sums | "Regroup" >> beam.GroupByKey() | beam.ParDo(Describe())


def _with_sums(kv, sums):
    from apache_beam.metrics import Metrics

    Metrics.counter("stream", "with_sums").inc()
    return kv[0], [f"v{kv[1]}", *(f"{k}={n}" for k, n in sorted(sums.items()))]


def side_input_from_grouping(p):
    """Each element sees its window's per-key sums (a GroupByKey's panes) as a side input: it
    waits until the side input's watermark passes the window's end; a GroupByKey after it
    must not fire a window before the elements waiting for it arrive."""
    stream = (p | events(("add", [("a", 1, 1), ("b", 2, 2)]), ("wm", 5), ("add", [("a", 3, 7)]),
                         ("wm", 12), ("add", [("b", 4, 13)]), ("wm", 18), ("add", [("a", 5, 25)]))
              | beam.WindowInto(window.FixedWindows(10)))
    sums = stream | "Sums" >> beam.CombinePerKey(sum)
    return (stream
            | "WithSums" >> beam.Map(_with_sums, sums=beam.pvalue.AsDict(sums))
            | beam.MapTuple(lambda k, v: (k, ",".join(v))) | "Regroup" >> beam.GroupByKey()
            | beam.ParDo(Describe()))


class CountWithSums(beam.DoFn):
    """Per key and window: a running count in state, each element with its window's per-key
    sums (a side input: the element waits until they are complete). No timer: Beam's
    DirectRunner fails a timer bundle of a DoFn with windowed side inputs (it maps the window
    of a main input the bundle does not have)."""

    COUNT = userstate.ReadModifyWriteStateSpec("n", VarIntCoder())

    def process(self, kv, sums, w=beam.DoFn.WindowParam, count=beam.DoFn.StateParam(COUNT)):
        count.write((count.read() or 0) + 1)
        yield kv[0], f"[{float(w.start)},{float(w.end)})", count.read(), sums.get(kv[0])


def stateful_with_side_input(p):
    """A stateful DoFn reading its window's per-key sums as a side input: its elements wait
    in their key's state for the sums, then count."""
    stream = (p | events(("add", [("a", 1, 1), ("b", 2, 2)]), ("wm", 5),
                         ("add", [("a", 3, 7), ("a", 6, 8)]), ("wm", 12),
                         ("add", [("b", 4, 13)]), ("wm", 18), ("add", [("a", 5, 25)]))
              | beam.WindowInto(window.FixedWindows(10)))
    sums = stream | "Sums" >> beam.CombinePerKey(sum)
    return stream | "CountWithSums" >> beam.ParDo(CountWithSums(), beam.pvalue.AsDict(sums))


def _count_up_rows(kv, position, w, sums):
    return kv[0], f"[{float(w.start)},{float(w.end)})", position, sums.get(kv[0])


class CountUpWithSums(beam.DoFn, RestrictionProvider):
    """A splittable DoFn over positions 0..n-1 of each (key, n), each output with its window's
    per-key sums (a side input: a new element waits for them to be complete). It defers the
    rest of its restriction after each position, so every position after the first is a
    residual run in a later micro-batch, reading the side input again."""

    def initial_restriction(self, kv):
        return OffsetRange(0, kv[1])

    def create_tracker(self, restriction):
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, kv, restriction):
        return restriction.size()

    def process(self, kv, sums, w=beam.DoFn.WindowParam, tracker=beam.DoFn.RestrictionParam()):
        position = tracker.current_restriction().start
        if tracker.try_claim(position):
            yield _count_up_rows(kv, position, w, sums)
            tracker.defer_remainder()


class CountUpPlainWithSums(beam.DoFn):
    """What `CountUpWithSums` outputs, without splitting: Beam's DirectRunner cannot run a
    splittable DoFn reading side inputs (its SDF override takes the ParDo's inputs for one
    PCollection), so it runs this for the expected output."""

    def process(self, kv, sums, w=beam.DoFn.WindowParam):
        for position in range(kv[1]):
            yield _count_up_rows(kv, position, w, sums)


def _count_up_with_sums(p, dofn):
    stream = (p | events(("add", [("a", 2, 1), ("b", 1, 2)]), ("wm", 5),
                         ("add", [("a", 3, 7)]), ("wm", 12),
                         ("add", [("b", 2, 13)]), ("wm", 18), ("add", [("a", 1, 25)]))
              | beam.WindowInto(window.FixedWindows(10)))
    sums = stream | "Sums" >> beam.CombinePerKey(sum)
    return stream | "CountUp" >> beam.ParDo(dofn, beam.pvalue.AsDict(sums))


def splittable_with_side_input(p):
    return _count_up_with_sums(p, CountUpWithSums())


def plain_with_side_input(p):
    return _count_up_with_sums(p, CountUpPlainWithSums())


class BufferWithTimers(beam.DoFn):
    """Bag state, an event-time timer at the end of each element's 10 s window (last set
    wins) and a processing-time timer at processing time 7 s, once per key."""

    BUF = userstate.BagStateSpec("buf", VarIntCoder())
    FIRED = userstate.ReadModifyWriteStateSpec("fired", VarIntCoder())
    ET = userstate.TimerSpec("et", TimeDomain.WATERMARK)
    PT = userstate.TimerSpec("pt", TimeDomain.REAL_TIME)

    def process(self, kv, t=beam.DoFn.TimestampParam, buf=beam.DoFn.StateParam(BUF),
                fired=beam.DoFn.StateParam(FIRED), et=beam.DoFn.TimerParam(ET),
                pt=beam.DoFn.TimerParam(PT)):
        buf.add(kv[1])
        et.set(int(t) // 10 * 10 + 10)
        if not fired.read():
            pt.set(7)

    @userstate.on_timer(ET)
    def on_et(self, key=beam.DoFn.KeyParam, t=beam.DoFn.TimestampParam,
              buf=beam.DoFn.StateParam(BUF)):
        yield (key, "et", t.micros // 1000 / 1000, sorted(buf.read()))
        buf.clear()

    @userstate.on_timer(PT)
    def on_pt(self, key=beam.DoFn.KeyParam, buf=beam.DoFn.StateParam(BUF),
              fired=beam.DoFn.StateParam(FIRED)):
        fired.write(1)
        yield (key, "pt", sorted(buf.read()))


def stateful_timers(p):
    """The spike's stateful DoFn: bag state with an event-time and a processing-time timer."""
    return p | events(*SPIKE_SCRIPT) | beam.ParDo(BufferWithTimers())


class BufferUntilProcessingTime(beam.DoFn):
    """Sums each key's values in state until a processing-time timer set 10 s after its first
    element; the timer holds the output watermark at that element's timestamp (Beam's rule for
    processing-time timers), so the windows downstream wait for what it emits."""

    BUF = userstate.BagStateSpec("buf", VarIntCoder())
    SET = userstate.ReadModifyWriteStateSpec("set", VarIntCoder())
    PT = userstate.TimerSpec("pt", TimeDomain.REAL_TIME)

    def process(self, kv, buf=beam.DoFn.StateParam(BUF), armed=beam.DoFn.StateParam(SET),
                pt=beam.DoFn.TimerParam(PT)):
        buf.add(kv[1])
        if not armed.read():
            armed.write(1)
            pt.set(10)

    @userstate.on_timer(PT)
    def flush(self, key=beam.DoFn.KeyParam, buf=beam.DoFn.StateParam(BUF),
              armed=beam.DoFn.StateParam(SET)):
        yield key, sum(buf.read())
        buf.clear()
        armed.clear()


def processing_timer_hold(p):
    """A processing-time timer's hold keeps windows downstream open until it fires: the sums
    wait for processing time 10 while the watermark passes 25. The Python SDK emits a timer's
    output at its fire timestamp (10: window [10, 20)) and asks the runner to hold at the
    element's (1 and 3). Beam's legacy DirectRunner ignores that hold and drops both sums as
    late, so this pipeline is not in the DirectRunner catalogue below."""
    return (p | events(("add", [("a", 1, 1), ("b", 2, 3), ("a", 4, 4)]), ("wm", 25),
                       ("add", [("a", 8, 26)]), ("pt", 20), ("wm", 40))
            | beam.ParDo(BufferUntilProcessingTime())
            | beam.WindowInto(window.FixedWindows(10)) | beam.GroupByKey()
            | beam.ParDo(Describe()))


def earliest_then_finer_windows(p):
    """Panes timestamped at their earliest element (OUTPUT_AT_EARLIEST) regrouped in finer
    windows: the first GroupByKey holds the watermark of the second at its pending panes'
    earliest timestamps, so those panes are on time there though the watermark passed 5
    before they fired."""
    return (p | events(("add", [("a", 1, 1)]), ("add", [("b", 2, 3)]), ("wm", 7), ("wm", 12),
                       ("add", [("a", 4, 14)]), ("wm", 30))
            | "Tens" >> beam.WindowInto(
                window.FixedWindows(10),
                timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST)
            | "Group" >> beam.GroupByKey()
            | beam.MapTuple(lambda k, vs: (k, sum(vs)))
            | "Fives" >> beam.WindowInto(window.FixedWindows(5))
            | "Regroup" >> beam.GroupByKey()
            | beam.ParDo(Describe()))


STREAMING_PIPELINES: dict[str, Callable] = {
    "earliest_then_finer_windows": earliest_then_finer_windows,
    "stateful_timers": stateful_timers,
    "fixed_default": fixed_default,
    "early_accumulating_late": early_accumulating_late,
    "processing_time_trigger": processing_time_trigger,
    "sessions": sessions,
    "flatten_with_create_and_two_groupings": flatten_with_create_and_two_groupings,
    "side_input_from_grouping": side_input_from_grouping,
    "stateful_with_side_input": stateful_with_side_input,
}


class WriteLines(beam.DoFn):
    """Appends repr(element) to a file per worker process under `directory` (both runners)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def process(self, element):
        import os

        with open(os.path.join(self.directory, f"out-{os.getpid()}.txt"), "a") as f:
            f.write(repr(element) + "\n")


def read_lines(directory: str) -> list[str]:
    import os

    lines: list[str] = []
    for name in sorted(os.listdir(directory)):
        if name.startswith("out-"):
            with open(os.path.join(directory, name)) as f:
                lines.extend(line.rstrip("\n") for line in f)
    return sorted(lines)
