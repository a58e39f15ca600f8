"""Workload definitions: sizes per scale, seeded data generation and the
expected answer of each workload, computed directly in Python/NumPy.

A generated data set lives in ``<data_dir>/<name>-<size>-s<seed>-v<N>/`` as
text shards ``part-0000i.txt`` (plus ``table.txt`` for the side-input join),
an ``expected.pkl`` holding ``{KEY: VALUE}`` output-line pairs, and a
``DONE`` marker; complete data sets are reused by later invocations.
"""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from bench import records

#: Bump when the generators change, so that cached data sets are rebuilt.
GEN_VERSION = 1
#: Every input is split into this many text files.
N_SHARDS = 4
#: Records generated (and formatted) per NumPy chunk.
CHUNK = 1_000_000
MB = 1_000_000


@dataclass(frozen=True)
class Workload:
    """A benchmark workload and its sizes at each scale."""

    name: str
    title: str
    unit: str  # "bytes" or "elements"
    sizes: dict[str, tuple[int, ...]] = field(hash=False)

    @property
    def warmup_size(self) -> int:
        """A tiny size for the untimed warm-up job of each session."""
        return 20_000 if self.unit == "bytes" else 1_000

    def size_label(self, size: int) -> str:
        """Human-readable size, e.g. ``50 MB`` or ``1M``."""
        if self.unit == "bytes":
            return f"{size / MB:g} MB"
        for div, suffix in ((1_000_000, "M"), (1_000, "k")):
            if size >= div and size % (div // 10) == 0:
                return f"{size / div:g}{suffix}"
        return str(size)


#: Quick sizes are a smoke test (fixed overheads dominate; only word count
#: gets a 1x/2x/4x series); full sizes are the issue's, as 1x/10x/100x series
#: so that every workload gets a fitted scaling exponent.
WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "wordcount",
            "Word count (Zipf words)",
            "bytes",
            {"quick": (MB // 2, MB, 2 * MB), "full": (5 * MB, 50 * MB, 500 * MB)},
        ),
        Workload(
            "combine",
            "CombinePerKey(sum), 10k int keys",
            "elements",
            {"quick": (50_000,), "full": (500_000, 5_000_000, 50_000_000)},
        ),
        Workload(
            "gbk_skew",
            "GroupByKey, 30% hot key, per-key sort",
            "elements",
            {"quick": (50_000,), "full": (100_000, 1_000_000, 10_000_000)},
        ),
        Workload(
            "side_input",
            "Side-input join, 100k-entry AsDict",
            "elements",
            {"quick": (50_000,), "full": (100_000, 1_000_000, 10_000_000)},
        ),
        Workload(
            "sessions",
            "Sessions windowing (gap 600 s)",
            "elements",
            {"quick": (20_000,), "full": (10_000, 100_000, 1_000_000)},
        ),
        Workload(
            "stateful",
            "Stateful DoFn: bag state + event-time timer",
            "elements",
            {"quick": (20_000,), "full": (10_000, 100_000, 1_000_000)},
        ),
    )
}


@dataclass(frozen=True)
class Dataset:
    """A generated data set: input globs by name and the expected answer."""

    workload: str
    size: int
    directory: str
    inputs: dict[str, str] = field(hash=False)

    @property
    def expected_path(self) -> str:
        return os.path.join(self.directory, "expected.pkl")

    def load_expected(self) -> dict[str, str]:
        with open(self.expected_path, "rb") as f:
            return pickle.load(f)


def _inputs(name: str, directory: str) -> dict[str, str]:
    inputs = {"main": os.path.join(directory, "part-*.txt")}
    if name == "side_input":
        inputs["table"] = os.path.join(directory, "table.txt")
    return inputs


def dataset(name: str, size: int, data_dir: str, seed: int) -> Dataset:
    """Returns the data set for ``name`` at ``size``, generating it if needed."""
    directory = os.path.join(data_dir, f"{name}-{size}-s{seed}-v{GEN_VERSION}")
    if not os.path.exists(os.path.join(directory, "DONE")):
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        rng = np.random.default_rng([seed, sum(map(ord, name)), size])
        expected = _GENERATORS[name](rng, size, directory)
        with open(os.path.join(directory, "expected.pkl"), "wb") as f:
            pickle.dump(expected, f, protocol=pickle.HIGHEST_PROTOCOL)
        open(os.path.join(directory, "DONE"), "w").close()
    return Dataset(name, size, directory, _inputs(name, directory))


class _ShardWriter:
    """Writes text chunks round-robin over ``N_SHARDS`` files."""

    def __init__(self, directory: str) -> None:
        self._files = [
            open(os.path.join(directory, f"part-{i:05d}.txt"), "w")  # noqa: SIM115 - closed in close()
            for i in range(N_SHARDS)
        ]
        self._next = 0
        self.bytes = 0

    def write(self, lines: list[str]) -> None:
        text = "\n".join(lines) + "\n"
        self._files[self._next].write(text)
        self._next = (self._next + 1) % N_SHARDS
        self.bytes += len(text)

    def close(self) -> None:
        for f in self._files:
            f.close()


def _int_bincount(keys: np.ndarray, weights: np.ndarray, n: int) -> np.ndarray:
    """Exact integer per-key sums (float64 is exact below 2**53, ample here)."""
    return np.rint(np.bincount(keys, weights=weights, minlength=n)).astype(np.int64)


def _chunks(total: int, chunk: int = CHUNK) -> Iterator[int]:
    while total > 0:
        yield min(chunk, total)
        total -= chunk


def _wordcount(rng: np.random.Generator, size: int, directory: str) -> dict[str, str]:
    """~``size`` bytes of 12-word lines over a 50k-word Zipf(1.1) vocabulary."""
    vocab_size, words_per_line = 50_000, 12
    lengths = rng.integers(3, 11, size=vocab_size)
    letters = rng.integers(0, 26, size=int(lengths.sum()))
    vocab: list[str] = []
    seen: set[str] = set()
    pos = 0
    for n in lengths.tolist():
        word = "".join(chr(97 + c) for c in letters[pos : pos + n].tolist())
        pos += n
        if word in seen:  # keep ranks unique; collisions are rare
            word += f"q{len(vocab)}"
        seen.add(word)
        vocab.append(word)
    probs = 1.0 / np.arange(1, vocab_size + 1) ** 1.1
    probs /= probs.sum()
    words = np.array(vocab, dtype=object)
    counts = np.zeros(vocab_size, dtype=np.int64)
    writer = _ShardWriter(directory)
    while writer.bytes < size:
        lines = int(min(20_000, max(100, (size - writer.bytes) // 80)))
        idx = rng.choice(vocab_size, size=words_per_line * lines, p=probs)
        counts += np.bincount(idx, minlength=vocab_size)
        rows = words[idx].reshape(-1, words_per_line).tolist()
        writer.write([" ".join(row) for row in rows])
    writer.close()
    return {vocab[i]: str(c) for i, c in enumerate(counts.tolist()) if c}


def _combine(rng: np.random.Generator, size: int, directory: str) -> dict[str, str]:
    """``key,value`` lines: keys uniform over 10k, values in [0, 1000)."""
    n_keys = 10_000
    sums = np.zeros(n_keys, dtype=np.int64)
    seen = np.zeros(n_keys, dtype=np.int64)
    writer = _ShardWriter(directory)
    for n in _chunks(size):
        keys = rng.integers(0, n_keys, size=n)
        values = rng.integers(0, 1000, size=n)
        sums += _int_bincount(keys, values, n_keys)
        seen += np.bincount(keys, minlength=n_keys)
        writer.write([f"{k},{v}" for k, v in zip(keys.tolist(), values.tolist(), strict=True)])
    writer.close()
    return {str(k): str(s) for k, s in enumerate(sums.tolist()) if seen[k]}


def _group_summaries(keys: np.ndarray, values: np.ndarray) -> dict[str, str]:
    """``{key: sorted_summary(values of key)}`` via one NumPy lexsort."""
    order = np.lexsort((values, keys))
    keys, values = keys[order], values[order]
    bounds = np.flatnonzero(np.diff(keys)) + 1
    out: dict[str, str] = {}
    for ks, vs in zip(np.split(keys, bounds), np.split(values, bounds), strict=True):
        if len(ks):
            out[str(int(ks[0]))] = records.sorted_summary(vs.tolist())
    return out


def _gbk_skew(rng: np.random.Generator, size: int, directory: str) -> dict[str, str]:
    """``key,value`` lines: key 0 holds 30% of values, the rest spread over 1..9999."""
    all_keys, all_values = [], []
    writer = _ShardWriter(directory)
    for n in _chunks(size):
        hot = rng.random(n) < 0.3
        keys = np.where(hot, 0, rng.integers(1, 10_000, size=n))
        values = rng.integers(0, 1_000_000_000, size=n)
        all_keys.append(keys)
        all_values.append(values)
        writer.write([f"{k},{v}" for k, v in zip(keys.tolist(), values.tolist(), strict=True)])
    writer.close()
    return _group_summaries(np.concatenate(all_keys), np.concatenate(all_values))


def _side_input(rng: np.random.Generator, size: int, directory: str) -> dict[str, str]:
    """``table.txt``: 100k ``key,value`` entries; shards: ``id,key`` elements."""
    table_size = 100_000
    table = rng.integers(0, 1_000_000, size=table_size)
    with open(os.path.join(directory, "table.txt"), "w") as f:
        f.write("".join(f"{k},{v}\n" for k, v in enumerate(table.tolist())))
    sums = np.zeros(records.JOIN_BUCKETS, dtype=np.int64)
    writer = _ShardWriter(directory)
    start = 0
    for n in _chunks(size):
        ids = np.arange(start, start + n)
        keys = rng.integers(0, table_size, size=n)
        sums += _int_bincount(ids % records.JOIN_BUCKETS, table[keys], records.JOIN_BUCKETS)
        writer.write([f"{i},{k}" for i, k in zip(ids.tolist(), keys.tolist(), strict=True)])
        start += n
    writer.close()
    return {
        str(b): str(s) for b, s in enumerate(sums.tolist()) if b < min(size, records.JOIN_BUCKETS)
    }


def _events(
    rng: np.random.Generator, size: int, directory: str, max_value: int
) -> tuple[np.ndarray, ...]:
    """``key,ts,value`` lines; about 100 events per key over ``TIME_SPAN_S``."""
    n_keys = max(10, size // 100)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    writer = _ShardWriter(directory)
    for n in _chunks(size):
        keys = rng.integers(0, n_keys, size=n)
        ts = rng.integers(0, records.TIME_SPAN_S, size=n)
        values = rng.integers(0, max_value, size=n)
        parts.append((keys, ts, values))
        writer.write(
            [
                f"{k},{t},{v}"
                for k, t, v in zip(keys.tolist(), ts.tolist(), values.tolist(), strict=True)
            ]
        )
    writer.close()
    return tuple(np.concatenate(col) for col in zip(*parts, strict=True))


def _sessions(rng: np.random.Generator, size: int, directory: str) -> dict[str, str]:
    keys, ts, values = _events(rng, size, directory, 1000)
    order = np.lexsort((ts, keys))
    keys, ts, values = keys[order], ts[order], values[order]
    bounds = np.flatnonzero(np.diff(keys)) + 1
    out: dict[str, str] = {}
    for ks, t, v in zip(
        np.split(keys, bounds), np.split(ts, bounds), np.split(values, bounds), strict=True
    ):
        if len(ks):
            line_kv = (int(ks[0]), list(zip(t.tolist(), v.tolist(), strict=True)))
            for line in records.session_lines(line_kv):
                key, value = line.split("\t")
                out[key] = value
    return out


def _stateful(rng: np.random.Generator, size: int, directory: str) -> dict[str, str]:
    keys, _, values = _events(rng, size, directory, 1_000_000_000)
    return _group_summaries(keys, values)


_GENERATORS: dict[str, Callable[[np.random.Generator, int, str], dict[str, str]]] = {
    "wordcount": _wordcount,
    "combine": _combine,
    "gbk_skew": _gbk_skew,
    "side_input": _side_input,
    "sessions": _sessions,
    "stateful": _stateful,
}
