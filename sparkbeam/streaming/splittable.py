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

Under a work budget each spread key is an endpoint of the source (`beam_source.py`) with a
share per micro-batch (items, bytes of the stage's output). Its restrictions then run one per
bundle, each with an even part of the key's share (what one does not use goes to the others),
and when a bundle's output reaches its part the runner checkpoints the restriction in progress
(`StageRun.run_capped`, a split at fraction 0): the SDK stops it after the element just output
and hands back the rest as a residual, run again while the key's share lasts, else due the next
batch. Restrictions not started for want of budget wait the same way; an unstarted restriction
holds the watermark at its start. A key stopped by the budget counts the time to its next
batch as throttle time, reported as the splittable DoFn's counter `throttling-msecs`; a
restriction whose element names a topic and a partition (ReadFromKafka's) that was left
waiting also counts it as `throttling-msecs/<topic>-<partition>`, so a user sees which
partitions the budget held back.
"""
from __future__ import annotations

import collections
import pickle
from collections.abc import Mapping
from typing import Any

from apache_beam.metrics import monitoring_infos
from apache_beam.portability.api import beam_fn_api_pb2

from sparkbeam.engine import context
from sparkbeam.engine.program import OutRow, program_for
from sparkbeam.engine.run import BatchSideWorker, StageRun
from sparkbeam.engine.task import TaskSpec
from sparkbeam.metrics import merge_infos
from sparkbeam.streaming.budget import THROTTLE_COUNTER, THROTTLE_NAMESPACE
from sparkbeam.streaming.script import MAX_MICROS, MIN_MICROS, RunnerTime
from sparkbeam.urns import SPLITTABLE_PROCESS


# A restriction waiting in the key's state: (not before, stage input, element, watermark), in
# micros; the element is what the stage input reads (element, restriction, size, estimator).
Entry = tuple[int, int, bytes, int]
Work = tuple[int, bytes, int]  # (stage input, element, watermark) to run now


def residual_watermark(app: beam_fn_api_pb2.BundleApplication) -> int:
    """The watermark a residual reports for its outputs (micros); MIN when it reports none."""
    marks = [ts.seconds * 1_000_000 + ts.nanos // 1000 for ts in app.output_watermarks.values()]
    return min(marks) if marks else MIN_MICROS


class SplittableKey:
    """Runs one spread key's restrictions of a splittable stage per micro-batch."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        self.program = program_for(spec.stage, spec.components, spec.groupings)
        self.infos: list[Any] = []
        self.throttle_micros = 0  # of the keys this task ran, since the last `take_infos`
        # the same per endpoint (topic-partition) of the restrictions the budget left waiting
        self.endpoint_throttle_micros: collections.Counter[str] = collections.Counter()
        self.step_name = process_step(self.program.descriptor)
        ctx = context.pipeline_context(spec.components)
        self._input_impls = [ctx.coders[i.coder_id].get_impl() for i in spec.stage.inputs]
        self.sided = BatchSideWorker()  # for a DoFn that reads side inputs

    def step(self, blob: bytes | None, inputs: dict[int, list[bytes]], time: RunnerTime,
             drained: bool, budget: tuple[int, int] | None = None,
             sides: tuple[int, Mapping[bytes, list[bytes]]] | None = None
             ) -> tuple[list[OutRow], bytes | None, int]:
        """(output rows, the key's new blob or None, its hold: the earliest watermark of its
        pending restrictions, MAX_MICROS when none are left). `budget`: the (items, bytes) the
        key's bundles may output this batch; None runs everything due in one bundle. `sides`:
        (the micro-batch, the data of the side inputs the DoFn reads), for new restrictions
        and residuals alike (a restriction reads the side inputs as they are when it runs)."""
        entries, throttled, endpoints = _load(blob)
        if throttled:
            waited = max(0, time.processing - time.processing_before)
            self.throttle_micros += waited
            for endpoint in endpoints:
                self.endpoint_throttle_micros[endpoint] += waited
        due = sorted(e for e in entries if e[0] <= time.processing)
        later = [e for e in entries if e[0] > time.processing]
        work: list[Work] = [(n, element, mark) for _, n, element, mark in due]
        work += [(n, element, MIN_MICROS) for n in sorted(inputs) for element in inputs[n]]
        left: list[Work] = []
        stopped = False
        with self.sided.run_or_leased(self.program, self.spec.bundle_size, None, sides) as run:
            try:
                if budget is None:
                    out = self._run_all(run, work)
                else:
                    out, left, stopped = self._run_budgeted(run, work, budget)
            finally:
                self.infos.extend(run.infos)
            later += [(MIN_MICROS, n, element, mark) for n, element, mark in left]
            later += [(int(not_before * 1_000_000), self.program.route(app), app.element,
                       residual_watermark(app))
                      for not_before, _, app in run.residuals]
        if drained or not later:
            return out, None, MAX_MICROS
        hold = min(entry[3] for entry in later)
        state = (sorted(later), stopped, self._endpoints(left) if stopped else ())
        return out, pickle.dumps(state, protocol=5), hold

    def _endpoints(self, left: list[Work]) -> tuple[str, ...]:
        """The topic-partitions of the restrictions the budget left waiting (elements that
        name a `topic` and a `partition`, as ReadFromKafka's do)."""
        names = set()
        for n, element, _ in left:
            try:  # (element, (restriction, watermark estimator state)), size
                original = self._input_impls[n].decode_nested(element).value[0][0]
            except Exception:  # noqa: BLE001 - a label is optional; the key's total still counts
                continue
            topic = getattr(original, "topic", None)
            partition = getattr(original, "partition", None)
            if isinstance(topic, str) and isinstance(partition, int):
                names.add(f"{topic}-{partition}")
        return tuple(sorted(names))

    @staticmethod
    def _run_all(run: StageRun, work: list[Work]) -> list[OutRow]:
        chunks: dict[int, list[bytes]] = {}
        for n, element, _ in work:
            chunks.setdefault(n, []).append(element)
        return run.run_chunks(chunks) if chunks else []

    def _run_budgeted(self, run: StageRun, work: list[Work], budget: tuple[int, int]
                      ) -> tuple[list[OutRow], list[Work], bool]:
        """Runs `work` one restriction per bundle, the key's budget shared evenly over its
        restrictions (a Kafka partition each, for a Kafka read), in rounds: each round gives
        the restrictions still going what is left so that what each has output this batch
        stays as even as it can (`even_parts`); what one does not use goes to the next round,
        where the restrictions checkpointed at their part run again; rounds go on while budget
        and such restrictions remain. (rows, the work left, whether the budget stopped the
        key)."""
        items, size = budget
        out: list[OutRow] = []
        got = [0] * len(work)  # items each restriction has output this batch
        while work:
            if items <= 0 or size <= 0:
                return out, work, True
            parts = even_parts(items, got)
            part_size = -(-size // len(work))  # bytes: an even cap, not levelled
            resent: list[Work] = []
            resent_got: list[int] = []
            spent = 0
            for (n, element, mark), part, had in zip(work, parts, got, strict=True):
                if part <= 0 or items <= 0 or size <= 0:  # not started: waits as it is
                    resent.append((n, element, mark))
                    resent_got.append(had)
                    continue
                before = len(resent)

                def checkpoint(n: int = n, element: bytes = element, mark: int = mark,
                               resent: list[Work] = resent) -> None:
                    outcome = run.checkpoint()
                    if outcome is None:
                        return  # not splittable here: the restriction runs on past its share
                    for reschedule in outcome.reschedules:
                        app = reschedule.application
                        resent.append((self.program.route(app), app.element,
                                       residual_watermark(app)))
                    for resend in outcome.resends:  # the element itself was not started
                        resent.extend((n, e, mark) for e in
                                      [element][resend.first_element:resend.last_element + 1])

                rows, taken_items, taken_bytes = run.run_capped(
                    {n: [element]}, min(part, items), min(part_size, size), checkpoint)
                out.extend(rows)
                items, size = items - taken_items, size - taken_bytes
                spent += taken_items
                resent_got.extend([had + taken_items] * (len(resent) - before))
            if not spent and len(resent) == len(work):  # nothing moved: wait for next batch
                return out, resent, bool(resent)
            work, got = resent, resent_got
        return out, [], False

    def take_infos(self) -> list[Any]:
        """The infos of the bundles run since the last call, with the throttle time of the keys
        the budget stopped as the counter `sparkbeam.streaming:throttling-msecs` of the
        splittable DoFn."""
        infos, self.infos = merge_infos(self.infos), []
        if self.throttle_micros:
            infos.append(monitoring_infos.int64_user_counter(
                THROTTLE_NAMESPACE, THROTTLE_COUNTER, self.throttle_micros // 1000,
                ptransform=self.step_name))
            self.throttle_micros = 0
        for endpoint, micros in sorted(self.endpoint_throttle_micros.items()):
            if micros >= 1000:
                infos.append(monitoring_infos.int64_user_counter(
                    THROTTLE_NAMESPACE, f"{THROTTLE_COUNTER}/{endpoint}", micros // 1000,
                    ptransform=self.step_name))
        self.endpoint_throttle_micros.clear()
        return infos


def even_parts(items: int, got: list[int]) -> list[int]:
    """Parts of `items` for restrictions that have output `got` so far, such that the totals
    (got + part) are as even as they can be (max-min fair: those already above the level get
    nothing; the remainder goes one each to those with the least)."""
    pool = sorted(range(len(got)), key=lambda i: got[i])
    while True:
        level, extra = divmod(items + sum(got[i] for i in pool), len(pool))
        if got[pool[-1]] <= level:
            break
        pool.pop()
    parts = [0] * len(got)
    for rank, i in enumerate(pool):
        parts[i] = level - got[i] + (1 if rank < extra else 0)
    return parts


def spread_endpoint(label: str, key: bytes) -> str:
    """The budget's endpoint for one spread key of a splittable stage."""
    return f"{label}/{key.decode()}"


def spread_endpoints(label: str, partitions: int) -> tuple[str, ...]:
    """Every spread key's endpoint (the keys are the element hash modulo `partitions`)."""
    return tuple(spread_endpoint(label, str(k).encode()) for k in range(partitions))


def _load(blob: bytes | None) -> tuple[list[Entry], bool, tuple[str, ...]]:
    """(entries, whether the budget stopped the key, the endpoints it left waiting). A
    checkpoint written before endpoints were recorded holds the first two only."""
    if not blob:
        return [], False, ()
    entries, stopped, *endpoints = pickle.loads(blob)
    return list(entries), bool(stopped), tuple(endpoints[0]) if endpoints else ()


def process_step(descriptor: beam_fn_api_pb2.ProcessBundleDescriptor) -> str:
    """The user-facing name of the splittable DoFn a stage runs (its Process transform)."""
    for transform in descriptor.transforms.values():
        if transform.spec.urn == SPLITTABLE_PROCESS:
            return transform.unique_name.removesuffix("/Process")
    return descriptor.id
