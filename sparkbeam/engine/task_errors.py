"""How a failed task tells the driver what failed, whatever Spark and Py4J wrap it in.

The task raises a RuntimeError whose text carries a base64 JSON payload between a marker and
`:END`; the driver finds it in any error text (`stage_error`) and rebuilds the stage, transform,
exception type, message and the user's traceback. `kind` says whose fault it was: "user" code
or an SDK "worker" that died or never connected.
"""
from __future__ import annotations

import base64
import json
import re
import traceback

from sparkbeam.errors import ExecutionError, UserCodeError
from sparkbeam.plan.model import Stage

ERROR_MARKER = "SPARKBEAM-TASK-ERROR:"
_WHILE_RUNNING = re.compile(r"\[while running '(.+?)'\]")


def error_payload(stage: Stage, exc: BaseException, kind: str = "user") -> str:
    """Encodes a task failure so the driver can rebuild it whatever Spark wraps it in."""
    text = str(exc)
    match = _WHILE_RUNNING.search(text) or _WHILE_RUNNING.search(
        "".join(traceback.format_exception(exc))
    )
    transform = match.group(1) if match else (stage.description or stage.label)
    return encoded_error(stage.display, transform, exc, kind)


def encoded_error(where: str, transform: str, exc: BaseException, kind: str = "user") -> str:
    """`error_payload` for a failure in `where` (a stage, or a read the runner does itself:
    kind "worker", reported as the runner's error naming it)."""
    text = str(exc)
    payload = {
        "kind": kind,  # "user": user code failed; "worker": an SDK worker died or never came
        "stage": where,
        "transform": transform,
        "type": type(exc).__name__,
        "message": _WHILE_RUNNING.sub("", text).strip(),
        "traceback": "".join(traceback.format_exception(exc))[-20000:],
    }
    encoded = base64.b64encode(json.dumps(payload).encode()).decode()
    return f"{ERROR_MARKER}{encoded}:END in {where}: {type(exc).__name__}: {text[:500]}"


def parse_error_payload(text: str) -> dict[str, str] | None:
    """The payload a failed task raised, found in any error text that carries it."""
    match = re.search(re.escape(ERROR_MARKER) + r"([A-Za-z0-9+/=]+):END", text)
    if not match:
        return None
    return json.loads(base64.b64decode(match.group(1)))


def stage_error(stage: Stage | None, exc: BaseException, writing: str = "") -> Exception:
    """The error a Spark action failed with, as ours: the user's code (with its traceback),
    an SDK worker, or Spark itself failing while running `stage` (None: the job), or while
    the transform `writing` (a WriteToSpark) writes."""
    text = str(exc)
    payload = parse_error_payload(text)
    if payload is not None and payload.get("kind") == "worker":
        return ExecutionError(
            f"{payload['stage']}: {payload['type']}: {payload['message']}"
        )
    if payload is not None:
        return UserCodeError(
            stage=payload["stage"],
            transform=payload["transform"],
            exc_type=payload["type"],
            exc_message=payload["message"],
            user_traceback=payload["traceback"],
        )
    hidden = _masked_by_pyspark(exc)
    if hidden is not None:
        # PySpark's finally hid why the driver could not read the result; say that instead
        # (and what the JVM said, when PySpark raised its error over the hidden one).
        masked, outer = hidden
        text = f"reading the action's result from Spark's JVM: {masked}"
        if outer is not None:
            first = next((ln for ln in str(outer).splitlines() if ln.strip()), "")
            text += f" (then {type(outer).__name__}: {first})"
        exc = masked
    lines = [ln for ln in text.splitlines() if ln.strip()]
    kept = lines if len(lines) <= 6 else lines[:3] + ["..."] + lines[-3:]
    summary = "\n".join(kept)
    where = (f"{writing} (Spark's write)" if writing
             else stage.display if stage is not None else "the job")
    return ExecutionError(f"Spark failed while running {where}: {type(exc).__name__}: {summary}")


def _masked_by_pyspark(exc: BaseException) -> tuple[Exception, BaseException | None] | None:
    """The real error under PySpark's `_load_from_socket` (pyspark/util.py, 4.x): when the
    driver cannot connect to the socket a collect serves its result on (e.g. the JVM stopped
    waiting for it), that function's `finally` closes a file it never opened and raises
    UnboundLocalError ('sockfile'), whose context is the connect error. `toArrow` then asks
    the JVM's serving thread for its result in a `finally` of its own, whose error hides the
    UnboundLocalError in turn. So: the connect error, and the error raised over the
    UnboundLocalError (None when it is `exc` itself); None when there is no such error."""
    seen: BaseException | None = exc
    for depth in range(4):  # exc, or a few errors raised while handling it
        if seen is None:
            return None
        if isinstance(seen, UnboundLocalError) and isinstance(seen.__context__, Exception):
            frames = list(traceback.walk_tb(seen.__traceback__))
            if frames and frames[-1][0].f_code.co_name == "_load_from_socket":
                return seen.__context__, (exc if depth else None)
        seen = seen.__context__
    return None
