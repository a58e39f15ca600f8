"""A stage's pending timers: collected from its bundles, fired in order, within one round limit.

`TimerBook` is the only place timers are kept and chosen to fire, for batch and streaming:

- A bundle writes timers (set or cleared); `collect` decodes them into the book, one pending
  timer per (user key, dynamic tag, window) and family, the latest write winning.
- `take_due(limits, ordering)` is one round: per user key, the timers that fire first among
  those the limits allow (event-time timers at or before `limits.event`, processing-time ones
  at or before `limits.processing`). Batch finishes a key with every limit at the end of time
  and fires its event-time timers before its processing-time ones (`EVENT_TIME_FIRST`; Beam
  leaves the order between domains open, and FnApiRunner fired a processing-time timer first
  in a differential test on 2026-11-26); streaming fires a key's earliest timer first whatever
  its domain (`BY_TIME`, as the DirectRunner does).
- Firing may set timers again; the caller runs each round's bundles and collects what they
  wrote before the next round. A loop that keeps re-arming ends after `MAX_TIMER_ROUNDS` with
  `TimerLoopError` naming the stage (every timer loop uses `timer_rounds`, the trigger
  driver's too).
- `waiting()` says what the pending timers wait for (earliest event and processing time, and
  the hold: the earliest output timestamp they will emit at).
"""
from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from apache_beam.coders.coder_impl import create_InputStream, create_OutputStream
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.transforms import userstate
from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp

from sparkbeam.engine.program import TimerFamilyId
from sparkbeam.errors import ExecutionError

MAX_TIMER_ROUNDS = 1_000_000
EVENT_TIME = beam_runner_api_pb2.TimeDomain.EVENT_TIME
MAX_MICROS = MAX_TIMESTAMP.micros

Ident = tuple[bytes, Any, Any]  # (encoded user key, dynamic timer tag, window)
Pending = dict[TimerFamilyId, dict[Ident, userstate.Timer]]


class TimerLoopError(ExecutionError):
    """Timers kept setting timers past the round limit."""


class Ordering(enum.Enum):
    """Which of a key's due timers fire first (see the module doc)."""

    EVENT_TIME_FIRST = "event-time timers first, each domain by time"
    BY_TIME = "by fire time, whatever the domain"


@dataclass(frozen=True)
class Limits:
    """How far each time domain has advanced: what is at or before it may fire."""

    event: Timestamp
    processing: Timestamp


#: Everything fires: a finished key in batch, or a streaming job at its final watermark.
ALL = Limits(MAX_TIMESTAMP, MAX_TIMESTAMP)


@dataclass(frozen=True)
class TimerWait:
    """What pending timers wait for, in micros (MAX_MICROS: nothing in that domain)."""

    event: int
    processing: int
    hold: int  # the earliest output timestamp they will emit at


def timer_rounds(what: str) -> Iterator[int]:
    """Round numbers for a firing loop; raises `TimerLoopError` naming `what` past the limit."""
    yield from range(MAX_TIMER_ROUNDS)
    raise TimerLoopError(f"{what} kept re-arming for {MAX_TIMER_ROUNDS} rounds")


class TimerBook:
    """The pending timers of one stage run (a batch task, or one key's micro-batch)."""

    def __init__(
        self,
        impls: Mapping[TimerFamilyId, Any],
        domains: Mapping[TimerFamilyId, int],
        pending: Pending | None = None,
    ) -> None:
        self._impls = impls
        self._domains = domains
        self.pending: Pending = {f: dict(p) for f, p in (pending or {}).items()}

    def has_pending(self) -> bool:
        """Whether any timer waits (deliberately not `__bool__`: an empty book is a book)."""
        return any(self.pending.values())

    def collect(self, written: Mapping[TimerFamilyId, list[bytes]]) -> None:
        """Applies the timers a bundle set or cleared.

        A write whose bytes repeat the write before it is skipped undecoded: the same bytes
        decode to the same timer over the same length (each part of Beam's timer encoding
        ends itself), and writing a timer again changes nothing. That is the common case of a
        DoFn setting one timer per element (a key's elements run one after another), where
        decoding every write cost ~16 % of a stateful stage (bench/ANALYSIS.md)."""
        for family, chunks in written.items():
            impl = self._impls[family]
            key_impl = impl._key_coder_impl
            pending = self.pending.setdefault(family, {})
            for chunk in chunks:
                stream = create_InputStream(chunk)
                total = len(chunk)
                last = b""
                while True:
                    left = stream.size()
                    if not left:
                        break
                    start = total - left
                    if last and chunk.startswith(last, start):
                        stream.read(len(last))
                        continue
                    timer = impl.decode_from_stream(stream, True)
                    last = chunk[start:total - stream.size()]
                    ident = (
                        key_impl.encode_nested(timer.user_key),
                        timer.dynamic_timer_tag,
                        timer.windows[0] if timer.windows else None,
                    )
                    if timer.clear_bit:
                        pending.pop(ident, None)
                    else:
                        pending[ident] = timer

    def take_due(
        self, limits: Limits, ordering: Ordering
    ) -> dict[TimerFamilyId, list[userstate.Timer]]:
        """One round: removes and returns, per key, the due timers that fire first."""
        due: list[tuple[tuple, TimerFamilyId, Ident]] = []
        for family, pending in self.pending.items():
            domain = self._domains[family]
            limit = limits.event if domain == EVENT_TIME else limits.processing
            for ident, timer in pending.items():
                when = timer.fire_timestamp
                if when is None or when > limit:
                    continue
                order = (domain, when) if ordering is Ordering.EVENT_TIME_FIRST else (when,)
                due.append((order, family, ident))
        first: dict[bytes, tuple] = {}
        for order, _family, ident in due:
            if ident[0] not in first or order < first[ident[0]]:
                first[ident[0]] = order
        firing: dict[TimerFamilyId, list[userstate.Timer]] = {}
        for order, family, ident in due:
            if order == first[ident[0]]:
                firing.setdefault(family, []).append(self.pending[family].pop(ident))
        return firing

    def bundles(
        self, firing: Mapping[TimerFamilyId, list[userstate.Timer]], bundle_size: int
    ) -> Iterator[list[beam_fn_api_pb2.Elements.Timers]]:
        """The timers of one round as bundles of at most `bundle_size` timers."""
        batch: list[beam_fn_api_pb2.Elements.Timers] = []
        count = 0
        for (transform_id, family_id), timers in firing.items():
            impl = self._impls[(transform_id, family_id)]
            for start in range(0, len(timers), bundle_size):
                out = create_OutputStream()
                part = timers[start:start + bundle_size]
                for timer in part:
                    impl.encode_to_stream(timer, out, True)
                batch.append(beam_fn_api_pb2.Elements.Timers(
                    transform_id=transform_id, timer_family_id=family_id, timers=out.get()))
                count += len(part)
                if count >= bundle_size:
                    yield batch
                    batch, count = [], 0
        if batch:
            yield batch

    def snapshot(self) -> Pending:
        """The pending timers, families with none left out (what a key keeps between runs)."""
        return {f: dict(p) for f, p in self.pending.items() if p}

    def waiting(self) -> TimerWait | None:
        """What the pending timers wait for; None when there are none. A timer set without an
        output timestamp holds at its fire time, as Beam sets it."""
        if not self.has_pending():
            return None
        event = processing = hold = MAX_MICROS
        for family, pending in self.pending.items():
            for timer in pending.values():
                mark = timer.hold_timestamp if timer.hold_timestamp is not None else (
                    timer.fire_timestamp)
                if mark is not None:
                    hold = min(hold, mark.micros)
                if timer.fire_timestamp is None:
                    continue
                if self._domains[family] == EVENT_TIME:
                    event = min(event, timer.fire_timestamp.micros)
                else:
                    processing = min(processing, timer.fire_timestamp.micros)
        return TimerWait(event, processing, hold)
