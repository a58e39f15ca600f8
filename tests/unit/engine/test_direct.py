"""The direct path's pieces without Spark: lines cut out of an Arrow batch equal Beam's decoding of
each element, and a stage's rows are byte for byte the bundle processor's (`engine/direct.py`)."""
from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
from typing import Any

import apache_beam as beam
from apache_beam.internal import pickler
from apache_beam.transforms import window
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import WindowedValue
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.engine.arrow import ArrowRows, columns_of
from sparkbeam.engine.context import pipeline_context
from sparkbeam.engine.arrow import text_lines
from sparkbeam.plan.direct_paths import wrapped_fn
from sparkbeam.engine.side_inputs import side_input_state
from sparkbeam.engine.task import TaskSpec, run_stage_task
from sparkbeam.plan.batch import plan_batch
from sparkbeam.plan.native_text import varint

_LINE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40) | st.sampled_from(
    ["", "x" * 127, "y" * 128, "z" * 16_383, "é" * 8_200, "w" * 20_000])


def text_plan(line: str, build: Any, pick: Any = lambda s: s.direct is not None):  # type: ignore[no-untyped-def]
    """A pipeline reading a one-line text file (`build` adds the rest to the read's
    PCollection), planned: the plan, the first stage `pick` takes, the read's line prefix."""
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "in.txt")
    with open(path, "w") as f:
        f.write(line + "\n")
    p = beam.Pipeline()
    build(p | beam.io.ReadFromText(path))
    plan = plan_batch(p.to_runner_api())
    stage = next(s for s in plan.stages if pick(s))
    return plan, stage, next(iter(plan.text_reads.values())).prefix


def _plan(keyed: bool, pair: Any = lambda w: (w, len(w))):  # type: ignore[no-untyped-def]
    def build(lines):  # type: ignore[no-untyped-def]
        pairs = (lines | "Split" >> beam.FlatMap(str.split)
                 | "NotTwo" >> beam.Filter(lambda w: len(w) != 2)
                 | "Pair" >> beam.Map(pair))
        _ = pairs | (beam.GroupByKey() if keyed else beam.CombinePerKey(sum))

    return text_plan("a b", build)


def _batch(values: list[bytes]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([0] * len(values), pa.int32()), pa.array([None] * len(values), pa.binary()),
         pa.array(values, pa.binary())], names=["input", "key", "value"])


def _both_paths(plan, stage, batches: list[pa.RecordBatch],  # type: ignore[no-untyped-def]
                side: dict[bytes, list[bytes]] | None = None) -> tuple[list, list]:  # type: ignore[type-arg]
    """The stage's data rows run directly, and run by Beam's bundle processor."""
    spec = TaskSpec(stage=stage, components=plan.components, groupings=dict(plan.groupings),
                    pickle_library="default", bundle_size=1_000_000, bundle_bytes=64 << 20)
    general = dataclasses.replace(spec, stage=dataclasses.replace(stage, direct=None))

    def data(s: TaskSpec) -> list:  # type: ignore[type-arg]
        return [r for r in run_stage_task(s, ArrowRows(iter(batches)), side or {}) if r[0] >= 0]

    return data(spec), data(general)


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(_LINE, min_size=1, max_size=30))
def test_text_lines_are_beams_decoding(lines: list[str]) -> None:
    _, _, prefix = _plan(keyed=False)
    encoded = [prefix + varint(len(s.encode())) + s.encode() for s in lines]
    assert text_lines(columns_of(_batch(encoded)), prefix) == lines


def test_text_lines_refuse_what_is_not_a_line() -> None:
    _, _, prefix = _plan(keyed=False)
    good = prefix + varint(1) + b"a"
    for bad in (prefix + varint(2) + b"\xff\xfe",  # not UTF-8
                b"\x80" + good[1:],  # another timestamp
                prefix + varint(5) + b"ab"):  # a length that is not the rest
        assert text_lines(columns_of(_batch([good, bad])), prefix) is None


@settings(max_examples=10, deadline=None)
@given(lines=st.lists(st.text(st.characters(blacklist_categories=("Cs",),
                                            blacklist_characters="\r\n"), max_size=12),
                      max_size=50), keyed=st.booleans())
def test_rows_equal_the_bundle_processors(lines: list[str], keyed: bool) -> None:
    plan, stage, prefix = _plan(keyed)
    encoded = [prefix + varint(len(s.encode())) + s.encode() for s in lines]
    direct, beams = _both_paths(plan, stage, [_batch(encoded)])
    if keyed:  # (key, value) per word, in order
        assert direct == beams
    else:  # one accumulator per key, in a table's order
        assert sorted(direct) == sorted(beams)


def _odd_pair(word: str) -> object:
    """Pairs a keyed consumer reads that are not plain 2-tuples: Beam's TupleCoder encodes
    a list as it does a tuple."""
    return [word, len(word)] if len(word) % 2 else (word, (word, -len(word)))


@settings(max_examples=10, deadline=None)
@given(lines=st.lists(st.text("abc é", max_size=12), max_size=30))
def test_keyed_rows_of_lists_and_nested_tuples_equal_the_bundle_processors(
        lines: list[str]) -> None:
    plan, stage, prefix = _plan(True, _odd_pair)
    encoded = [prefix + varint(len(s.encode())) + s.encode() for s in lines]
    direct, beams = _both_paths(plan, stage, [_batch(encoded)])
    assert direct == beams


def _parse_typed(line: str) -> tuple[str, object]:
    """'key kind digits' as (key, a value of that kind): the inline table's ints and what
    turns a key's entry over to Beam's add_input."""
    key, kind, digits = line.split(" ")
    n = int(digits) - 50
    value: object = {"i": n, "f": n / 4, "n": float("nan"), "b": n % 2 == 0,
                     "B": n * 2**70, "z": -0.0}[kind]
    return key, value


_COMBINES = {"sum": lambda: beam.CombinePerKey(sum), "min": lambda: beam.CombinePerKey(min),
             "max": lambda: beam.CombinePerKey(max), "count": beam.combiners.Count.PerKey,
             "mean": beam.combiners.Mean.PerKey}
_TYPED = st.tuples(st.sampled_from("abc"), st.sampled_from("iiiifnbBz"),
                   st.integers(0, 100)).map(lambda t: f"{t[0]} {t[1]} {t[2]}")


@settings(max_examples=40, deadline=None)
@given(lines=st.lists(_TYPED, max_size=60), combine=st.sampled_from(sorted(_COMBINES)))
def test_inline_combiners_equal_beams_accumulators(lines: list[str], combine: str) -> None:
    # The lifted combiner's table keeps Count's counts and the exact-int sums, mins and maxes
    # itself; the accumulators it emits are byte for byte Beam's, whatever mix of values.
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "in.txt")
    with open(path, "w") as f:
        f.write("a i 1\n")
    p = beam.Pipeline()
    _ = (p | beam.io.ReadFromText(path) | "Parse" >> beam.Map(_parse_typed)
         | "Combine" >> _COMBINES[combine]())
    plan = plan_batch(p.to_runner_api())
    stage = next(s for s in plan.stages if s.direct is not None)
    assert stage.direct is not None and stage.direct.combine
    prefix = next(iter(plan.text_reads.values())).prefix
    encoded = [prefix + varint(len(s.encode())) + s.encode() for s in lines]
    # Two Arrow batches: a key's entry lives across them.
    direct, beams = _both_paths(plan, stage, [_batch(encoded[: len(encoded) // 2]),
                                              _batch(encoded[len(encoded) // 2:])])
    assert sorted(direct) == sorted(beams)


def test_map_and_filter_wrappers_are_recognised_after_pickling() -> None:
    def f(x: int) -> int:
        return x + 1

    found = [wrapped_fn(pickler.loads(pickler.dumps(t.fn)).process)
             for t in (beam.Map(f), beam.Filter(f), beam.FlatMap(f), beam.Map(len),
                       beam.Map(lambda x, y=1: x), beam.Map(lambda x, y: x, 2))]
    assert [w and w[0] for w in found] == ["map", "filter", None, "map", None, None]
    assert found[0] is not None and found[0][1](1) == 2
    assert found[1] is not None and found[1][1](1) == 2
    assert found[3] is not None and found[3][1] is len


@settings(max_examples=30, deadline=None)
@given(elements=st.lists(st.tuples(st.integers(-5, 5), st.integers(0, 10**6)), max_size=40))
def test_map_and_filter_keep_each_elements_window(elements: list[tuple[int, int]]) -> None:
    # Elements read from a buffer each carry their own window and timestamp: a Filter keeps
    # the survivors' own, a Map each input's, byte for byte as the bundle processor does.
    p = beam.Pipeline()
    fixed = beam.WindowInto(window.FixedWindows(9))
    both = [p | f"Create{n}" >> beam.Create([n]) | f"Window{n}" >> fixed for n in (1, 2)]
    _ = (both | beam.Flatten()  # the stage after a Flatten reads a buffer
         | "Positive" >> beam.Filter(lambda x: x > 0)
         | "Double" >> beam.Map(lambda x: x * 2)
         | "Odd" >> beam.Filter(lambda x: x % 3)
         | "Pair" >> beam.Map(lambda x: (x % 2, x)) | beam.GroupByKey())
    plan = plan_batch(p.to_runner_api())
    stage = next(s for s in plan.stages if "Positive" in s.transforms)
    assert stage.direct is not None
    assert [n for n in stage.transforms if n in ("Positive", "Double", "Odd", "Pair")]
    impl = pipeline_context(plan.components).coders[stage.inputs[0].coder_id].get_impl()
    encoded = [impl.encode_nested(WindowedValue(x, ts, [window.IntervalWindow(ts, ts + 9)]))
               for x, ts in elements]
    direct, beams = _both_paths(plan, stage, [_batch(encoded)])
    assert direct == beams


def _stamp(x: int) -> object:
    # A TimestampedValue from a Map; every third element passes through with its own time.
    return x if x % 3 == 0 else window.TimestampedValue((x % 4, x), x * 7)


def _stamp_many(x: object) -> list[object]:
    # A FlatMap giving a TimestampedValue and a plain value per element.
    return [window.TimestampedValue(x, 50), ("plain", x)]


_WINDOW_INTO = {
    "sessions": lambda: beam.WindowInto(window.Sessions(20)),
    "sliding": lambda: beam.WindowInto(window.SlidingWindows(30, 10)),
    "fixed": lambda: beam.WindowInto(window.FixedWindows(25)),
    "global": lambda: beam.WindowInto(window.GlobalWindows()),
    "none": lambda: beam.Map(lambda x: x),  # TimestampedValues' windows reach the output
}


@settings(max_examples=100, deadline=None)
@given(elements=st.lists(st.tuples(st.integers(-50, 50), st.integers(0, 10**6),
                                   st.booleans()), max_size=40),
       windowing=st.sampled_from(sorted(_WINDOW_INTO)), many=st.booleans(),
       sliding=st.booleans())
def test_timestamps_and_window_into_equal_the_bundle_processors(  # type: ignore[no-untyped-def]
        elements, windowing, many, sliding) -> None:
    # TimestampedValue results get the ParDo's windows (times an element's windows count);
    # WindowInto assigns at each element's timestamp; elements in several windows go to the
    # bundle processor for WindowInto. Byte for byte.
    plan, stage = _stamping_plan(windowing, many, sliding)
    impl = pipeline_context(plan.components).coders[stage.inputs[0].coder_id].get_impl()
    encoded = []
    for x, ts, several in elements:
        if sliding:  # the elements' own windows, as the input's windowing assigned them
            windows = [window.IntervalWindow(ts, ts + 9)]
            if several:
                windows.append(window.IntervalWindow(ts + 3, ts + 12))
        else:
            windows = [window.GlobalWindow()] * (2 if several else 1)
        encoded.append(impl.encode_nested(WindowedValue(x, ts, windows)))
    direct, beams = _both_paths(plan, stage, [_batch(encoded)])
    assert direct == beams


@functools.cache
def _stamping_plan(windowing: str, many: bool, sliding: bool):  # type: ignore[no-untyped-def]
    p = beam.Pipeline()
    into = beam.WindowInto(window.SlidingWindows(9, 3) if sliding else window.GlobalWindows())
    both = [p | f"Create{n}" >> beam.Create([n]) | f"Window{n}" >> into for n in (1, 2)]
    stamped = (both | beam.Flatten() | "Stamp" >> beam.Map(_stamp))
    if many:
        stamped = stamped | "StampMany" >> beam.FlatMap(_stamp_many)
    _ = (stamped | "Into" >> _WINDOW_INTO[windowing]()
         | "Key" >> beam.Map(lambda x: (str(x)[:3], x)) | beam.GroupByKey())
    plan = plan_batch(p.to_runner_api())
    stage = next(s for s in plan.stages if "Into" in s.transforms)
    assert stage.direct is not None and "Stamp" in stage.transforms, plan.decisions
    return plan, stage


_VIEWS = {
    "dict": (beam.pvalue.AsDict, lambda w, d: (w, d.get(w, -1))),
    "list": (beam.pvalue.AsList, lambda w, xs: (w, len(xs), sorted(xs)[:2])),
    "iter": (beam.pvalue.AsIter, lambda w, xs: (w, sum(v for _, v in xs))),
    "multimap": (beam.pvalue.AsMultiMap, lambda w, m: (w, sorted(m[w]))),
    "singleton": (lambda pc: beam.pvalue.AsSingleton(pc, default_value=("none", 0)),
                  lambda w, s: (w, s)),
}


@settings(max_examples=25, deadline=None)
@given(words=st.lists(st.sampled_from(["a", "b", "cc", "é"]), max_size=20),
       side=st.lists(st.tuples(st.sampled_from(["a", "b", "z"]), st.integers(-3, 3)),
                     max_size=6),
       view=st.sampled_from(sorted(_VIEWS)))
def test_side_inputs_in_the_global_window_equal_the_bundle_processors(
        words: list[str], side: list[tuple[str, int]], view: str) -> None:
    # A Map reading a globally windowed side input runs directly, its view made by Beam's own
    # StateBackedSideInputMap over the stage's side-input state; rows byte for byte Beam's.
    if view == "singleton":
        side = side[:1]
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "in.txt")
    with open(path, "w") as f:
        f.write("a\n")
    as_view, fn = _VIEWS[view]
    p = beam.Pipeline()
    table = p | "Side" >> beam.Create([("a", 1)])
    _ = (p | beam.io.ReadFromText(path) | "Look" >> beam.Map(fn, as_view(table))
         | "Key" >> beam.Map(lambda r: (r[0], str(r[1:]))) | beam.GroupByKey())
    plan = plan_batch(p.to_runner_api())
    stage = next(s for s in plan.stages if "Look" in s.transforms)
    assert stage.direct is not None and stage.side_inputs
    ctx = pipeline_context(plan.components)
    use = stage.side_inputs[0]
    impl = ctx.coders[use.coder_id].get_impl()
    state = side_input_state(stage.side_inputs, {use.buffer_id: [
        impl.encode_nested(window.GlobalWindows.windowed_value(kv)) for kv in side]}, ctx)
    prefix = next(iter(plan.text_reads.values())).prefix
    encoded = [prefix + varint(len(w.encode())) + w.encode() for w in words]
    direct, beams = _both_paths(plan, stage, [_batch(encoded)], state)
    assert direct == beams


@settings(max_examples=300, deadline=None)
@given(micros=st.integers(-(2**63), 2**63 - 1) | st.integers(-3000, 3000)
       | st.sampled_from([MIN_TIMESTAMP.micros, MAX_TIMESTAMP.micros, -1, -999, -1000, -1001]))
def test_timestamp_bytes_are_beams(micros: int) -> None:
    """The 8 bytes `direct_stamps.encode_stamped` puts before each element's header: Beam's own."""
    from apache_beam.coders import coders
    from apache_beam.utils import windowed_value

    from sparkbeam.engine.direct_steps import timestamp_bytes

    impl = coders.WindowedValueCoder(coders.VarIntCoder()).get_impl()
    wv = windowed_value.create(1, micros, (window.GlobalWindow(),))
    assert timestamp_bytes(micros) == impl.encode_nested(wv)[:8]


class _Keep(beam.DoFn):
    """A stateful DoFn: its input is a keyed buffer, so the direct stage before it writes each
    element's key beside it."""

    SEEN = beam.transforms.userstate.BagStateSpec("seen", beam.coders.VarIntCoder())

    def process(self, kv, seen=beam.DoFn.StateParam(SEEN)):  # type: ignore[no-untyped-def]
        seen.add(kv[1])
        yield kv


def keyed_stamping_plan(stamp: Any):  # type: ignore[no-untyped-def]
    """Lines made TimestampedValues of (int, int) by `stamp`, read by a stateful DoFn (so
    the stage writes each element's key beside it)."""
    return text_plan("1,2,3,0", lambda lines: (
        lines | "Stamp" >> beam.Map(stamp).with_output_types(tuple[int, int])
        | "Keep" >> beam.ParDo(_Keep())))


def _stamp_line(line: str) -> object:
    key, at, value = line.split(",")[:3]
    return window.TimestampedValue((int(key), int(value)), Timestamp(micros=int(at)))


@functools.cache
def _keyed_stamping_plan():  # type: ignore[no-untyped-def]
    return keyed_stamping_plan(_stamp_line)


@settings(max_examples=60, deadline=None)
@given(events=st.lists(st.tuples(st.integers(-5, 5), st.integers(-(10**12), 10**12)
                                 | st.sampled_from([-1, -999, -1001, 0, 999, 1001]),
                                 st.integers(0, 2**40)), min_size=1, max_size=40))
def test_timestamped_keyed_results_are_the_bundle_processors(events) -> None:  # type: ignore[no-untyped-def]
    """Keyed results at timestamps of their own (each element's 8 timestamp bytes before the
    shared rest of its header): byte for byte the bundle processor's rows."""
    plan, stage, prefix = _keyed_stamping_plan()
    assert stage.outputs[0].key_coder_id
    lines = [f"{k},{at},{v}".encode() for k, at, v in events]
    direct, beams = _both_paths(plan, stage, [_batch([prefix + varint(len(s)) + s
                                                      for s in lines])])
    assert direct == beams


def test_a_direct_task_builds_no_bundle_processor_unless_it_hands_over() -> None:
    # The bundle processor is leased when a bundle first needs it (`LeasedOnUse`): never for
    # a task whose functions all run directly; for one that hands over, at the hand-over.
    from sparkbeam.control.embedded import WORKERS

    plan, stage, prefix = _plan(keyed=False)
    spec = TaskSpec(stage=stage, components=plan.components, groupings=dict(plan.groupings),
                    pickle_library="default", bundle_size=1000, bundle_bytes=64 << 20,
                    job_id=f"lease-{os.getpid()}-{id(plan)}")

    def run(values: list[bytes]) -> list[Any]:
        return [r for r in run_stage_task(spec, ArrowRows(iter([_batch(values)])), {})
                if r[0] >= 0]

    line = prefix + varint(7) + b"abc def"
    run([line])  # the stage's program built (once per process)
    before = WORKERS.created
    direct = run([line] * 3)
    assert WORKERS.created == before
    # Not UTF-8: the direct path hands the batch over, and Beam's decoding refuses it.
    with pytest.raises(RuntimeError, match="Error decoding input stream"):
        run([line, prefix + varint(2) + b"\xff\xfe"])
    assert WORKERS.created == before + 1
    general = dataclasses.replace(spec, stage=dataclasses.replace(stage, direct=None))
    assert [r for r in run_stage_task(general, ArrowRows(iter([_batch([line] * 3)])), {})
            if r[0] >= 0] == direct


def test_rows_the_driver_holds_are_cut_into_batches_as_a_tasks_are() -> None:
    from sparkbeam.engine.arrow import arrow_rows

    rows = [(0, None, bytes([n]) * (1 << 20)) for n in range(20)] + [(1, b"k", b"")]
    held = arrow_rows(rows)
    batches = list(held.batches)
    assert len(batches) > 1 and all(b.nbytes < 40 << 20 for b in batches)
    assert list(arrow_rows(rows)) == rows
    assert list(arrow_rows([])) == []
