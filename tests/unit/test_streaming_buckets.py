"""Keys bucketed per Spark grouping key (`streaming/buckets.py`, `operators._KeyedProcessor`):
one state read and write per bucket and batch, timers per bucket, each key run at most once
per batch. Spark's handle and the offset-log clock are fakes; the processor's logic is real."""
from __future__ import annotations

from typing import Any

from pyspark.sql import Row

from sparkbeam.streaming.buckets import bucket_count, dump_entries, load_entries
from sparkbeam.streaming.checkpoint import CheckpointLayout, anything_waiting
from sparkbeam.streaming.operators import _KeyedProcessor
from sparkbeam.streaming.script import EVERY_BATCH, MAX_MICROS, Pending, RunnerTime


class _Handle:
    def __init__(self) -> None:
        self.timers: list[int] = []

    def registerTimer(self, at: int) -> None:  # noqa: N802 - Spark's name
        self.timers.append(at)


class _Value:
    """Spark's value state of one grouping key, counting its calls."""

    def __init__(self) -> None:
        self.value: tuple[bytes] | None = None
        self.calls = {"get": 0, "update": 0, "clear": 0}

    def get(self) -> tuple[bytes] | None:
        self.calls["get"] += 1
        return self.value

    def update(self, value: tuple[bytes]) -> None:
        self.calls["update"] += 1
        self.value = value

    def clear(self) -> None:
        self.calls["clear"] += 1
        self.value = None


class _Clock:
    """Batch b at processing time 1000 b ms; the watermark is the batch number in micros."""

    def at(self, now_ms: int) -> tuple[int, RunnerTime]:
        b = now_ms // 1000
        return b, RunnerTime(b - 1, b, (b - 1) * 1000, b * 1000)


class _Timer:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def getCurrentProcessingTimeInMs(self) -> int:  # noqa: N802 - Spark's name
        return self.now_ms


class _Recorder(_KeyedProcessor):
    """Each key's blob counts its runs; it waits as `waits[key]` says after each run."""

    bucketed = True

    def __init__(self, waits: dict[bytes, Pending | None]) -> None:
        super().__init__("cloudpickle", "/unused")
        self.waits = waits
        self.runs: list[tuple[int, bytes, list[int]]] = []
        self.handle: Any = _Handle()
        self.blob: Any = _Value()
        self.clock: Any = _Clock()
        self.batch = -1
        self.hold = MAX_MICROS
        self._ran = set()
        self._waits_at_end = False

    def _process(self, key: bytes, rows: list[Row], blob: bytes | None, time: RunnerTime
                 ) -> tuple[list[Row], bytes | None, Pending | None]:
        self.runs.append((self.batch, key, [r.value for r in rows]))
        count = int(blob or b"0") + 1
        return [Row(tag=0, key=key, value=count)], str(count).encode(), self.waits.get(key)


def _rows(*pairs: tuple[bytes, int]) -> list[Row]:
    return [Row(tag=0, key=k, value=v) for k, v in pairs]


def test_a_bucket_reads_and_writes_its_state_once_a_batch_however_many_keys_it_touches() -> None:
    p = _Recorder({})
    out = list(p.handleInputRows((7,), iter(_rows((b"a", 1), (b"b", 2), (b"a", 3))),
                                 _Timer(1000)))
    assert [r.value for r in out] == [1, 1]
    assert p.runs == [(1, b"a", [1, 3]), (1, b"b", [2])]
    assert p.blob.calls == {"get": 1, "update": 1, "clear": 0}
    assert load_entries(p.blob.value[0]) == {b"a": (b"1", None), b"b": (b"1", None)}
    assert p.handle.timers == []  # no key waits


def test_due_keys_of_a_touched_bucket_run_with_it_and_the_others_only_hold() -> None:
    due = Pending(event=1, hold=5)
    later = Pending(event=10**9, hold=3)
    p = _Recorder({b"c": due, b"d": later})
    p.blob.value = (dump_entries({b"c": (b"4", due), b"d": (b"9", later)}),)
    list(p.handleInputRows((7,), iter(_rows((b"a", 1))), _Timer(2000)))
    assert [(key, rows) for _, key, rows in p.runs] == [(b"a", [1]), (b"c", [])]
    entries = load_entries(p.blob.value[0])
    assert entries[b"c"] == (b"5", due) and entries[b"d"] == (b"9", later)  # d: not decoded
    assert p.hold == 3
    # The bucket was armed (a key waited): its timer expires this batch and is set then.
    assert p.handle.timers == []
    list(p.handleExpiredTimer((7,), _Timer(2000), None))
    assert len(p.runs) == 2  # c ran this batch already; d is not due
    assert p.handle.timers == [2001]
    assert p.blob.calls["update"] == 1  # woken with nothing to run: nothing written


def test_a_key_runs_at_most_once_a_batch_and_a_bucket_left_empty_is_cleared() -> None:
    p = _Recorder({b"a": EVERY_BATCH})
    list(p.handleInputRows((1,), iter(_rows((b"a", 1))), _Timer(3000)))
    assert p.handle.timers == [3001]  # newly waiting: armed for the next batch
    list(p.handleExpiredTimer((1,), _Timer(3000), None))  # the same batch
    assert [key for _, key, _ in p.runs] == [b"a"]
    p.waits[b"a"] = None
    list(p.handleExpiredTimer((1,), _Timer(4000), None))  # next batch: due, runs, done
    assert [(b, key) for b, key, _ in p.runs] == [(3, b"a"), (4, b"a")]
    assert load_entries(p.blob.value[0]) == {b"a": (b"2", None)}
    p.waits[b"a"] = None
    p._process = lambda key, rows, blob, time: ([], None, None)  # type: ignore[method-assign]
    list(p.handleInputRows((1,), iter(_rows((b"a", 2))), _Timer(5000)))
    assert p.blob.value is None and p.blob.calls["clear"] == 1


def test_entries_round_trip_and_the_bucket_count_follows_the_partitions() -> None:
    entries = {b"k": (b"blob", Pending(1, 2, 3)), b"j": (None, EVERY_BATCH), b"i": (b"x", None)}
    assert load_entries(dump_entries(entries)) == entries
    assert load_entries(None) == {}
    assert bucket_count(2) == 2 * bucket_count(1) > 1


class _EndsAt(_Clock):
    """`_Clock`, with the input over (`RunnerTime.done`) from batch `end` on."""

    def __init__(self, end: int) -> None:
        self.end = end

    def at(self, now_ms: int) -> tuple[int, RunnerTime]:
        b, time = super().at(now_ms)
        return b, RunnerTime(time.watermark_before, time.watermark, time.processing_before,
                             time.processing, done=b >= self.end)


def test_a_task_past_the_end_of_input_that_leaves_a_key_waiting_tells_the_driver(tmp_path
                                                                                  ) -> None:
    """The driver ends a job at the first batch past the end of input after which no key
    waits (`StreamingQueryRun._settled`): a task whose keys still wait then records it, and
    only then."""
    p = _Recorder({b"a": EVERY_BATCH, b"b": None})
    p.layout = CheckpointLayout(str(tmp_path))
    p.clock = _EndsAt(2)
    list(p.handleInputRows((7,), iter(_rows((b"a", 1), (b"b", 2))), _Timer(1000)))
    p.close()
    assert not anything_waiting(p.layout, 1)  # a waits, but the input is not over
    list(p.handleExpiredTimer((7,), _Timer(2000), None))
    p.close()
    assert anything_waiting(p.layout, 2)
    p.waits[b"a"] = None
    list(p.handleExpiredTimer((7,), _Timer(3000), None))
    p.close()
    assert not anything_waiting(p.layout, 3)
    assert [(batch, key) for batch, key, _ in p.runs] == [(1, b"a"), (1, b"b"), (2, b"a"),
                                                          (3, b"a")]
