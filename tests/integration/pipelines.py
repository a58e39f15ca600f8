"""A catalogue of batch pipelines covering every primitive, run on FnApiRunner and on Spark.

Each entry builds its transforms on a pipeline and returns the PCollection whose elements are
compared across runners (formatted with repr, sorted).
"""
from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable

import apache_beam as beam
from apache_beam import window
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.transforms import trigger, userstate
from apache_beam.transforms.combiners import CountCombineFn
from apache_beam.utils.timestamp import Duration, Timestamp

Build = Callable[[beam.Pipeline], beam.PCollection]
PIPELINES: dict[str, Build] = {}


def pipeline(fn: Build) -> Build:
    PIPELINES[fn.__name__] = fn
    return fn


def _kv_data(n: int = 200, keys: int = 7) -> list[tuple[str, int]]:
    return [(f"k{i % keys}", i) for i in range(n)]


class Lifecycle(beam.DoFn):
    """Tags each element with the lifecycle calls seen before it."""

    def setup(self) -> None:
        self.set_up = True

    def start_bundle(self) -> None:
        self.started = True

    def process(self, x):  # type: ignore[no-untyped-def]
        yield (x, self.set_up, self.started)

    def finish_bundle(self):  # type: ignore[no-untyped-def]
        self.started = False


@pipeline
def pardo_lifecycle(p):  # type: ignore[no-untyped-def]
    return p | beam.Create(range(50)) | beam.ParDo(Lifecycle())


@pipeline
def pardo_multiple_outputs(p):  # type: ignore[no-untyped-def]
    def split(x):  # type: ignore[no-untyped-def]
        yield beam.pvalue.TaggedOutput("even" if x % 2 == 0 else "odd", x)
        yield x * 10

    outs = p | beam.Create(range(30)) | beam.FlatMap(split).with_outputs("even", "odd", main="m")
    return (
        (outs.m | "m" >> beam.Map(lambda x: ("main", x)),
         outs.even | "e" >> beam.Map(lambda x: ("even", x)),
         outs.odd | "o" >> beam.Map(lambda x: ("odd", x)))
        | beam.Flatten()
    )


@pipeline
def group_by_key(p):  # type: ignore[no-untyped-def]
    return (
        p | beam.Create(_kv_data()) | beam.GroupByKey()
        | beam.MapTuple(lambda k, vs: (k, sorted(vs)))
    )


@pipeline
def co_group_by_key(p):  # type: ignore[no-untyped-def]
    left = p | "l" >> beam.Create([("a", 1), ("b", 2), ("a", 3)])
    right = p | "r" >> beam.Create([("a", "x"), ("c", "y")])
    return (
        {"left": left, "right": right} | beam.CoGroupByKey()
        | beam.MapTuple(lambda k, d: (k, sorted(d["left"]), sorted(d["right"])))
    )


@pipeline
def combine_per_key(p):  # type: ignore[no-untyped-def]
    return p | beam.Create(_kv_data(1000)) | beam.CombinePerKey(sum)


@pipeline
def combine_globally_mean(p):  # type: ignore[no-untyped-def]
    return p | beam.Create(range(1000)) | beam.combiners.Mean.Globally()


@pipeline
def combine_globally_empty(p):  # type: ignore[no-untyped-def]
    return p | beam.Create([]) | beam.CombineGlobally(sum)


@pipeline
def combine_with_count_fn(p):  # type: ignore[no-untyped-def]
    return p | beam.Create(_kv_data(300)) | beam.CombinePerKey(CountCombineFn())


@pipeline
def flatten_with_itself(p):  # type: ignore[no-untyped-def]
    pc = p | beam.Create([1, 2, 3])
    other = p | "o" >> beam.Create([4])
    return (pc, pc, other) | beam.Flatten()


@pipeline
def reshuffle(p):  # type: ignore[no-untyped-def]
    return p | beam.Create(range(100)) | beam.Reshuffle() | beam.Map(lambda x: x + 1)


@pipeline
def side_inputs_all_kinds(p):  # type: ignore[no-untyped-def]
    main = p | "main" >> beam.Create([1, 2, 3])
    single = p | "single" >> beam.Create([10])
    many = p | "many" >> beam.Create([1, 2, 2])
    pairs = p | "pairs" >> beam.Create([("a", 1), ("b", 2), ("a", 3)])
    return main | beam.Map(
        lambda x, s, it, lst, d, mm: (
            x, s, sorted(it), sorted(lst), sorted(d.items()),
            sorted((k, sorted(mm[k])) for k in ('a', 'b', 'c'))),
        s=beam.pvalue.AsSingleton(single),
        it=beam.pvalue.AsIter(many),
        lst=beam.pvalue.AsList(many),
        d=beam.pvalue.AsDict(pairs | "dedup" >> beam.Filter(lambda kv: kv != ("a", 3))),
        mm=beam.pvalue.AsMultiMap(pairs),
    )


@pipeline
def windowed_side_inputs(p):  # type: ignore[no-untyped-def]
    main = (
        p | "main" >> beam.Create([1, 5, 12, 25])
        | "tm" >> beam.Map(lambda t: window.TimestampedValue(t, t))
        | "wm" >> beam.WindowInto(window.FixedWindows(10))
    )
    side = (
        p | "side" >> beam.Create([2, 3, 15, 21])
        | "ts" >> beam.Map(lambda t: window.TimestampedValue(t, t))
        | "ws" >> beam.WindowInto(window.FixedWindows(10))
    )
    return main | beam.Map(lambda x, s: (x, sorted(s)), s=beam.pvalue.AsList(side))


def _timestamped(p, n: int = 60):  # type: ignore[no-untyped-def]
    return (
        p | beam.Create([(f"k{i % 3}", i) for i in range(n)])
        | "stamp" >> beam.Map(lambda kv: window.TimestampedValue(kv, kv[1] * 2))
    )


def _format_windowed():  # type: ignore[no-untyped-def]
    class Fmt(beam.DoFn):
        def process(self, kv, w=beam.DoFn.WindowParam, ts=beam.DoFn.TimestampParam):  # type: ignore[no-untyped-def]
            k, vs = kv
            yield (k, sorted(vs), str(w), int(ts.micros))

    return beam.ParDo(Fmt())


@pipeline
def fixed_windows(p):  # type: ignore[no-untyped-def]
    return (_timestamped(p) | beam.WindowInto(window.FixedWindows(15)) | beam.GroupByKey()
            | _format_windowed())


@pipeline
def sliding_windows(p):  # type: ignore[no-untyped-def]
    return (_timestamped(p) | beam.WindowInto(window.SlidingWindows(30, 10)) | beam.GroupByKey()
            | _format_windowed())


@pipeline
def session_windows(p):  # type: ignore[no-untyped-def]
    data = [("a", 1), ("a", 3), ("a", 30), ("b", 2), ("b", 40), ("b", 45), ("a", 33)]
    return (
        p | beam.Create(data) | beam.Map(lambda kv: window.TimestampedValue(kv, kv[1]))
        | beam.WindowInto(window.Sessions(10)) | beam.GroupByKey() | _format_windowed()
    )


@pipeline
def triggered_windows(p):  # type: ignore[no-untyped-def]
    return (
        _timestamped(p)
        | beam.WindowInto(
            window.FixedWindows(20),
            trigger=trigger.AfterWatermark(early=trigger.AfterCount(5)),
            accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
        | beam.CombinePerKey(sum)
        | beam.Map(lambda kv, w=beam.DoFn.WindowParam: (kv, str(w)))
    )


@pipeline
def timestamps(p):  # type: ignore[no-untyped-def]
    return (
        p | beam.Create([1, 2, 3])
        | beam.Map(lambda x: window.TimestampedValue(x, x * 100))
        | beam.Map(lambda x, ts=beam.DoFn.TimestampParam: (x, int(ts.micros)))
    )


class BagAndTimer(beam.DoFn):
    BAG = userstate.BagStateSpec("bag", beam.coders.VarIntCoder())
    COUNT = userstate.CombiningValueStateSpec("count", combine_fn=CountCombineFn())
    EMIT = userstate.TimerSpec("emit", userstate.TimeDomain.WATERMARK)
    AGAIN = userstate.TimerSpec("again", userstate.TimeDomain.WATERMARK)

    def process(self, kv, bag=beam.DoFn.StateParam(BAG), count=beam.DoFn.StateParam(COUNT),  # type: ignore[no-untyped-def]
                emit=beam.DoFn.TimerParam(EMIT), ts=beam.DoFn.TimestampParam):
        bag.add(kv[1])
        count.add(1)
        emit.set(Timestamp(1000))

    @userstate.on_timer(EMIT)
    def on_emit(self, key=beam.DoFn.KeyParam, bag=beam.DoFn.StateParam(BAG),  # type: ignore[no-untyped-def]
                count=beam.DoFn.StateParam(COUNT), again=beam.DoFn.TimerParam(AGAIN)):
        yield ("emit", key, sorted(bag.read()), count.read())
        bag.clear()
        bag.add(-1)
        again.set(Timestamp(2000))  # a timer set by a timer fires too, after this one

    @userstate.on_timer(AGAIN)
    def on_again(self, key=beam.DoFn.KeyParam, bag=beam.DoFn.StateParam(BAG)):  # type: ignore[no-untyped-def]
        yield ("again", key, sorted(bag.read()))


@pipeline
def stateful_bag_combining_timers(p):  # type: ignore[no-untyped-def]
    return p | beam.Create(_kv_data(100, 5)) | beam.ParDo(BagAndTimer())


class ValueSetMap(beam.DoFn):
    LAST = userstate.ReadModifyWriteStateSpec("last", beam.coders.VarIntCoder())
    SEEN = userstate.SetStateSpec("seen", beam.coders.VarIntCoder())
    PROC = userstate.TimerSpec("proc", userstate.TimeDomain.REAL_TIME)

    def process(self, kv, last=beam.DoFn.StateParam(LAST), seen=beam.DoFn.StateParam(SEEN),  # type: ignore[no-untyped-def]
                proc=beam.DoFn.TimerParam(PROC)):
        previous = last.read()
        last.write(max(kv[1], previous or 0))
        seen.add(kv[1] % 4)
        proc.set(Timestamp.now() + Duration(seconds=1))

    @userstate.on_timer(PROC)
    def on_proc(self, key=beam.DoFn.KeyParam, last=beam.DoFn.StateParam(LAST),  # type: ignore[no-untyped-def]
                seen=beam.DoFn.StateParam(SEEN)):
        yield (key, last.read(), sorted(seen.read()))


@pipeline
def stateful_value_set_processing_timer(p):  # type: ignore[no-untyped-def]
    return p | beam.Create(_kv_data(80, 4)) | beam.ParDo(ValueSetMap())


class OrderedListFn(beam.DoFn):
    """Ordered-list state (the Python SDK has no map state: bag, value, set, combining and
    ordered list are its kinds)."""

    LOG = userstate.OrderedListStateSpec("log", beam.coders.VarIntCoder())
    DONE = userstate.TimerSpec("done", userstate.TimeDomain.WATERMARK)

    def process(self, kv, log=beam.DoFn.StateParam(LOG), done=beam.DoFn.TimerParam(DONE)):  # type: ignore[no-untyped-def]
        log.add((Timestamp(kv[1]), kv[1]))
        done.set(Timestamp(0))

    @userstate.on_timer(DONE)
    def on_done(self, key=beam.DoFn.KeyParam, log=beam.DoFn.StateParam(LOG)):  # type: ignore[no-untyped-def]
        yield (key, [v for _, v in log.read_range(Timestamp(5), Timestamp(40))])


@pipeline
def stateful_ordered_list_state(p):  # type: ignore[no-untyped-def]
    return p | beam.Create(_kv_data(60, 3)) | beam.ParDo(OrderedListFn())


class CountTo(beam.DoFn):
    """A splittable DoFn that emits 0..n-1 and checkpoints every `every` elements."""

    def __init__(self, every: int = 7) -> None:
        self._every = every

    class Provider(beam.transforms.core.RestrictionProvider):
        def initial_restriction(self, n):  # type: ignore[no-untyped-def]
            return OffsetRange(0, n)

        def create_tracker(self, restriction):  # type: ignore[no-untyped-def]
            return OffsetRestrictionTracker(restriction)

        def restriction_size(self, n, restriction):  # type: ignore[no-untyped-def]
            return restriction.size()

        def split(self, n, restriction):  # type: ignore[no-untyped-def]
            mid = (restriction.start + restriction.stop) // 2
            yield OffsetRange(restriction.start, mid)
            yield OffsetRange(mid, restriction.stop)

    def process(self, n, tracker=beam.DoFn.RestrictionParam(Provider())):  # type: ignore[no-untyped-def]
        position = tracker.current_restriction().start
        emitted = 0
        while tracker.try_claim(position):
            yield (n, position)
            position += 1
            emitted += 1
            if emitted == self._every:
                tracker.defer_remainder()
                return


@pipeline
def splittable_dofn_checkpoints(p):  # type: ignore[no-untyped-def]
    return p | beam.Create([25, 40, 3]) | beam.ParDo(CountTo())


@pipeline
def splittable_dofn_checkpoints_after_every_element(p):  # type: ignore[no-untyped-def]
    """Work shedding at its limit: every element ends in a checkpoint, each residual is
    rescheduled as new work; every output must still come out exactly once."""
    return p | beam.Create([30, 12]) | beam.ParDo(CountTo(every=1))


@pipeline
def bundle_finalization(p):  # type: ignore[no-untyped-def]
    class Finalizing(beam.DoFn):
        def process(self, x, finalizer=beam.DoFn.BundleFinalizerParam):  # type: ignore[no-untyped-def]
            finalizer.register(lambda: None)
            yield x * 2

    return p | beam.Create(range(20)) | beam.ParDo(Finalizing())


def _tmp(name: str) -> str:
    """A new path under the test run's temporary directory (tests/conftest.py removes it when
    the run ends; a child driver's is $SPARKBEAM_TEST_TMP)."""
    base = (os.environ.get("SPARKBEAM_TEST_TMP")
            or os.path.join(tempfile.gettempdir(), "sparkbeam-tests"))
    os.makedirs(base, exist_ok=True)
    return os.path.join(base, f"{name}-{os.getpid()}-{time.monotonic_ns()}")


@pipeline
def text_io_round_trip(p):  # type: ignore[no-untyped-def]
    src = _tmp("text-src")
    os.makedirs(src)
    for i in range(3):
        with open(os.path.join(src, f"part{i}.txt"), "w") as f:
            f.write("\n".join(f"line {i} {j}" for j in range(50)))
    return p | beam.io.ReadFromText(os.path.join(src, "*.txt")) | beam.Map(str.upper)


@pipeline
def parquet_io_round_trip(p):  # type: ignore[no-untyped-def]
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = _tmp("parquet-src")
    os.makedirs(src)
    pq.write_table(pa.table({"k": [f"k{i % 4}" for i in range(40)], "v": list(range(40))}),
                   os.path.join(src, "data.parquet"))
    return (
        p | beam.io.ReadFromParquet(os.path.join(src, "*.parquet"))
        | beam.Map(lambda r: (r["k"], r["v"])) | beam.CombinePerKey(sum)
    )


@pipeline
def fileio_match_and_read(p):  # type: ignore[no-untyped-def]
    from apache_beam.io import fileio

    src = _tmp("fileio-src")
    os.makedirs(src)
    for i in range(4):
        with open(os.path.join(src, f"f{i}.txt"), "w") as f:
            f.write("x" * (i + 1))
    return (
        p | fileio.MatchFiles(os.path.join(src, "*.txt")) | fileio.ReadMatches()
        | beam.Map(lambda rf: (os.path.basename(rf.metadata.path), len(rf.read())))
    )
