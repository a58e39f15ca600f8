"""A splittable DoFn stage in a streaming job, for the element-restrictions of one spread key
(no pyspark).

The stage's input (element, restriction, size) arrives once, from the stage that pairs
elements with their initial restrictions. Each micro-batch runs, in the SDK's bundle processor,
the new inputs and the residuals that are due: an unbounded DoFn such as `PeriodicImpulse`
processes what it can and defers the rest (a self-checkpoint with a resume time), which comes
back as a residual root. Residuals are kept in the key's state with the time they may resume;
the watermark they report (their watermark estimator's) is the stage's hold, so every stage
downstream sees the source watermark move only as the restrictions make progress. A drained job
truncates its restrictions: their residuals are dropped (Beam's default truncation of an
unbounded restriction).
"""
from __future__ import annotations

import pickle
from typing import Any

from apache_beam.portability.api import beam_fn_api_pb2

from sparkbeam.control.embedded import WORKERS
from sparkbeam.execute.stage_task import OutRow, TaskSpec, _StageDriver
from sparkbeam.metrics import merge_infos
from sparkbeam.streaming.script import MAX_MICROS, MIN_MICROS, RunnerTime


def residual_watermark(app: beam_fn_api_pb2.BundleApplication) -> int:
    """The watermark a residual reports for its outputs (micros); MIN when it reports none."""
    marks = [ts.seconds * 1_000_000 + ts.nanos // 1000 for ts in app.output_watermarks.values()]
    return min(marks) if marks else MIN_MICROS


class SplittableKey:
    """Runs one spread key's restrictions of a splittable stage per micro-batch."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        self.infos: list[Any] = []

    def step(self, blob: bytes | None, inputs: dict[int, list[bytes]], time: RunnerTime,
             drained: bool) -> tuple[list[OutRow], bytes | None, int]:
        """(output rows, the key's new blob or None, its hold: the earliest watermark of its
        pending residuals, MAX_MICROS when none are left)."""
        pending: list[tuple[int, bytes]] = pickle.loads(blob) if blob else []
        out: list[OutRow] = []
        with WORKERS.lease(self.spec.stage.descriptor) as worker:
            driver = _StageDriver(self.spec, worker)
            try:
                if any(inputs.values()):
                    out.extend(driver._run_chunks(inputs))
                due = [p for p in pending if p[0] <= time.processing]
                pending = [p for p in pending if p[0] > time.processing]
                chunks: dict[int, list[bytes]] = {}
                for _, encoded in due:
                    app = beam_fn_api_pb2.BundleApplication.FromString(encoded)
                    chunks.setdefault(driver.route(app), []).append(app.element)
                if chunks:
                    out.extend(driver._run_chunks(chunks))
            finally:
                self.infos.extend(driver.infos)
            for not_before, _, app in driver._residuals:
                pending.append((int(not_before * 1_000_000), app.SerializeToString()))
        if drained or not pending:
            return out, None, MAX_MICROS
        hold = min(
            residual_watermark(beam_fn_api_pb2.BundleApplication.FromString(encoded))
            for _, encoded in pending
        )
        return out, pickle.dumps(sorted(pending), protocol=5), hold

    def take_infos(self) -> list[Any]:
        infos, self.infos = merge_infos(self.infos), []
        return infos
