"""Per-record functions shared by the Beam pipelines, the hand-written PySpark
jobs and the expected-answer computation.

They live in an importable module (not ``__main__``) so that every runner's
worker processes can unpickle them by reference.

Every workload writes text lines ``KEY<TAB>VALUE``; the checker compares the
set of lines with the expected ``{KEY: VALUE}`` mapping.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Modulus of the order-sensitive checksum (a Mersenne prime).
CHECKSUM_MOD = (1 << 61) - 1
#: Session gap of the sessions workload, in seconds.
SESSION_GAP_S = 600
#: Event timestamps of the sessions/stateful workloads lie in [0, TIME_SPAN_S).
TIME_SPAN_S = 100_000
#: Event time at which the stateful DoFn's timer fires (after every event).
FLUSH_AT_S = TIME_SPAN_S + 1
#: Number of buckets the side-input join sums into.
JOIN_BUCKETS = 100


def format_kv(kv: tuple[object, object]) -> str:
    """Formats a (key, value) pair as an output line."""
    return f"{kv[0]}\t{kv[1]}"


def pair_one(word: str) -> tuple[str, int]:
    """Word count: maps a word to ``(word, 1)``."""
    return (word, 1)


def split_words(line: str) -> list[str]:
    """Word count: splits a line on whitespace."""
    return line.split()


def parse_int_pair(line: str) -> tuple[int, int]:
    """Parses ``"a,b"`` into ``(a, b)``."""
    a, b = line.split(",")
    return (int(a), int(b))


def parse_event(line: str) -> tuple[int, int, int]:
    """Parses ``"key,ts,value"`` into ``(key, ts, value)``."""
    k, ts, v = line.split(",")
    return (int(k), int(ts), int(v))


def sorted_summary(values: Iterable[int]) -> str:
    """Summarises values after sorting them: ``count,min,max,checksum``.

    The checksum weights each value by its rank, so it only matches when the
    values were really sorted (and none lost or duplicated).
    """
    ordered = sorted(values)
    checksum = 0
    for rank, value in enumerate(ordered, start=1):
        checksum = (checksum + rank * value) % CHECKSUM_MOD
    return f"{len(ordered)},{ordered[0]},{ordered[-1]},{checksum}"


def summarise_group(kv: tuple[int, Iterable[int]]) -> tuple[int, str]:
    """GroupByKey workload: sorts one key's values and summarises them."""
    return (kv[0], sorted_summary(kv[1]))


def join_lookup(line: str, table: dict[int, int]) -> tuple[int, int]:
    """Side-input join: looks the element's key up in the side-input dict.

    Input lines are ``"id,key"``; the result is ``(id % JOIN_BUCKETS, value)``.
    """
    ident, key = parse_int_pair(line)
    return (ident % JOIN_BUCKETS, table[key])


def sessionize(
    events: Iterable[tuple[int, int]], gap: int = SESSION_GAP_S
) -> list[tuple[int, int, int, int]]:
    """Splits one user's ``(ts, value)`` events into Beam-style sessions.

    Each event opens the window ``[ts, ts + gap)``; windows that overlap are
    merged. Returns ``(start, end, count, sum)`` per session.
    """
    sessions: list[tuple[int, int, int, int]] = []
    start = end = count = total = 0
    for ts, value in sorted(events):
        if count and ts < end:
            end = max(end, ts + gap)
            count += 1
            total += value
        else:
            if count:
                sessions.append((start, end, count, total))
            start, end, count, total = ts, ts + gap, 1, value
    if count:
        sessions.append((start, end, count, total))
    return sessions


def session_lines(kv: tuple[int, Iterable[tuple[int, int]]]) -> list[str]:
    """Hand-written sessions: one output line per session of one user."""
    user, events = kv
    return [f"{user}@{s}\t{e},{c},{t}" for s, e, c, t in sessionize(events)]
