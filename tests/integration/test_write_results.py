"""A bounded WriteToText whose file names skip Beam's regroup writes what FnApiRunner writes:
differential tests on generated elements (text, bytes, other objects, none at all), in both
bundle shapes, checking every shard's lines, the shards' names and the names the write gives."""
from __future__ import annotations

import os
import re
import tempfile

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkbeam import SparkRunner
from sparkbeam.runner import prepare

SHAPES = {"default": [], "one-per-bundle": ["--bundle_size=1", "--parallelism=1"]}
_ELEMENT = st.one_of(st.text(st.characters(blacklist_categories=("Cs",)), max_size=8),
                     st.binary(max_size=6), st.integers(-2**63, 2**63 - 1),
                     st.tuples(st.integers(0, 9), st.text(max_size=3)))


def _keep_names(names: list[str], path: str) -> None:
    with open(path, "w") as f:
        f.write("\n".join(sorted(os.path.basename(n) for n in names)))


def _write(runner, elements: list[object], args: list[str], **kwargs):  # type: ignore[no-untyped-def]
    """The files the write leaves (name -> bytes) and the names it gives downstream."""
    directory = tempfile.mkdtemp(prefix="sparkbeam-write-")
    given_names = os.path.join(directory, "given.txt")
    p = beam.Pipeline(runner=runner, options=PipelineOptions(args))
    written = (p | beam.Create(elements)  # reshuffled: spread over tasks and bundles
               | "Out" >> beam.io.WriteToText(os.path.join(directory, "out"), **kwargs))
    _ = written | beam.combiners.ToList() | beam.Map(_keep_names, given_names)
    p.run().wait_until_finish()
    files = {}
    for name in sorted(os.listdir(directory)):
        if name.startswith("out"):
            with open(os.path.join(directory, name), "rb") as f:
                files[name] = f.read()
    with open(given_names) as f:
        given = f.read().split("\n") if os.path.getsize(given_names) else []
    return files, given


def _shards(files: dict[str, bytes]) -> tuple[list[bytes], int]:
    """Every line of every shard (sorted), and the shard count the names say, checking the
    names run 0..N-1 of N."""
    counts = set()
    indices = []
    for name in files:
        match = re.fullmatch(r"out-(\d{5})-of-(\d{5})", name)
        assert match, name
        indices.append(int(match.group(1)))
        counts.add(int(match.group(2)))
    assert len(counts) <= 1 and sorted(indices) == list(range(len(files))), files
    lines = sorted(line for content in files.values() for line in content.split(b"\n")[:-1])
    assert all(content.endswith(b"\n") or not content for content in files.values())
    return lines, len(files)


@pytest.mark.parametrize("shape", SHAPES)
@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(elements=st.lists(_ELEMENT, max_size=12))
def test_the_files_and_names_are_fnapi_runners(shape: str, elements: list[object]) -> None:
    args = SHAPES[shape]
    ours, our_names = _write(SparkRunner(), elements, args)
    theirs, their_names = _write(FnApiRunner(), elements, args)
    (our_lines, our_count), (their_lines, _) = _shards(ours), _shards(theirs)
    assert our_lines == their_lines
    assert our_names == sorted(ours) and their_names == sorted(theirs)
    if not elements:  # one empty shard, as Beam makes when nothing was written
        assert ours == {"out-00000-of-00001": b""} == theirs
    assert our_count >= 1


def test_many_shards_from_many_tasks_and_bundles_and_full_shards() -> None:
    """Names gathered from several Spark tasks (parallelism 2, a bundle per element), and
    shards cut at max_records_per_shard (names a bundle yields before it ends)."""
    elements = [f"line {i}" for i in range(40)]
    for args, kwargs in (
            (["--bundle_size=1", "--parallelism=2"], {}),
            (["--parallelism=2"], {"max_records_per_shard": 3})):
        ours, our_names = _write(SparkRunner(), elements, args, **kwargs)
        theirs, _ = _write(FnApiRunner(), elements, args, **kwargs)
        (our_lines, our_count), (their_lines, _) = _shards(ours), _shards(theirs)
        assert our_lines == their_lines == sorted(e.encode() for e in elements)
        assert our_names == sorted(ours)
        assert our_count >= (14 if kwargs else 2), sorted(ours)


def test_skip_if_empty_writes_nothing_as_fnapi_runner_does() -> None:
    ours, our_names = _write(SparkRunner(), [], [], skip_if_empty=True)
    theirs, their_names = _write(FnApiRunner(), [], [], skip_if_empty=True)
    assert ours == theirs == {} and our_names == their_names == []


def test_the_plan_says_which_way_each_write_went(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = beam.Pipeline(options=PipelineOptions([]))
    lines = p | beam.Create(["a"])
    _ = lines | "Free" >> beam.io.WriteToText(str(tmp_path / "free"))
    _ = lines | "Fixed" >> beam.io.WriteToText(str(tmp_path / "fixed"), num_shards=2)
    plan = prepare(p.to_runner_api(), p.options)
    decisions = plan.decisions
    assert ("Free/Write/WriteImpl: its file names go straight to finalising (Beam's Pair, "
            "GroupByKey and Extract of them left out)") in decisions
    assert ("Fixed/Write/WriteImpl: Beam's expansion as it is (no regroup of its file names "
            "to leave out (e.g. a fixed shard count))") in decisions
    # The writing stage stays a Spark task, as it was while it fed the regroup's shuffle.
    assert plan.kept_in_spark == {"Free/Write/WriteImpl/WriteBundles"}
