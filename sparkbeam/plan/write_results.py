"""A bounded file write's results go to its finalisation without being grouped again.

Beam's `WriteImpl` (behind `WriteToText`, `WriteToParquet` and every `FileBasedSink`) writes
each bundle's elements to a temporary file, then, when the number of shards is left to the
runner, gathers the files' names with `Pair` (`lambda x: (None, x)`), a `GroupByKey` and
`Extract` (`lambda x: x[1]`) before `PreFinalize` and `FinalizeWrite` read them as iterable
side inputs. On Spark that regrouping is a shuffle and a stage of its own for a handful of
names: 0.13-0.21 s of a warm quick-size job's 1.1-1.5 s (bench/ANALYSIS.md). Side inputs are
gathered whole anyway, so the two finalisation steps can read `WriteBundles`' names
directly: an iterable side input of the same names in the same global window, in some order,
as the group's values are (Beam fixes neither order).

Only Beam's own expansion is rewritten: a composite `.../WriteImpl` whose `WriteBundles` runs
Beam's `_WriteBundleDoFn`, whose `Pair` and `Extract` run Beam's lambdas (the same code), and
whose `Extract` output is read by nothing but iterable side inputs in the global window. Any
other shape keeps the regroup, and the plan says which way each write went.
"""
from __future__ import annotations

import copy
from typing import Any

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2

from sparkbeam.plan.direct_paths import globally_windowed, side_inputs_of, wrapped_fn

_PAR_DO = common_urns.primitives.PAR_DO.urn
_GBK = common_urns.primitives.GROUP_BY_KEY.urn
_ITERABLE = common_urns.side_inputs.ITERABLE.urn


def _references() -> dict[str, Any]:
    """The code of lambdas written as Beam's `Pair` and `Extract` are, and the file Beam's are
    in, to compare a pickled function's code with (a pickled copy is a new code object)."""
    from apache_beam.io import iobase

    return {
        "file": iobase.WriteImpl._expand_bounded.__code__.co_filename,  # noqa: SLF001
        "pair": (lambda x: (None, x)).__code__,
        "extract": (lambda x: x[1]).__code__,
    }


def _same(code: Any, ref: Any, file: str | None = None) -> bool:
    return bool(code is not None and code.co_code == ref.co_code
                and code.co_consts == ref.co_consts and code.co_names == ref.co_names
                and code.co_name == ref.co_name
                and (file is None or code.co_filename == file))


def _dofn(transform: beam_runner_api_pb2.PTransform) -> Any:
    from apache_beam.internal import pickler

    if transform.spec.urn != _PAR_DO:
        return None
    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    try:
        return pickler.loads(payload.do_fn.payload)[0]
    except Exception:  # noqa: BLE001 - a DoFn this process cannot load is not Beam's own
        return None


def _beams_lambda(transform: beam_runner_api_pb2.PTransform, kind: str,
                  refs: dict[str, Any]) -> bool:
    """Whether the ParDo runs Beam's own `Pair` (a Map of it) or `Extract` (a FlatMap)."""
    fn = getattr(_dofn(transform), "_fn", None)
    if kind == "pair":
        found = wrapped_fn(fn)
        fn = found[1] if found is not None and found[0] == "map" else None
    return _same(getattr(fn, "__code__", None), refs[kind], refs["file"])


def _problem(comps: beam_runner_api_pb2.Components, impl: beam_runner_api_pb2.PTransform,
             refs: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """Why this WriteImpl keeps its regroup (or ""), and its parts by role."""
    from apache_beam.io import iobase

    parts: dict[str, str] = {}
    for tid in impl.subtransforms:
        tail = comps.transforms[tid].unique_name.rsplit("/", 1)[-1]
        if tail in ("WriteBundles", "Pair", "GroupByKey", "Extract"):
            parts[tail] = tid
    if len(parts) != 4:
        return "no regroup of its file names to leave out (e.g. a fixed shard count)", parts
    t = {role: comps.transforms[tid] for role, tid in parts.items()}
    if type(_dofn(t["WriteBundles"])) is not iobase._WriteBundleDoFn:  # noqa: SLF001
        return "its WriteBundles is not Beam's", parts
    if not (_beams_lambda(t["Pair"], "pair", refs)
            and _beams_lambda(t["Extract"], "extract", refs)
            and t["GroupByKey"].spec.urn == _GBK):
        return "its Pair, GroupByKey and Extract are not Beam's", parts
    chain = [("WriteBundles", "Pair"), ("Pair", "GroupByKey"), ("GroupByKey", "Extract")]
    for before, after in chain:
        if list(t[after].inputs.values()) != list(t[before].outputs.values()):
            return f"its {after} does not read its {before}", parts
    leaving = _regroup(comps, parts)
    for role in ("Pair", "GroupByKey"):
        for pcoll in t[role].outputs.values():
            for tid, other in _readers(comps, pcoll):
                if tid not in leaving:
                    return f"'{other.unique_name}' reads what its {role} makes", parts
    names = next(iter(t["Extract"].outputs.values()))
    for _, other in _readers(comps, names):
        if other.spec.urn != _PAR_DO:
            return f"'{other.unique_name}' reads the names as its input", parts
        try:
            sides = dict(side_inputs_of(
                beam_runner_api_pb2.ParDoPayload.FromString(other.spec.payload)))
        except Exception as exc:  # noqa: BLE001 - a view that cannot be loaded here is not ours
            return (f"'{other.unique_name}' has side inputs that cannot be loaded here "
                    f"({type(exc).__name__})"), parts
        for tag, pcoll in other.inputs.items():
            if pcoll != names:
                continue
            side = sides.get(tag)
            if side is None or side.access_pattern != _ITERABLE:
                return f"'{other.unique_name}' reads the names other than as an iterable", parts
            if not globally_windowed(side):
                return f"'{other.unique_name}' reads the names per window", parts
    return "", parts


def _readers(comps: beam_runner_api_pb2.Components, pcoll: str
             ) -> list[tuple[str, beam_runner_api_pb2.PTransform]]:
    """The leaf transforms reading `pcoll` (composites list their parts' inputs too)."""
    return [(tid, t) for tid, t in comps.transforms.items()
            if not t.subtransforms and pcoll in t.inputs.values()]


def _regroup(comps: beam_runner_api_pb2.Components, parts: dict[str, str]) -> set[str]:
    """Pair, GroupByKey (with whatever a runner's expansion of it holds) and Extract."""
    found: set[str] = set()
    stack = [parts["Pair"], parts["GroupByKey"], parts["Extract"]]
    while stack:
        tid = stack.pop()
        found.add(tid)
        stack.extend(comps.transforms[tid].subtransforms)
    return found


def _writes(comps: beam_runner_api_pb2.Components) -> list[str]:
    """The composites that look like Beam's WriteImpl: named so, holding a WriteBundles."""
    return sorted(
        tid for tid, t in comps.transforms.items()
        if (t.unique_name.endswith("/WriteImpl") or t.unique_name == "WriteImpl")
        and any(comps.transforms[sub].unique_name.endswith("/WriteBundles")
                for sub in t.subtransforms))


def without_write_regroups(
    proto: beam_runner_api_pb2.Pipeline,
) -> tuple[beam_runner_api_pb2.Pipeline, list[str], frozenset[str]]:
    """`proto` with each bounded WriteImpl's regroup of its file names taken out where its
    finalisation can read them straight from `WriteBundles`, a line per WriteImpl, and the
    names of those WriteBundles: their stages stay Spark tasks, as they were while they fed
    a shuffle (the driver runs stages that only feed side inputs, `engine/placement.py`)."""
    impls = _writes(proto.components)
    if not impls:
        return proto, [], frozenset()
    refs = _references()
    out = copy.deepcopy(proto)
    lines: list[str] = []
    kept: set[str] = set()
    for impl_id in impls:
        impl = out.components.transforms[impl_id]
        problem, parts = _problem(out.components, impl, refs)
        if problem:
            lines.append(f"{impl.unique_name}: Beam's expansion as it is ({problem})")
            continue
        kept.add(out.components.transforms[parts["WriteBundles"]].unique_name)
        _drop_regroup(out.components, impl, parts)
        lines.append(f"{impl.unique_name}: its file names go straight to finalising (Beam's "
                     "Pair, GroupByKey and Extract of them left out)")
    return out, lines, frozenset(kept)


def _drop_regroup(comps: beam_runner_api_pb2.Components, impl: beam_runner_api_pb2.PTransform,
                  parts: dict[str, str]) -> None:
    """The finalisation reads WriteBundles' names; Pair, GroupByKey, Extract and their
    PCollections leave the pipeline."""
    written = next(iter(comps.transforms[parts["WriteBundles"]].outputs.values()))
    names = next(iter(comps.transforms[parts["Extract"]].outputs.values()))
    for t in comps.transforms.values():
        for tag, pcoll in list(t.inputs.items()):
            if pcoll == names:
                t.inputs[tag] = written
    leaving = _regroup(comps, parts)
    for tid in leaving:
        for pcoll in comps.transforms[tid].outputs.values():
            comps.pcollections.pop(pcoll, None)
    for tid in leaving:
        del comps.transforms[tid]
    kept = [tid for tid in impl.subtransforms if tid not in leaving]
    del impl.subtransforms[:]
    impl.subtransforms.extend(kept)
