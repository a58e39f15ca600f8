"""How batch groups each GroupByKey's values per key, chosen at planning (no pyspark).

Two paths, both producing exactly what Beam's FnApiRunner produces (`engine/grouping.py` runs
them; its tests hold them equal): *by window* for the default trigger under any windowing but
the trivial global one (fixed, sliding, sessions, custom windows, another timestamp combiner):
each window fires once in batch, so Beam's trigger driver's output is computed directly;
otherwise Beam's own `GroupingBuffer` (and its trigger driver).

Batch also leaves a CombinePerKey over merging windows (sessions) unlifted: before the
GroupByKey each element's window is its own, so Beam's pre-combine makes an accumulator per
element and the shuffle carries those instead of the values (measured on sparkbeam, a sessions
count-and-sum of 400k events: 12.7 s lifted, 8.5-9.9 s unlifted). The CombinePerKey then runs
as Beam's own expansion, a GroupByKey and CombineValues, as Beam runs one whose trigger cannot
be lifted (`lift_combiners_unless_merging`).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.coders import coders
from apache_beam.coders.coder_impl import WindowedValueCoderImpl
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner import translations
from apache_beam.transforms import window

from sparkbeam.plan.model import Grouping, Plan


def is_trivial(strategy: beam_runner_api_pb2.WindowingStrategy) -> bool:
    """Beam's `Windowing.is_default()`: what `GroupingBuffer` lists without a trigger driver."""
    return (strategy.window_fn.urn == common_urns.global_windows.urn
            and strategy.trigger.WhichOneof("trigger") == "default"
            and strategy.accumulation_mode == beam_runner_api_pb2.AccumulationMode.DISCARDING
            and strategy.output_time == beam_runner_api_pb2.OutputTime.END_OF_WINDOW
            and strategy.allowed_lateness == 0)


def groups_by_window(strategy: beam_runner_api_pb2.WindowingStrategy) -> bool:
    """Whether batch groups a GroupByKey of this windowing per window itself: the default
    trigger fires each window once, so Beam's trigger driver adds nothing. The trivial global
    windowing keeps `GroupingBuffer`'s own list (its pane is the last, the driver's is not)."""
    return strategy.trigger.WhichOneof("trigger") == "default" and not is_trivial(strategy)


def columnar_coders(grouping: Grouping, ctx: Any
                    ) -> tuple[coders.WindowedValueCoder, coders.Coder, coders.Coder] | None:
    """The (pre-grouping, key, value) coders of a GroupByKey that batch groups from Arrow
    columns (`engine/keyed_columns.py`): the trivial global windowing, a windowed KV in and a
    windowed KV of the key and an iterable of the same values out, Beam's own windowed value
    encoding. None for any other: those go row by row (`engine/grouping.py`). Prepare asks
    it too, to pack such a grouping's input (`plan/packed_rows.py`)."""
    if grouping.by_window or not ctx.windowing_strategies[
            grouping.windowing_strategy_id].is_default():
        return None
    pre, post = ctx.coders[grouping.input_coder_id], ctx.coders[grouping.output_coder_id]
    if not (isinstance(pre, coders.WindowedValueCoder)
            and isinstance(post, coders.WindowedValueCoder)
            and isinstance(pre.window_coder, coders.GlobalWindowCoder)
            and isinstance(post.window_coder, coders.GlobalWindowCoder)
            and type(pre.get_impl()) is WindowedValueCoderImpl):
        return None
    found = _kv_coders(pre, post)
    return None if found is None else (pre, *found)


def _kv_coders(pre: coders.WindowedValueCoder, post: coders.WindowedValueCoder
               ) -> tuple[coders.Coder, coders.Coder] | None:
    """The key and value coders of a GroupByKey of a windowed KV in and a windowed KV of the
    key and an iterable of the same values out."""
    kv, grouped = pre.wrapped_value_coder, post.wrapped_value_coder
    if not (isinstance(kv, coders.TupleCoder) and isinstance(grouped, coders.TupleCoder)
            and len(kv.coders()) == 2 and len(grouped.coders()) == 2):
        return None
    key, value = kv.coders()
    post_key, values = grouped.coders()
    if not (post_key == key and isinstance(values, coders.IterableCoder)
            and values.value_coder() == value):
        return None
    return key, value


def session_coders(grouping: Grouping, ctx: Any
                   ) -> tuple[coders.WindowedValueCoder, coders.Coder, coders.Coder] | None:
    """The (pre-grouping, key, value) coders of a GroupByKey whose input batch shuffles as
    session rows (`engine/session_rows.py`):
    grouped per window, under Beam's own Sessions of a gap of a millisecond or more (so no
    window Beam's coder gives back is empty), the end-of-window output time (so no element's
    timestamp counts), Beam's own windowed value encoding of a KV, its windows coded as
    `window_layout` takes. None for any other."""
    if not grouping.by_window:
        return None
    windowing = ctx.windowing_strategies[grouping.windowing_strategy_id]
    fn = windowing.windowfn
    if not (type(fn) is window.Sessions and fn.gap_size.micros >= 1000
            and windowing.timestamp_combiner == window.TimestampCombiner.OUTPUT_AT_EOW):
        return None
    pre, post = ctx.coders[grouping.input_coder_id], ctx.coders[grouping.output_coder_id]
    if not (type(pre) is coders.WindowedValueCoder and isinstance(post, coders.WindowedValueCoder)
            and type(pre.get_impl()) is WindowedValueCoderImpl
            and type(pre.timestamp_coder) is coders.TimestampCoder
            and window_layout(pre.window_coder) is not None):
        return None
    found = _kv_coders(pre, post)
    return None if found is None else (pre, *found)


def window_layout(coder: coders.Coder) -> tuple[int, bool] | None:
    """Where an interval window's end lies in a windowed value of `coder`'s windows (after
    the timestamp, the window count, and the max-timestamp prefix and window length where
    there are), and whether a length comes before it: `IntervalWindowCoder`, alone or under
    Beam's `TimestampPrefixingWindowCoder`, itself length-prefixed or not. None otherwise."""
    if type(coder) is coders.IntervalWindowCoder:
        return 12, False
    if type(coder) is not coders.TimestampPrefixingWindowCoder:
        return None
    (inner,) = coder._get_component_coders()  # noqa: SLF001 - its one component
    length = type(inner) is coders.LengthPrefixCoder
    if length:
        inner = inner.value_coder()
    if type(inner) is not coders.IntervalWindowCoder:
        return None
    return (21, True) if length else (20, False)


def grouping_decisions(plan: Plan) -> tuple[str, ...]:
    """The path of each windowed GroupByKey, one line each for the job's log (the global
    window's are Beam's list, or its pass-through driver for Reshuffle's trigger, in every Create
    of several elements: not worth a line each)."""
    comps = beam_runner_api_pb2.Components.FromString(plan.components)
    out: list[str] = []
    # An unlifted combine's GroupByKey has two buffers, of which a stage reads one.
    packed = {g.transform_id for b, g in plan.groupings.items() if b in plan.packed}
    session_rows = {g.transform_id for g in plan.groupings.values() if g.session_rows}
    for grouping in sorted(plan.groupings.values(), key=lambda g: g.transform_id):
        strategy = comps.windowing_strategies[grouping.windowing_strategy_id]
        if out and out[-1].startswith(f"{grouping.transform_id}: "):
            continue  # an unlifted combine's GroupByKey is listed under two ids
        if grouping.by_window:
            out.append(f"{grouping.transform_id}: grouped per window by the runner (default "
                       "trigger: one on-time pane per window)" + (
                           "; its input shuffled as session rows (window bounds and values, "
                           "several of a key's a row)" if grouping.transform_id in session_rows else
                           "; its input shuffled several of a key's elements a row"
                           if grouping.transform_id in packed else ""))
        elif grouping.counted:
            out.append(f"{grouping.transform_id}: grouped from columns by the runner (the "
                       "global window); its input shuffled as counted values, several of a "
                       "key's a row")
        elif strategy.window_fn.urn != common_urns.global_windows.urn:
            out.append(f"{grouping.transform_id}: Beam's trigger driver (trigger "
                       f"{strategy.trigger.WhichOneof('trigger')})")
    return tuple(out)


def merging_combines(comps: beam_runner_api_pb2.Components) -> list[str]:
    """The CombinePerKeys whose input windows still need merging (their unique names)."""
    out = []
    for transform in comps.transforms.values():
        if transform.spec.urn != common_urns.composites.COMBINE_PER_KEY.urn:
            continue
        if len(transform.inputs) != 1 or not transform.subtransforms:
            continue
        (pcoll,) = transform.inputs.values()
        strategy = comps.windowing_strategies[comps.pcollections[pcoll].windowing_strategy_id]
        if strategy.merge_status == beam_runner_api_pb2.MergeStatus.NEEDS_MERGE:
            out.append(transform.unique_name)
    return sorted(out)


def lift_combiners_unless_merging(stages: Iterable[Any], context: Any) -> Iterator[Any]:
    """Beam's `lift_combiners` phase, except for the CombinePerKeys of `merging_combines`,
    which become their subtransforms' stages (Beam's own unlifted expansion)."""
    merging = set(merging_combines(context.components))
    for stage in stages:
        transform = stage.transforms[0] if len(stage.transforms) == 1 else None
        if transform is None or transform.unique_name not in merging:
            yield from translations.lift_combiners([stage], context)
            continue
        for sub in transform.subtransforms:
            part = context.components.transforms[sub]
            yield translations.Stage(
                part.unique_name, [part], downstream_side_inputs=stage.downstream_side_inputs,
                must_follow=stage.must_follow, parent=stage.name, environment=stage.environment)


def unlifted_decisions(comps: beam_runner_api_pb2.Components) -> tuple[str, ...]:
    """A log line for each CombinePerKey left unlifted."""
    return tuple(f"{name}: combined after its GroupByKey, not lifted (merging windows: a "
                 "pre-combine would hold one accumulator per element)"
                 for name in merging_combines(comps))
