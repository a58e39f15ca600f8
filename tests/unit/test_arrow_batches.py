"""Which batch plans let Spark batch rows for Python workers by count alone (plan/arrow_batches)."""
from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.runners import pipeline_context
from apache_beam.transforms import window
from apache_beam.utils.timestamp import MAX_TIMESTAMP

from sparkbeam.plan.arrow_batches import (
    MAX_BATCH_ROWS,
    MAX_ROW_BYTES,
    NO_BYTE_LIMIT,
    PACKED_ROW_BYTES,
    SPARK_BATCH_ROWS,
    batch_limits,
    batch_rows,
    largest_row,
    max_encoded_size,
    rows_provably_small,
    setting_problem,
)
from sparkbeam.plan.batch import plan_batch
from sparkbeam.plan.check import option_problems


def _size(coder: coders.Coder) -> int | None:
    context = pipeline_context.PipelineContext()
    coder_id = context.coders.get_id(coder)
    return max_encoded_size(coder_id, context.to_runner_api().coders)


def test_bounded_coders_bound_their_largest_encoding() -> None:
    varint = coders.VarIntCoder()
    assert _size(varint) == 10
    assert _size(coders.TupleCoder([varint, coders.FloatCoder()])) == 18  # Beam's KV
    triple = coders.TupleCoder([varint, varint, varint])  # a Python-only coder: no bound known
    assert _size(triple) is None
    kv = coders.TupleCoder([varint, coders.BooleanCoder()])
    assert _size(kv) == 11
    windowed = coders.WindowedValueCoder(kv, coders.GlobalWindowCoder())
    assert _size(windowed) == 11 + 8 + 4 + 21
    # The largest values really are that size.
    impl = windowed.get_impl()
    from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue

    pane = PaneInfo(False, False, PaneInfoTiming.LATE, 2**31 - 1, 2**31 - 1)
    big = WindowedValue((-1, True), MAX_TIMESTAMP, [window.GlobalWindow()], pane)
    assert len(impl.encode_nested(big)) <= _size(windowed)  # type: ignore[operator]


@pytest.mark.parametrize("coder", [
    coders.StrUtf8Coder(), coders.BytesCoder(), coders.PickleCoder(),
    coders.IterableCoder(coders.VarIntCoder()),
    coders.TupleCoder([coders.VarIntCoder(), coders.StrUtf8Coder()]),
    # Windows of other kinds: an element may be in any number of them.
    coders.WindowedValueCoder(coders.VarIntCoder(), coders.IntervalWindowCoder()),
])
def test_unbounded_coders_have_no_bound(coder: coders.Coder) -> None:
    assert _size(coder) is None


def _plan(typed_strings: bool, packing: bool = False):  # type: ignore[no-untyped-def]
    p = beam.Pipeline()
    # Impulse, not Create: Create's reshuffle carries each element's windowing as a pickle.
    pairs = (p | beam.Impulse() | beam.FlatMap(lambda _: range(20)).with_output_types(int)
             | beam.Map(lambda x: (x % 3, x)).with_output_types(tuple[int, int])
             | beam.GroupByKey()
             | beam.MapTuple(lambda k, vs: (k, sum(vs))).with_output_types(tuple[int, int]))
    if typed_strings:  # strings crossing a stage boundary (into a grouping)
        _ = (pairs | beam.MapTuple(lambda k, v: (str(k), v)).with_output_types(tuple[str, int])
             | "Again" >> beam.GroupByKey())
    else:
        _ = pairs | "Again" >> beam.GroupByKey()
    # Unpacked, but where a test says: packed rows are bounded otherwise (below).
    return plan_batch(p.to_runner_api(), packing=packing)


def test_a_plan_of_small_typed_elements_batches_by_count() -> None:
    plan = _plan(typed_strings=False)
    assert rows_provably_small(plan)
    # The largest row: the grouping's input, (int, int) in the global window on the wire (the
    # element's header, two length-prefixed varints), its key again, and the row's Arrow
    # overhead (input number, two offsets, the sort column).
    largest = largest_row(plan)
    assert largest == 20 + 2 * ((8 + 4 + 1 + 10 + 10) + 2 * (10 + 5))
    limit, rows, why = batch_limits("auto", plan)
    assert (limit, rows) == (NO_BYTE_LIMIT, MAX_BATCH_ROWS)
    assert f"{MAX_BATCH_ROWS:,} rows" in why and f"at most {largest} bytes" in why


def test_packed_rows_of_small_elements_stay_provably_small() -> None:
    # Both GroupByKeys' inputs counted (`plan/packed_rows.py`): a row is less than
    # PACKED_ROW_BYTES of values, one more and a count, a key at most an
    # element, and the row's overhead.
    plan = _plan(typed_strings=False, packing=True)
    assert plan.packed and all(plan.groupings[b].counted for b in plan.packed)
    element = (8 + 4 + 1 + 10 + 10) + 2 * (10 + 5)  # as the largest row's above
    assert largest_row(plan) == 20 + 2 * element + PACKED_ROW_BYTES + 4
    assert rows_provably_small(plan)
    limit, rows, _ = batch_limits("auto", plan)
    assert limit == NO_BYTE_LIMIT and SPARK_BATCH_ROWS < rows < MAX_BATCH_ROWS
    # Strings bound nothing: packed or not, the byte limit stays.
    assert largest_row(_plan(typed_strings=True, packing=True)) is None


def test_a_stage_reading_strings_keeps_sparks_limit_unless_told() -> None:
    plan = _plan(typed_strings=True)
    assert not rows_provably_small(plan) and largest_row(plan) is None
    assert batch_limits("auto", plan)[0] is None
    assert batch_limits("rows", plan)[0] == NO_BYTE_LIMIT
    assert batch_limits("1048576", plan)[0] == 1048576
    # More rows a batch only where the rows are provably small: never on the user's say-so.
    assert [batch_limits(setting, plan)[1] for setting in ("auto", "rows", "1048576")] == [
        None, None, None]
    assert batch_limits("rows", _plan(typed_strings=False))[1] is None


def test_a_session_that_cuts_at_more_rows_than_fit_keeps_sparks_byte_limit() -> None:
    # The session's own row limit wins over the job's (a cluster's defaults, a session the
    # user made): past what provably fits 64 MB, no batch may go without the byte limit.
    plan = _plan(typed_strings=False)
    assert batch_limits("auto", plan, session_rows=MAX_BATCH_ROWS)[:2] == (
        NO_BYTE_LIMIT, MAX_BATCH_ROWS)
    assert batch_limits("auto", plan, session_rows=5_000)[:2] == (NO_BYTE_LIMIT, MAX_BATCH_ROWS)
    limit, rows, why = batch_limits("auto", plan, session_rows=MAX_BATCH_ROWS + 1)
    assert (limit, rows) == (None, None)
    assert "keep Spark's byte limit" in why and f"{MAX_BATCH_ROWS + 1:,} rows" in why


@pytest.mark.parametrize("largest", [0, 1, 110, 671, 672, 1000, 6709, MAX_ROW_BYTES])
def test_more_rows_a_batch_only_as_far_as_spark_s_64_mb_holds_them(largest: int) -> None:
    rows = batch_rows(largest)
    assert SPARK_BATCH_ROWS <= rows <= MAX_BATCH_ROWS
    assert rows * max(largest, 1) <= MAX_ROW_BYTES * SPARK_BATCH_ROWS
    if rows < MAX_BATCH_ROWS:  # no more would fit, unless Spark's own count already is more
        assert (rows + 1) * largest > MAX_ROW_BYTES * SPARK_BATCH_ROWS or (
            rows == SPARK_BATCH_ROWS)


def test_a_bad_setting_is_refused_at_prepare() -> None:
    assert setting_problem("auto") is None and setting_problem("rows") is None
    assert setting_problem("4096") is None
    for bad in ("0", "-1", "64m", ""):
        assert setting_problem(bad) is not None
    problems = option_problems(streaming=False, checkpoint_dir=None, budgets={},
                               arrow_batch_bytes="64m")
    assert len(problems) == 1 and "--arrow_batch_bytes=64m" in str(problems[0])


def test_a_buffer_writetospark_decodes_counts_too() -> None:
    # WriteToSpark's buffer goes through Arrow batches to Python workers as stage inputs do:
    # elements without a size bound there keep Spark's limit, however small the stages' rows.
    import dataclasses

    from apache_beam.portability.api import beam_runner_api_pb2

    from sparkbeam.plan.native_spark import RunnerWrite

    plan = _plan(typed_strings=False)
    coders = beam_runner_api_pb2.Components.FromString(plan.components).coders
    unbounded = next(c for c in coders if max_encoded_size(c, coders) is None)
    bounded = next(c for c in coders if max_encoded_size(c, coders) is not None)
    for coder_id, small in ((bounded, True), (unbounded, False)):
        write = RunnerWrite(transform="Write", buffer_id=b"written", coder_id=coder_id,
                            payload=b"")
        assert rows_provably_small(dataclasses.replace(plan, spark_writes=(write,))) is small


def _ends_in_text_write(tmp_path, typed_values: bool) -> beam.Pipeline:  # type: ignore[no-untyped-def]
    p = beam.Pipeline()
    pairs = (p | beam.Impulse() | beam.FlatMap(lambda _: range(20)).with_output_types(int)
             | beam.Map(lambda x: (x % 3, x)).with_output_types(tuple[int, int])
             | beam.GroupByKey())
    if typed_values:  # the grouping's rows bounded; the write's lines made in the same stage
        lines = pairs | beam.MapTuple(lambda k, vs: f"{k}:{sum(vs)}")
    else:  # the lines cross a stage boundary into the write's bundles: unbounded strings
        lines = (pairs | beam.MapTuple(lambda k, vs: (k, f"{k}:{sum(vs)}"))
                 | "Again" >> beam.GroupByKey() | beam.MapTuple(lambda k, vs: list(vs)[0]))
    _ = lines | beam.io.WriteToText(str(tmp_path / "out"))
    return p


def test_a_text_writes_one_element_inputs_do_not_keep_the_limit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """WriteImpl's DoOnce (a Create of one value, through its MaybeReshuffle that passes its
    input on) is read by PreFinalize and FinalizeWrite, whose coder bounds nothing: one row,
    batched alike with the limit or without."""
    from apache_beam.portability.api import beam_runner_api_pb2
    from apache_beam.runners.portability.fn_api_runner import translations

    from sparkbeam.plan.arrow_batches import element_bound

    plan = plan_batch(_ends_in_text_write(tmp_path, typed_values=True).to_runner_api())
    comps = beam_runner_api_pb2.Components.FromString(plan.components)
    finalising = [use for stage in plan.stages for use in stage.inputs
                  if "Finalize" in stage.description]
    assert len(finalising) == 2
    for use in finalising:
        assert max_encoded_size(use.coder_id, comps.coders) is None
        assert element_bound(comps, translations.split_buffer_id(use.buffer_id)[1]) == 1
    assert rows_provably_small(plan)
    # Strings read by the write's bundles from another stage still keep the limit.
    other = plan_batch(_ends_in_text_write(tmp_path, typed_values=False).to_runner_api())
    assert not rows_provably_small(other)


def _read_after_its_side_input(values: list[str]) -> beam.Pipeline:
    """`values` (strings: no bound) read by a stage of their own: the reader needs a side input
    made from them, so they cross a stage boundary ungrouped."""
    p = beam.Pipeline()
    words = p | "Words" >> beam.Create(values, reshuffle=False)
    side = words | "Len" >> beam.Map(len).with_output_types(int)
    _ = words | "Use" >> beam.Map(lambda s, n: s, beam.pvalue.AsList(side))
    return p


def test_only_an_input_of_one_element_is_exempt_from_the_coders_bound() -> None:
    one = plan_batch(_read_after_its_side_input(["a"]).to_runner_api())
    three = plan_batch(_read_after_its_side_input(["a", "bb", "ccc"]).to_runner_api())
    assert [len(s.inputs) for s in three.stages] == [1, 1]  # the impulse, then the strings
    assert rows_provably_small(one)
    assert not rows_provably_small(three)


def test_a_stage_has_at_most_one_exempt_input() -> None:
    """A shuffled or spread stage mixes its inputs' rows: two one-row inputs of any size could
    share a batch that Spark's limit would have cut."""
    import dataclasses

    plan = plan_batch(_read_after_its_side_input(["a"]).to_runner_api())
    reader = plan.stages[-1]
    twice = dataclasses.replace(reader, inputs=reader.inputs * 2)
    assert rows_provably_small(plan)
    assert not rows_provably_small(dataclasses.replace(
        plan, stages=(*plan.stages[:-1], twice)))


def test_a_buffer_named_after_a_transform_is_not_taken_for_a_pcollection() -> None:
    """Beam names a Flatten's buffer after the Flatten: a transform labelled like a
    PCollection id must not lend that PCollection's bound to the buffer."""
    from apache_beam.portability.api import beam_runner_api_pb2

    from sparkbeam.plan.arrow_batches import holds_one_element

    p = beam.Pipeline()
    one = p | "One" >> beam.Create(["a"])
    comps = p.to_runner_api().components
    pcoll = next(pc for t in comps.transforms.values() if t.unique_name == "One"
                 for pc in t.outputs.values())
    assert holds_one_element(comps, b"materialize:" + pcoll.encode())
    clash = beam_runner_api_pb2.Components()
    clash.CopyFrom(comps)
    clash.transforms["flatten"].unique_name = pcoll
    assert not holds_one_element(clash, b"materialize:" + pcoll.encode())
    assert not holds_one_element(comps, b"group:" + pcoll.encode())
    _ = one


def test_element_bounds_come_from_impulse_create_and_map_only() -> None:
    from apache_beam.portability.api import beam_runner_api_pb2

    from sparkbeam.plan.arrow_batches import element_bound

    p = beam.Pipeline()
    one = p | "One" >> beam.Create(["a"])
    three = p | "Three" >> beam.Create(["a", "b", "c"], reshuffle=False)
    mapped = one | "Mapped" >> beam.Map(str.upper)
    flat = one | "Flat" >> beam.FlatMap(lambda s: [s, s])
    with_side = one | "Side" >> beam.Map(lambda s, t: s + t, beam.pvalue.AsSingleton(one))
    impulse = p | "Impulse" >> beam.Impulse()
    proto = p.to_runner_api()
    comps = proto.components
    ids = {t.unique_name: next(iter(t.outputs.values()))
           for t in comps.transforms.values() if t.outputs}
    assert element_bound(comps, ids["Impulse"]) == 1
    assert element_bound(comps, ids["One"]) == 1
    assert element_bound(comps, ids["Three"]) == 3
    assert element_bound(comps, ids["Mapped"]) == 1
    assert element_bound(comps, ids["Flat"]) is None  # a user's FlatMap: any number
    assert element_bound(comps, ids["Side"]) is None  # a side input: not followed
    assert element_bound(comps, "no-such-pcollection") is None
    _ = (impulse, three, mapped, flat, with_side, beam_runner_api_pb2)
