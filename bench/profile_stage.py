"""Profiles one word-count map stage in-process (no Spark): where a task's time goes.

`python -m bench.profile_stage [--words N] [--bundle-size B]` runs the stage that reads lines,
splits them and pre-combines counts, straight through `run_stage_task`, under cProfile, and
prints throughput and the top functions by cumulative and own time.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import time

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from sparkbeam.engine.task import TaskSpec, run_stage_task
from sparkbeam.plan.fuse import plan_pipeline


def _plan():  # type: ignore[no-untyped-def]
    p = beam.Pipeline()
    _ = (p | beam.Create([(1, "a b")]).with_output_types(tuple[int, str]) | beam.GroupByKey()
         | "Split" >> beam.FlatMap(lambda kv: [w for line in kv[1] for w in line.split()])
         .with_output_types(str)
         | "Count" >> beam.combiners.Count.PerElement())
    plan = plan_pipeline(p.to_runner_api())
    # The stage fed by the GroupByKey that ends in the Count's pre-combine.
    stage = next(s for s in plan.stages if any("Split" in t for t in s.transforms))
    return plan, stage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--bundle-size", type=int, default=1000)
    args = parser.parse_args()
    plan, stage = _plan()
    rng = random.Random(1)
    words = [f"w{i}" for i in range(5000)]
    lines = [" ".join(rng.choices(words, k=10)) for _ in range(args.lines)]
    # The stage reads grouped (key, [lines]) elements: one group per 100 lines.
    grouping = plan.groupings[stage.inputs[0].buffer_id]
    from sparkbeam.engine import context as worker_context

    ctx = worker_context.pipeline_context(plan.components)
    impl = ctx.coders[grouping.input_coder_id].get_impl()
    key_impl = ctx.coders[grouping.input_coder_id].wrapped_value_coder.key_coder().get_impl()
    rows = []
    for i, line in enumerate(lines):
        key = i % 500
        rows.append((0, key_impl.encode_nested(key),
                     impl.encode_nested(GlobalWindows.windowed_value((key, line)))))
    rows.sort(key=lambda r: r[1])
    spec = TaskSpec(stage=stage, components=plan.components, groupings=dict(plan.groupings),
                    pickle_library="default", bundle_size=args.bundle_size,
                    bundle_bytes=64 << 20)
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    out = sum(1 for _ in run_stage_task(spec, rows, {}))
    profiler.disable()
    elapsed = time.perf_counter() - started
    n_words = args.lines * 10
    print(f"{n_words} words in {elapsed:.2f}s = {n_words / elapsed / 1e6:.2f} M words/s "
          f"({out} output rows)")
    for key in ("cumulative", "tottime"):
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats(key).print_stats(18)
        print(buf.getvalue()[-4000:])


if __name__ == "__main__":
    main()
