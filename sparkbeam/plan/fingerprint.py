"""A streaming job's pipeline, recorded in its checkpoint directory and compared on restart.

Spark resumes a query from its checkpoint whatever the query now is: a different pipeline on
the same `--checkpoint_dir` either resumes the old one's offsets (and may write nothing, since
its sources seem consumed) or fails with Spark's raw assertion about the number of sources. So
the first run writes what identifies its pipeline and every later Prepare compares: the
transforms (names and kinds), each PCollection's coder and windowing, and the stage layout
(which transforms share a stage, which of them keep state). Pickled payloads (DoFns, Python
coders and WindowFns) are left out: their bytes may differ between two runs of the same code,
and a changed DoFn body is a change Spark's checkpoint allows (as Dataflow's update does).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import beam_runner_api_pb2, schema_pb2

from sparkbeam.plan.model import Plan

FINGERPRINT_VERSION = 1
_PICKLED = {python_urns.PICKLED_CODER, python_urns.PICKLED_WINDOWFN}
_ROW = common_urns.coders.ROW.urn
_SHOWN = 8  # differences named in an error; the rest are counted


def pipeline_fingerprint(proto: beam_runner_api_pb2.Pipeline, plan: Plan) -> dict[str, Any]:
    """What identifies the pipeline to a checkpoint (JSON-ready)."""
    comps = proto.components
    transforms = {}
    for tid, t in comps.transforms.items():
        if t.subtransforms or not t.spec.urn:
            continue
        transforms[t.unique_name or tid] = t.spec.urn
    names = {tid: (t.unique_name or tid) for tid, t in comps.transforms.items()}
    pcollections = {}
    for pid, pc in comps.pcollections.items():
        pcollections[pc.unique_name or pid] = {
            "coder": _coder(comps, pc.coder_id),
            "windowing": _windowing(comps, pc.windowing_strategy_id),
        }
    stages = [
        {"kind": stage.kind.value,
         "transforms": sorted(names.get(t, t) for t in stage.transforms)}
        for stage in plan.stages
    ]
    return {"version": FINGERPRINT_VERSION, "transforms": transforms,
            "pcollections": pcollections, "stages": stages}


def fingerprint_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between a recorded fingerprint and the current one, readably (empty when
    they are the same pipeline)."""
    if recorded.get("version") != current.get("version"):
        return [f"recorded by another sparkbeam version (fingerprint v{recorded.get('version')}, "
                f"this one writes v{current.get('version')})"]
    found: list[str] = []
    old_t, new_t = recorded.get("transforms", {}), current["transforms"]
    found += [f"transform '{n}' is new" for n in sorted(set(new_t) - set(old_t))]
    found += [f"transform '{n}' is gone" for n in sorted(set(old_t) - set(new_t))]
    found += [f"transform '{n}' was {old_t[n]}, is {new_t[n]}"
              for n in sorted(set(old_t) & set(new_t)) if old_t[n] != new_t[n]]
    old_p, new_p = recorded.get("pcollections", {}), current["pcollections"]
    for name in sorted(set(old_p) & set(new_p)):
        for part in ("coder", "windowing"):
            if old_p[name].get(part) != new_p[name][part]:
                found.append(f"PCollection '{name}' has another {part}")
    if not found and recorded.get("stages") != current["stages"]:
        found.append("the stage layout differs (transforms fused or keyed differently)")
    if len(found) > _SHOWN:
        found = found[:_SHOWN] + [f"and {len(found) - _SHOWN} more differences"]
    return found


def _coder(comps: beam_runner_api_pb2.Components, coder_id: str) -> Any:
    coder = comps.coders.get(coder_id)
    if coder is None:
        return coder_id
    return _spec(coder.spec) + [_coder(comps, c) for c in coder.component_coder_ids]


def _spec(spec: beam_runner_api_pb2.FunctionSpec) -> list[Any]:
    """A FunctionSpec's URN, and a digest of its payload unless that is a pickle (a row
    coder's schema without its ids)."""
    payload = _schema_without_ids(spec.payload) if spec.urn == _ROW else spec.payload
    return [spec.urn] + ([_digest(payload)]
                         if spec.payload and spec.urn not in _PICKLED else [])


def _schema_without_ids(payload: bytes) -> bytes:
    """A row coder's schema with its ids cleared: Beam gives a Python type's schema a fresh
    random id in each process, so two runs of the same code differ there only."""
    schema = schema_pb2.Schema.FromString(payload)
    stack = [schema]
    while stack:
        current = stack.pop()
        current.id = ""
        types = [f.type for f in current.fields]
        while types:
            ft = types.pop()
            kind = ft.WhichOneof("type_info")
            if kind == "row_type":
                stack.append(ft.row_type.schema)
            elif kind == "array_type":
                types.append(ft.array_type.element_type)
            elif kind == "iterable_type":
                types.append(ft.iterable_type.element_type)
            elif kind == "map_type":
                types.extend((ft.map_type.key_type, ft.map_type.value_type))
            elif kind == "logical_type":
                types.append(ft.logical_type.representation)
    return schema.SerializeToString(deterministic=True)


def _windowing(comps: beam_runner_api_pb2.Components, strategy_id: str) -> Any:
    ws = comps.windowing_strategies.get(strategy_id)
    if ws is None:
        return strategy_id
    return {
        "window_fn": _spec(ws.window_fn),
        "window_coder": _coder(comps, ws.window_coder_id),
        "trigger": _digest(ws.trigger.SerializeToString(deterministic=True)),
        "accumulation": int(ws.accumulation_mode),
        "output_time": int(ws.output_time),
        "allowed_lateness": int(ws.allowed_lateness),
        "merge": int(ws.merge_status),
    }


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def dumps(fingerprint: dict[str, Any]) -> str:
    return json.dumps(fingerprint, sort_keys=True, indent=1)
