"""A streaming GroupByKey for one key: Beam's own trigger driver over a state blob (no pyspark).

Beam decides the panes: `GeneralTriggerDriver` with the transform's windowing strategy (window
function, trigger, accumulation mode, allowed lateness, timestamp combiner) keeps its per-window
state and timers in an `InMemoryUnmergedState`; between micro-batches that state lives as one
pickled blob per key in Spark's state store. Values are kept encoded (the driver never looks
into them), so any coder's values survive the blob. Late data is judged by the driver (Beam's
rule: a window expires when the input watermark passes its end plus the allowed lateness).
"""
from __future__ import annotations

import collections
import pickle
from collections.abc import Iterable
from typing import Any

from apache_beam.transforms import trigger
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp

from sparkbeam.engine.context import pipeline_context
from sparkbeam.engine.timers import timer_rounds
from sparkbeam.plan.model import Grouping
from sparkbeam.streaming.script import MAX_MICROS, MIN_MICROS, Pending



class RunnerClock:
    """The processing time the trigger driver reads (AfterProcessingTime), set per batch."""

    def __init__(self) -> None:
        self.now = Timestamp(0)

    def time(self) -> float:
        return float(self.now)


def to_timestamp(micros: int) -> Timestamp:
    if micros >= MAX_MICROS:
        return MAX_TIMESTAMP
    return Timestamp(micros=max(micros, MIN_MICROS))


def load_state(blob: bytes | None) -> trigger.InMemoryUnmergedState:
    state = trigger.InMemoryUnmergedState()
    if blob:
        saved = pickle.loads(blob)
        for window, timers in saved["timers"].items():
            state.timers[window] = timers
        for window, tags in saved["state"].items():
            for tag, value in tags.items():
                state.state[window][tag] = value
        state.global_state = saved["global"]
    return state


def dump_state(state: trigger.InMemoryUnmergedState) -> bytes | None:
    """The blob to keep, or None when the key holds nothing (its state is cleared)."""
    timers = {w: dict(t) for w, t in state.timers.items() if t}
    tags = {w: dict(t) for w, t in state.state.items() if t}
    if not timers and not tags:
        return None  # global state only holds the window-id bookkeeping of windows now gone
    return pickle.dumps({"timers": timers, "state": tags, "global": state.global_state},
                        protocol=pickle.HIGHEST_PROTOCOL)


def has_timers(state: trigger.InMemoryUnmergedState) -> bool:
    return any(state.timers.values())


def pending_of(state: trigger.InMemoryUnmergedState, hold: int = MAX_MICROS) -> Pending | None:
    """What the key waits for: its earliest trigger timers per time domain and `hold` (the
    earliest output time of its pending panes, when the GroupByKey holds downstream); None
    when it has neither."""
    if not has_timers(state) and hold >= MAX_MICROS:
        return None
    event = processing = MAX_MICROS
    for timers in state.timers.values():
        for (_name, domain, _tag), timestamp in timers.items():
            micros = min(MAX_MICROS, int(Timestamp.of(timestamp).micros))
            if domain == TimeDomain.WATERMARK:
                event = min(event, micros)
            else:
                processing = min(processing, micros)
    return Pending(event=event, processing=processing, hold=hold)


def earliest_hold(state: trigger.InMemoryUnmergedState) -> int:
    """The earliest output time the key's pending panes will carry (the watermark holds Beam's
    trigger driver keeps per window), in micros; MAX_MICROS when it holds none."""
    hold = state.get_earliest_hold()
    return MAX_MICROS if hold >= MAX_TIMESTAMP else int(hold.micros)


_WITHOUT_EXTRACTION = trigger._CombiningValueStateTag.without_extraction
# (tag name, id of its CombineFn) -> (that CombineFn, the twin): sub-triggers make prefixed
# copies of their tags per call, with the same name and CombineFn each time.
_TWINS: dict[tuple[str, int], tuple[Any, Any]] = {}


def _memoized_without_extraction(tag: Any) -> Any:
    key = (tag.tag, id(tag.combine_fn))
    found = _TWINS.get(key)
    if found is None or found[0] is not tag.combine_fn:
        if len(_TWINS) > 4096:
            _TWINS.clear()
        found = _TWINS[key] = (tag.combine_fn, _WITHOUT_EXTRACTION(tag))
    return found[1]


def memoize_without_extraction() -> None:
    """Beam's `MergeableStateAdapter` asks a combining state tag (AfterCount's count, the pane
    index) for its non-extracting twin on every read and write of it, and the tag builds a new
    CombineFn class each time: a quarter of a key's time in this GroupByKey. The twin depends
    on the tag's name and CombineFn alone, so here it is made once per pair."""
    trigger._CombiningValueStateTag.without_extraction = (  # type: ignore[method-assign]
        _memoized_without_extraction)


class KeyGrouper:
    """Everything to group one key's values of one GroupByKey; built once per process."""

    def __init__(self, grouping: Grouping, components: bytes) -> None:
        memoize_without_extraction()
        self.transform_id = grouping.transform_id
        ctx = pipeline_context(components)
        pre = ctx.coders[grouping.input_coder_id]
        self._pre = pre.get_impl()
        self._key = pre.key_coder().get_impl()
        kv = pre.wrapped_value_coder
        self._value = kv.coders()[1].get_impl()
        self._post = ctx.coders[grouping.output_coder_id].get_impl()
        self.clock = RunnerClock()
        windowing = ctx.windowing_strategies[grouping.windowing_strategy_id]
        self.allowed_lateness = windowing.allowed_lateness
        self.merging = windowing.windowfn.is_merging()
        self.driver = trigger.create_trigger_driver(windowing, is_batch=False, clock=self.clock)

    def process(
        self,
        key: bytes,
        state: trigger.InMemoryUnmergedState,
        elements: Iterable[bytes],
        watermark_before: int,
        watermark: int,
        processing_before: int,
        processing: int,
    ) -> list[bytes]:
        """One micro-batch of the key: its elements arrive at the watermark before the batch,
        then the timers the batch's watermark and processing time allow fire."""
        out: list[bytes] = []
        decoded_key: list[Any] = []
        before, after = to_timestamp(watermark_before), to_timestamp(watermark)
        processing_at_start = to_timestamp(processing_before)
        processing_at_end = to_timestamp(processing)
        self.clock.now = processing_at_start
        self._fire(key, decoded_key, state, before, processing_at_start, out)
        values = []
        for data in elements:
            wv = self._pre.decode_nested(data)
            values.append(wv.with_value(self._value.encode_nested(wv.value[1])))
        if values:
            for pane in self.driver.process_elements(state, values, before, before):
                out.append(self._encode(key, decoded_key, pane))
        self.clock.now = processing_at_end
        self._fire(key, decoded_key, state, after, processing_at_end, out)
        self._collect_garbage(state, after)
        return out

    def _collect_garbage(self, state: trigger.InMemoryUnmergedState, watermark: Timestamp) -> None:
        """Drops windows the watermark has passed by more than the allowed lateness: their last
        pane has fired and any element for them is dropped as too late (Beam's rule), so their
        state would otherwise only grow (Beam's trigger driver keeps it)."""
        if self.merging:
            # A late element may still merge into an expired session (Beam's driver and
            # DirectRunner do so), so merging windows keep their state.
            return
        adapter = trigger.MergeableStateAdapter(state)
        expired = [w for w in adapter.known_windows()
                   if watermark > w.end + self.allowed_lateness]
        for window in expired:
            for window_id in adapter.window_ids.pop(window):
                state.state.pop(window_id, None)
                state.timers.pop(window_id, None)
        if expired:
            adapter._persist_window_ids()

    def _fire(
        self,
        key: bytes,
        decoded_key: list[Any],
        state: trigger.InMemoryUnmergedState,
        watermark: Timestamp,
        processing: Timestamp,
        out: list[bytes],
    ) -> None:
        for _ in timer_rounds(f"the trigger timers of GroupByKey {self.transform_id!r}"):
            due, _ = state.get_timers(clear=True, watermark=watermark, processing_time=processing)
            if not due:
                return
            for window, (name, domain, timestamp, _tag) in due:
                for pane in self.driver.process_timer(window, name, domain, timestamp, state,
                                                      watermark):
                    out.append(self._encode(key, decoded_key, pane))

    def _encode(self, key: bytes, decoded_key: list[Any], pane: Any) -> bytes:
        if not decoded_key:
            decoded_key.append(self._key.decode_nested(key))
        values = [self._value.decode_nested(v) for v in pane.value]
        return self._post.encode_nested(pane.with_value((decoded_key[0], values)))


_GROUPERS: dict[tuple[str, int], KeyGrouper] = collections.OrderedDict()


def grouper(grouping: Grouping, components: bytes) -> KeyGrouper:
    cache_key = (grouping.transform_id, hash(components))
    found = _GROUPERS.get(cache_key)
    if found is None:
        if len(_GROUPERS) > 32:
            _GROUPERS.clear()
        found = _GROUPERS[cache_key] = KeyGrouper(grouping, components)
    return found
