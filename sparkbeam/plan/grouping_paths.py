"""How batch groups each GroupByKey's values per key, chosen at planning (no pyspark).

Two paths, both producing exactly what Beam's FnApiRunner produces (`engine/grouping.py` runs
them; its tests hold them equal): *by window* for the default trigger under any windowing but
the trivial global one (fixed, sliding, sessions, custom windows, another timestamp combiner):
each window fires once in batch, so Beam's trigger driver's output is computed directly;
otherwise Beam's own `GroupingBuffer` (and its trigger driver).
"""
from __future__ import annotations

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2

from sparkbeam.plan.model import Plan


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


def grouping_decisions(plan: Plan) -> tuple[str, ...]:
    """The path of each windowed GroupByKey, one line each for the job's log (the global
    window's are Beam's list, or its pass-through driver for Reshuffle's trigger, in every Create
    of several elements: not worth a line each)."""
    comps = beam_runner_api_pb2.Components.FromString(plan.components)
    out = []
    for grouping in sorted(plan.groupings.values(), key=lambda g: g.transform_id):
        strategy = comps.windowing_strategies[grouping.windowing_strategy_id]
        if grouping.by_window:
            out.append(f"{grouping.transform_id}: grouped per window by the runner (default "
                       "trigger: one on-time pane per window)")
        elif strategy.window_fn.urn != common_urns.global_windows.urn:
            out.append(f"{grouping.transform_id}: Beam's trigger driver (trigger "
                       f"{strategy.trigger.WhichOneof('trigger')})")
    return tuple(out)
