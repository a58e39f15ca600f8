"""The Beam pipelines of every workload; identical for every Beam runner.

Each builder reads the data set's text inputs and writes ``KEY<TAB>VALUE``
lines with ``WriteToText(out_prefix)``.
"""

from __future__ import annotations

import glob
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp

from bench import records
from bench.workloads import Dataset

IntPair = beam.typehints.Tuple[int, int]


def read_text_file(path: str) -> Iterator[str]:
    """Yields the lines of one text file, without line terminators."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield line.rstrip("\n")


class ReadTextFiles(beam.PTransform):
    """``Create(files matching pattern) | FlatMap(read lines)``.

    Plain-I/O stand-in for ``ReadFromText`` (for runners that cannot
    translate ``Read``); each file is read whole by one task.
    """

    def __init__(self, pattern: str) -> None:
        super().__init__()
        self._pattern = pattern

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        files = sorted(glob.glob(self._pattern))
        return (
            pbegin
            | "Files" >> beam.Create(files)
            | "Lines" >> beam.FlatMap(read_text_file).with_output_types(str)
        )


class WriteLinesPerBundle(beam.DoFn):
    """Plain-I/O stand-in for ``WriteToText``: each bundle writes its lines to
    a new file ``<prefix>-<uuid>`` (no side inputs, no finalize step)."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._file: TextIO | None = None

    def start_bundle(self) -> None:
        self._file = None

    def process(self, line: str) -> None:
        if self._file is None:
            os.makedirs(os.path.dirname(self._prefix) or ".", exist_ok=True)
            path = f"{self._prefix}-{uuid.uuid4().hex}"
            self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in finish_bundle
        self._file.write(f"{line}\n")

    def finish_bundle(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class WriteTextFiles(beam.PTransform):
    """Applies ``WriteLinesPerBundle``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self._prefix = prefix

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return pcoll | "WriteBundles" >> beam.ParDo(WriteLinesPerBundle(self._prefix))


Reader = Callable[[str], beam.PTransform]
#: I/O modes: ``beam`` (``ReadFromText``/``WriteToText``, for every runner
#: that supports them) or ``plain`` (``ReadTextFiles``/``WriteTextFiles``).
IO_MODES: dict[str, tuple[Reader, Callable[[str], beam.PTransform]]] = {
    "beam": (beam.io.ReadFromText, beam.io.WriteToText),
    "plain": (ReadTextFiles, WriteTextFiles),
}


class CountSumFn(beam.CombineFn):
    """Combines ints into ``(count, sum)``."""

    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add_input(self, acc: tuple[int, int], value: int) -> tuple[int, int]:
        return (acc[0] + 1, acc[1] + value)

    def merge_accumulators(self, accs: list[tuple[int, int]]) -> tuple[int, int]:
        count = total = 0
        for c, t in accs:
            count += c
            total += t
        return (count, total)

    def extract_output(self, acc: tuple[int, int]) -> tuple[int, int]:
        return acc


def to_timestamped(line: str) -> window.TimestampedValue:
    """Parses ``key,ts,value`` into ``TimestampedValue((key, value), ts)``."""
    key, ts, value = records.parse_event(line)
    return window.TimestampedValue((key, value), ts)


class FormatSession(beam.DoFn):
    """Formats one session's ``(user, (count, sum))`` with its window bounds."""

    def process(
        self, kv: tuple[int, tuple[int, int]], win: Any = beam.DoFn.WindowParam
    ) -> Iterator[str]:
        user, (count, total) = kv
        start = win.start.micros // 1_000_000
        end = win.end.micros // 1_000_000
        yield f"{user}@{start}\t{end},{count},{total}"


class BufferUntilTimer(beam.DoFn):
    """Buffers each key's values in bag state; an event-time timer flushes them."""

    BUFFER = BagStateSpec("buffer", VarIntCoder())
    FLUSH = TimerSpec("flush", TimeDomain.WATERMARK)  # event time

    def process(
        self,
        kv: tuple[int, int],
        buffer=beam.DoFn.StateParam(BUFFER),
        flush=beam.DoFn.TimerParam(FLUSH),
    ) -> None:
        buffer.add(kv[1])
        flush.set(Timestamp(records.FLUSH_AT_S))

    @on_timer(FLUSH)
    def on_flush(
        self, key=beam.DoFn.KeyParam, buffer=beam.DoFn.StateParam(BUFFER)
    ) -> Iterator[str]:
        values = list(buffer.read())
        buffer.clear()
        yield f"{key}\t{records.sorted_summary(values)}"


def _wordcount(p: beam.Pipeline, ds: Dataset, read: Reader) -> beam.PCollection:
    return (
        p
        | "Read" >> read(ds.inputs["main"])
        | "Split" >> beam.FlatMap(records.split_words).with_output_types(str)
        | "PairOne" >> beam.Map(records.pair_one).with_output_types(beam.typehints.Tuple[str, int])
        | "Sum" >> beam.CombinePerKey(sum)
        | "Format" >> beam.Map(records.format_kv)
    )


def _combine(p: beam.Pipeline, ds: Dataset, read: Reader) -> beam.PCollection:
    return (
        p
        | "Read" >> read(ds.inputs["main"])
        | "Parse" >> beam.Map(records.parse_int_pair).with_output_types(IntPair)
        | "Sum" >> beam.CombinePerKey(sum)
        | "Format" >> beam.Map(records.format_kv)
    )


def _gbk_skew(p: beam.Pipeline, ds: Dataset, read: Reader) -> beam.PCollection:
    return (
        p
        | "Read" >> read(ds.inputs["main"])
        | "Parse" >> beam.Map(records.parse_int_pair).with_output_types(IntPair)
        | "Group" >> beam.GroupByKey()
        | "SortSummarise" >> beam.Map(records.summarise_group)
        | "Format" >> beam.Map(records.format_kv)
    )


def _side_input(p: beam.Pipeline, ds: Dataset, read: Reader) -> beam.PCollection:
    table = (
        p
        | "ReadTable" >> read(ds.inputs["table"])
        | "ParseTable" >> beam.Map(records.parse_int_pair).with_output_types(IntPair)
    )
    return (
        p
        | "Read" >> read(ds.inputs["main"])
        | "Lookup"
        >> beam.Map(records.join_lookup, beam.pvalue.AsDict(table)).with_output_types(IntPair)
        | "Sum" >> beam.CombinePerKey(sum)
        | "Format" >> beam.Map(records.format_kv)
    )


def _sessions(p: beam.Pipeline, ds: Dataset, read: Reader) -> beam.PCollection:
    return (
        p
        | "Read" >> read(ds.inputs["main"])
        | "Timestamp" >> beam.Map(to_timestamped).with_output_types(IntPair)
        | "Sessions" >> beam.WindowInto(window.Sessions(records.SESSION_GAP_S))
        | "CountSum" >> beam.CombinePerKey(CountSumFn())
        | "Format" >> beam.ParDo(FormatSession())
    )


def _stateful(p: beam.Pipeline, ds: Dataset, read: Reader) -> beam.PCollection:
    return (
        p
        | "Read" >> read(ds.inputs["main"])
        | "Timestamp" >> beam.Map(to_timestamped).with_output_types(IntPair)
        | "Buffer" >> beam.ParDo(BufferUntilTimer())
    )


BUILDERS: dict[str, Callable[[beam.Pipeline, Dataset, Reader], beam.PCollection]] = {
    "wordcount": _wordcount,
    "combine": _combine,
    "gbk_skew": _gbk_skew,
    "side_input": _side_input,
    "sessions": _sessions,
    "stateful": _stateful,
}


def build(p: beam.Pipeline, ds: Dataset, out_prefix: str, io: str = "beam") -> None:
    """Adds workload ``ds.workload`` reading ``ds`` and writing to ``out_prefix``
    with the ``io`` mode's read and write transforms."""
    read, write = IO_MODES[io]
    BUILDERS[ds.workload](p, ds, read) | "Write" >> write(out_prefix)
