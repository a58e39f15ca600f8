"""How a failed task tells the driver what failed, whatever Spark and Py4J wrap it in.

The task raises a RuntimeError whose text carries a base64 JSON payload between a marker and
`:END`; the driver finds it in any error text and rebuilds the stage, transform, exception type,
message and the user's traceback. `kind` says whose fault it was: "user" code or an SDK
"worker" that died or never connected.
"""
from __future__ import annotations

import base64
import json
import re
import traceback

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
    payload = {
        "kind": kind,  # "user": user code failed; "worker": an SDK worker died or never came
        "stage": stage.display,
        "transform": transform,
        "type": type(exc).__name__,
        "message": _WHILE_RUNNING.sub("", text).strip(),
        "traceback": "".join(traceback.format_exception(exc))[-20000:],
    }
    encoded = base64.b64encode(json.dumps(payload).encode()).decode()
    return f"{ERROR_MARKER}{encoded}:END in {stage.display}: {type(exc).__name__}: {text[:500]}"


def parse_error_payload(text: str) -> dict[str, str] | None:
    """The payload a failed task raised, found in any error text that carries it."""
    match = re.search(re.escape(ERROR_MARKER) + r"([A-Za-z0-9+/=]+):END", text)
    if not match:
        return None
    return json.loads(base64.b64decode(match.group(1)))
