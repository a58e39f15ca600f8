"""The direct path's pieces without Spark: lines cut out of an Arrow batch equal Beam's decoding of
each element, and a stage's rows are byte for byte the bundle processor's (`engine/direct.py`)."""
from __future__ import annotations

import dataclasses
import os
import tempfile

import apache_beam as beam
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.engine.arrow import ArrowRows, columns_of
from sparkbeam.engine.direct import text_lines
from sparkbeam.engine.task import TaskSpec, run_stage_task
from sparkbeam.plan.batch import plan_batch
from sparkbeam.plan.native_text import varint

_LINE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40) | st.sampled_from(
    ["", "x" * 127, "y" * 128, "z" * 16_383, "é" * 8_200, "w" * 20_000])


def _plan(keyed: bool):  # type: ignore[no-untyped-def]
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "in.txt")
    with open(path, "w") as f:
        f.write("a b\n")
    p = beam.Pipeline()
    pairs = (p | beam.io.ReadFromText(path) | "Split" >> beam.FlatMap(str.split)
             | "Pair" >> beam.Map(lambda w: (w, len(w))))
    _ = pairs | (beam.GroupByKey() if keyed else beam.CombinePerKey(sum))
    plan = plan_batch(p.to_runner_api())
    stage = next(s for s in plan.stages if s.direct is not None)
    return plan, stage, next(iter(plan.text_reads.values())).prefix


def _batch(values: list[bytes]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([0] * len(values), pa.int32()), pa.array([None] * len(values), pa.binary()),
         pa.array(values, pa.binary())], names=["input", "key", "value"])


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(_LINE, min_size=1, max_size=30))
def test_text_lines_are_beams_decoding(lines: list[str]) -> None:
    _, _, prefix = _plan(keyed=False)
    encoded = [prefix + varint(len(s.encode())) + s.encode() for s in lines]
    assert text_lines(columns_of(_batch(encoded)), prefix) == lines


def test_text_lines_refuse_what_is_not_a_line() -> None:
    _, _, prefix = _plan(keyed=False)
    good = prefix + varint(1) + b"a"
    for bad in (prefix + varint(2) + b"\xff\xfe",  # not UTF-8
                b"\x80" + good[1:],  # another timestamp
                prefix + varint(5) + b"ab"):  # a length that is not the rest
        assert text_lines(columns_of(_batch([good, bad])), prefix) is None


@settings(max_examples=10, deadline=None)
@given(lines=st.lists(st.text(st.characters(blacklist_categories=("Cs",),
                                            blacklist_characters="\r\n"), max_size=12),
                      max_size=50), keyed=st.booleans())
def test_rows_equal_the_bundle_processors(lines: list[str], keyed: bool) -> None:
    plan, stage, prefix = _plan(keyed)
    encoded = [prefix + varint(len(s.encode())) + s.encode() for s in lines]
    spec = TaskSpec(stage=stage, components=plan.components, groupings=dict(plan.groupings),
                    pickle_library="default", bundle_size=1_000_000, bundle_bytes=64 << 20)
    general = dataclasses.replace(spec, stage=dataclasses.replace(stage, direct=None))

    def data(s: TaskSpec) -> list:  # type: ignore[type-arg]
        return [r for r in run_stage_task(s, ArrowRows(iter([_batch(encoded)])), {}) if r[0] >= 0]

    direct, beams = data(spec), data(general)
    if keyed:  # (key, value) per word, in order
        assert direct == beams
    else:  # one accumulator per key, in a table's order
        assert sorted(direct) == sorted(beams)
