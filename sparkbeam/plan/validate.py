"""Prepare-time check that a pipeline proto is well formed, before anything reads it deeply.

Beam's translations trust the proto: a transform id that does not resolve is a KeyError deep
in fusion, composites nested thousands deep exhaust Python's recursion, a coder that contains
itself never finishes building. A client can send any of these (a broken one, or a hostile
one, to a job server). `check_structure` walks the proto once, iteratively, and reports every
such problem in one `InvalidPipelineError`.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from apache_beam.portability.api import beam_runner_api_pb2

from sparkbeam.errors import InvalidPipelineError

# Composite transforms deeper than this are refused: Beam's fusion walks the tree recursively
# (a few frames per level), and real pipelines nest a few dozen levels at most.
MAX_COMPOSITE_DEPTH = 100
# An error lists this many problems, then says how many more there are.
_SHOWN = 20


def check_structure(proto: beam_runner_api_pb2.Pipeline) -> None:
    """Raises `InvalidPipelineError` listing every structural problem of `proto`."""
    problems = list(structural_problems(proto))
    if not problems:
        return
    shown = "\n".join(f"  - {p}" for p in problems[:_SHOWN])
    more = f"\n  ... and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
    raise InvalidPipelineError(
        f"the pipeline proto is malformed: {len(problems)} problem(s) found when preparing "
        f"the job:\n{shown}{more}"
    )


def structural_problems(proto: beam_runner_api_pb2.Pipeline) -> Iterator[str]:
    """Every reference that does not resolve, every cycle, and a tree that is too deep."""
    comps = proto.components
    if not proto.root_transform_ids:
        yield "the pipeline has no root transforms (expected at least one)"
    yield from _tree_problems(proto.root_transform_ids, comps.transforms)
    for tid, transform in comps.transforms.items():
        where = f"transform {transform.unique_name or tid!r}"
        for kind, refs in (("input", transform.inputs), ("output", transform.outputs)):
            for tag, pcoll in refs.items():
                if pcoll not in comps.pcollections:
                    yield (f"{where}: {kind} {tag!r} names PCollection {pcoll!r}, which is "
                           "not defined")
        if transform.environment_id and transform.environment_id not in comps.environments:
            yield f"{where}: environment {transform.environment_id!r} is not defined"
    for pid, pcoll in comps.pcollections.items():
        where = f"PCollection {pcoll.unique_name or pid!r}"
        if pcoll.coder_id not in comps.coders:
            yield f"{where}: coder {pcoll.coder_id!r} is not defined"
        if pcoll.windowing_strategy_id not in comps.windowing_strategies:
            yield f"{where}: windowing strategy {pcoll.windowing_strategy_id!r} is not defined"
    for wid, strategy in comps.windowing_strategies.items():
        if strategy.window_coder_id not in comps.coders:
            yield (f"windowing strategy {wid!r}: window coder {strategy.window_coder_id!r} "
                   "is not defined")
    yield from _coder_problems(comps.coders)


def _tree_problems(
    roots: Iterable[str], transforms: Mapping[str, beam_runner_api_pb2.PTransform]
) -> Iterator[str]:
    parent_of: dict[str, str] = {}
    stack = [(tid, 1, "the pipeline's roots") for tid in roots]
    too_deep = False
    while stack:
        tid, depth, parent = stack.pop()
        if tid not in transforms:
            yield f"{parent} name transform {tid!r}, which is not defined"
            continue
        if tid in parent_of:
            yield (f"transform {tid!r} appears twice in the transform tree (under "
                   f"{parent_of[tid]} and {parent}): a cycle, or a part shared by composites")
            continue
        parent_of[tid] = parent
        if depth > MAX_COMPOSITE_DEPTH:
            too_deep = True
            continue
        where = f"composite {transforms[tid].unique_name or tid!r}"
        stack.extend((sub, depth + 1, where) for sub in transforms[tid].subtransforms)
    if too_deep:
        yield (f"composite transforms nest deeper than {MAX_COMPOSITE_DEPTH} levels "
               "(expected a transform tree a few dozen levels deep at most)")


def _coder_problems(coders: Mapping[str, beam_runner_api_pb2.Coder]) -> Iterator[str]:
    for cid, coder in coders.items():
        for component in coder.component_coder_ids:
            if component not in coders:
                yield f"coder {cid!r}: component coder {component!r} is not defined"
    # A coder that contains itself, directly or not: depth-first with colours, no recursion.
    done: set[str] = set()
    for start in coders:
        if start in done:
            continue
        path: list[str] = []
        on_path: set[str] = set()
        stack: list[tuple[str, bool]] = [(start, False)]
        while stack:
            cid, leaving = stack.pop()
            if leaving:
                on_path.discard(cid)
                path.pop()
                done.add(cid)
                continue
            if cid in done or cid not in coders:
                continue
            if cid in on_path:
                cycle = path[path.index(cid):] + [cid]
                yield f"coders form a cycle: {' -> '.join(repr(c) for c in cycle)}"
                return  # one cycle is enough to refuse the proto
            on_path.add(cid)
            path.append(cid)
            stack.append((cid, True))
            stack.extend((c, False) for c in coders[cid].component_coder_ids)
