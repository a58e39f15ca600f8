"""Stage labels follow the pipeline, not the transform ids Beam numbers per process."""
from __future__ import annotations

import apache_beam as beam

from sparkbeam.plan.fuse import plan_pipeline


def _labels(tmp: str) -> list[tuple[str, str]]:
    p = beam.Pipeline()
    _ = (p | beam.io.ReadFromText(f"{tmp}/in*") | beam.FlatMap(str.split)
         | beam.combiners.Count.PerElement() | beam.MapTuple(lambda w, c: f"{w}: {c}")
         | beam.io.WriteToText(f"{tmp}/out"))
    plan = plan_pipeline(p.to_runner_api())
    return [(s.label, s.description) for s in plan.stages]


def test_the_same_pipeline_built_again_gets_the_same_stage_labels(tmp_path) -> None:
    (tmp_path / "in.txt").write_text("a b\n")
    first = _labels(str(tmp_path))
    for _ in range(3):  # each construction numbers its transform ids further on
        assert _labels(str(tmp_path)) == first
    roots = [d for _, d in first[:2]]
    assert roots == sorted(roots)  # stages ready together: by their transforms' names
