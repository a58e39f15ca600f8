"""Dynamic work rebalancing: a straggling splittable bundle is split while it runs and its
residual runs on an idle task; outputs stay exact, also when split tasks fail and retry.

The tests that need a split read `tests/support/splitting.py`'s cued input, so the split
happens however loaded the machine is; the benchmark's own read checks splitting off."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from bench import splits as bench_splits
from sparkbeam import SparkRunner
from tests.support import splitting

UNIT = 100  # positions of a small restriction (~0.1 s); the big one has 20x


def test_a_straggler_is_split_and_every_position_is_read_exactly_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
        ["--dynamic_splitting=on", "--parallelism=2"]))
    positions = splitting.read(p, splitting.ReadOnCue(str(tmp_path), UNIT), UNIT)
    assert_that(positions, equal_to(splitting.expected(UNIT)))
    result = p.run()
    result.wait_until_finish()
    stats = result.split_stats  # type: ignore[attr-defined]
    history = result.split_history  # type: ignore[attr-defined]
    assert sum(s["splits"] for s in stats.values()) >= 1, (stats, history)
    assert sum(s["items_moved"] for s in stats.values()) >= 1
    # The decisions are kept for such a message: who was asked to split, and what it gave.
    assert any("asked to split" in e for h in history.values() for e in h), history


def test_splitting_off_never_splits() -> None:
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
        ["--dynamic_splitting=off", "--parallelism=2"]))
    assert_that(bench_splits.skewed_read(p, UNIT), equal_to(bench_splits.expected(UNIT)))
    result = p.run()
    result.wait_until_finish()
    stats = result.split_stats  # type: ignore[attr-defined]
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
        from sparkbeam import SparkRunner
        from tests.support import splitting

        class FailOnce(splitting.ReadOnCue):
            def checked(self, name, pos, r):
                if name == "big" and r.start == 0 and r.stop < {splitting.SKEW * UNIT} \\
                        and not os.path.exists({str(straggler)!r}):
                    open({str(straggler)!r}, "w").close()
                    raise RuntimeError("straggler fails after its split")
                if name == "big" and r.start > 0 and not os.path.exists({str(thief)!r}):
                    open({str(thief)!r}, "w").close()
                    raise RuntimeError("thief fails on the residual")
                return name, pos

        def write(positions):
            with open({str(out)!r}, "w") as f:
                json.dump(sorted(positions), f)

        p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
            ["--spark_master=local[2,3]", "--parallelism=2"]))
        _ = (splitting.read(p, FailOnce({str(tmp_path)!r}, {UNIT}), {UNIT})
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
    said = proc.stdout[-2000:]
    assert straggler.exists(), f"the straggler never failed after a split: {said}"
    assert thief.exists(), f"no residual ever failed: {said}"
    assert json.loads(out.read_text()) == [list(x) for x in splitting.expected(UNIT)]
