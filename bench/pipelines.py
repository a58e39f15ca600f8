"""The Beam pipelines of every workload; identical for every Beam runner.

Each builder reads the data set's text inputs and writes ``KEY<TAB>VALUE``
lines with ``WriteToText(out_prefix)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp

from bench import records
from bench.workloads import Dataset

IntPair = beam.typehints.Tuple[int, int]


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

    def process(self, kv: tuple[int, tuple[int, int]], win: window.BoundedWindow = beam.DoFn.WindowParam) -> Iterator[str]:
        user, (count, total) = kv
        start = win.start.micros // 1_000_000
        end = win.end.micros // 1_000_000
        yield f"{user}@{start}\t{end},{count},{total}"


class BufferUntilTimer(beam.DoFn):
    """Buffers each key's values in bag state; an event-time timer flushes them."""

    BUFFER = BagStateSpec("buffer", VarIntCoder())
    FLUSH = TimerSpec("flush", TimeDomain.WATERMARK)  # event time

    def process(self, kv: tuple[int, int], buffer=beam.DoFn.StateParam(BUFFER), flush=beam.DoFn.TimerParam(FLUSH)) -> None:
        buffer.add(kv[1])
        flush.set(Timestamp(records.FLUSH_AT_S))

    @on_timer(FLUSH)
    def on_flush(self, key=beam.DoFn.KeyParam, buffer=beam.DoFn.StateParam(BUFFER)) -> Iterator[str]:
        values = list(buffer.read())
        buffer.clear()
        yield f"{key}\t{records.sorted_summary(values)}"


def _wordcount(p: beam.Pipeline, ds: Dataset) -> beam.PCollection:
    return (
        p
        | "Read" >> beam.io.ReadFromText(ds.inputs["main"])
        | "Split" >> beam.FlatMap(records.split_words).with_output_types(str)
        | "PairOne" >> beam.Map(records.pair_one).with_output_types(beam.typehints.Tuple[str, int])
        | "Sum" >> beam.CombinePerKey(sum)
        | "Format" >> beam.Map(records.format_kv)
    )


def _combine(p: beam.Pipeline, ds: Dataset) -> beam.PCollection:
    return (
        p
        | "Read" >> beam.io.ReadFromText(ds.inputs["main"])
        | "Parse" >> beam.Map(records.parse_int_pair).with_output_types(IntPair)
        | "Sum" >> beam.CombinePerKey(sum)
        | "Format" >> beam.Map(records.format_kv)
    )


def _gbk_skew(p: beam.Pipeline, ds: Dataset) -> beam.PCollection:
    return (
        p
        | "Read" >> beam.io.ReadFromText(ds.inputs["main"])
        | "Parse" >> beam.Map(records.parse_int_pair).with_output_types(IntPair)
        | "Group" >> beam.GroupByKey()
        | "SortSummarise" >> beam.Map(records.summarise_group)
        | "Format" >> beam.Map(records.format_kv)
    )


def _side_input(p: beam.Pipeline, ds: Dataset) -> beam.PCollection:
    table = (
        p
        | "ReadTable" >> beam.io.ReadFromText(ds.inputs["table"])
        | "ParseTable" >> beam.Map(records.parse_int_pair).with_output_types(IntPair)
    )
    return (
        p
        | "Read" >> beam.io.ReadFromText(ds.inputs["main"])
        | "Lookup" >> beam.Map(records.join_lookup, beam.pvalue.AsDict(table)).with_output_types(IntPair)
        | "Sum" >> beam.CombinePerKey(sum)
        | "Format" >> beam.Map(records.format_kv)
    )


def _sessions(p: beam.Pipeline, ds: Dataset) -> beam.PCollection:
    return (
        p
        | "Read" >> beam.io.ReadFromText(ds.inputs["main"])
        | "Timestamp" >> beam.Map(to_timestamped).with_output_types(IntPair)
        | "Sessions" >> beam.WindowInto(window.Sessions(records.SESSION_GAP_S))
        | "CountSum" >> beam.CombinePerKey(CountSumFn())
        | "Format" >> beam.ParDo(FormatSession())
    )


def _stateful(p: beam.Pipeline, ds: Dataset) -> beam.PCollection:
    return (
        p
        | "Read" >> beam.io.ReadFromText(ds.inputs["main"])
        | "Timestamp" >> beam.Map(to_timestamped).with_output_types(IntPair)
        | "Buffer" >> beam.ParDo(BufferUntilTimer())
    )


BUILDERS: dict[str, Callable[[beam.Pipeline, Dataset], beam.PCollection]] = {
    "wordcount": _wordcount,
    "combine": _combine,
    "gbk_skew": _gbk_skew,
    "side_input": _side_input,
    "sessions": _sessions,
    "stateful": _stateful,
}


def build(p: beam.Pipeline, ds: Dataset, out_prefix: str) -> None:
    """Adds workload ``ds.workload`` reading ``ds`` and writing to ``out_prefix``."""
    BUILDERS[ds.workload](p, ds) | "Write" >> beam.io.WriteToText(out_prefix)
