"""Dynamic work rebalancing: a straggling splittable bundle is split while it runs and its
residual runs on an idle task; outputs stay exact, also when split tasks fail and retry."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from bench.splits import expected, skewed_read
from sparkbeam import SparkRunner

UNIT = 100  # positions of a small restriction (~0.1 s); the big one has 20x


def _run(mode: str) -> dict[str, dict[str, int]]:
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
        [f"--dynamic_splitting={mode}", "--parallelism=2"]))
    assert_that(skewed_read(p, UNIT), equal_to(expected(UNIT)))
    result = p.run()
    result.wait_until_finish()
    return result.split_stats  # type: ignore[attr-defined, no-any-return]


def test_a_straggler_is_split_and_every_position_is_read_exactly_once() -> None:
    stats = _run("on")
    assert sum(s["splits"] for s in stats.values()) >= 1, stats
    assert sum(s["items_moved"] for s in stats.values()) >= 1


def test_splitting_off_never_splits() -> None:
    stats = _run("off")
    assert all(s["splits"] == 0 for s in stats.values()), stats


def test_failed_split_tasks_replay_their_splits_on_retry(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The straggler fails after it was split (its retry must run the primary only) and the
    task that took the residual fails too (its retry must take the same work): local[2,3]
    retries tasks. Every position is still read exactly once."""
    straggler, thief = tmp_path / "straggler-failed", tmp_path / "thief-failed"
    out = tmp_path / "positions.json"
    script = tmp_path / "retry.py"
    script.write_text(textwrap.dedent(f"""
        import json, os
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions
        from bench import splits
        from sparkbeam import SparkRunner

        class FailOnce(splits.ReadPositions):
            def process(self, element, tracker=beam.DoFn.RestrictionParam(
                    splits.WholeRestriction())):
                for name, pos in super().process(element, tracker):
                    r = tracker.current_restriction()
                    if name == "big" and r.start == 0 and r.stop < {20 * UNIT} \\
                            and not os.path.exists({str(straggler)!r}):
                        open({str(straggler)!r}, "w").close()
                        raise RuntimeError("straggler fails after its split")
                    if name == "big" and r.start > 0 and not os.path.exists({str(thief)!r}):
                        open({str(thief)!r}, "w").close()
                        raise RuntimeError("thief fails on the residual")
                    yield name, pos

        def write(positions):
            with open({str(out)!r}, "w") as f:
                json.dump(sorted(positions), f)

        p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
            ["--spark_master=local[2,3]", "--parallelism=2"]))
        _ = (p | beam.Create(splits.sources({UNIT})) | beam.ParDo(FailOnce())
             | beam.combiners.ToList() | beam.Map(write))
        result = p.run()
        result.wait_until_finish()
        print("SPLITS", sum(s["splits"] for s in result.split_stats.values()))
    """))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert straggler.exists(), "the straggler never failed after a split: nothing was proved"
    assert thief.exists(), "no residual ever failed: nothing was proved"
    assert json.loads(out.read_text()) == [list(x) for x in expected(UNIT)]
