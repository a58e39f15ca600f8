"""Which pipeline a checkpoint directory belongs to: recorded by the first run, checked at every
Prepare after it (no pyspark). The fingerprint itself is `plan.fingerprint`'s."""
from __future__ import annotations

import json
import os
import uuid
from typing import Any

from sparkbeam.plan.fingerprint import fingerprint_differences
from sparkbeam.streaming.checkpoint import CheckpointLayout


def checkpoint_problem(checkpoint_dir: str, fingerprint: dict[str, Any]) -> str | None:
    """Why the pipeline may not run on `checkpoint_dir` (naming the directory and what
    differs), or None: the directory is new or empty, or it holds this same pipeline."""
    layout = CheckpointLayout(checkpoint_dir)
    try:
        with open(layout.pipeline_record, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        if _has_offsets(layout):
            return (f"checkpoint directory {checkpoint_dir} holds a streaming query's offsets "
                    "but no record of its pipeline (sparkbeam-pipeline.json): it was written "
                    "by another program or an older sparkbeam, and resuming it could skip "
                    "input. Use a new directory")
        return None
    try:
        recorded = json.loads(text)
    except ValueError:
        return (f"checkpoint directory {checkpoint_dir}: {layout.pipeline_record} is not "
                "JSON; use a new directory")
    differences = fingerprint_differences(recorded, fingerprint)
    if not differences:
        return None
    return (f"checkpoint directory {checkpoint_dir} belongs to another pipeline ("
            + "; ".join(differences) + "); a job resumes only its own checkpoint. Use a new "
            "directory for this pipeline, or run the pipeline that wrote it")


def record_pipeline(checkpoint_dir: str, fingerprint_json: str) -> None:
    """Writes the record (the plan's fingerprint, as JSON) if the directory has none (a
    restarted job keeps the first)."""
    layout = CheckpointLayout(checkpoint_dir)
    if os.path.exists(layout.pipeline_record):
        return
    os.makedirs(checkpoint_dir, exist_ok=True)
    temporary = f"{layout.pipeline_record}.{uuid.uuid4().hex}.tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(fingerprint_json)
    os.replace(temporary, layout.pipeline_record)


def _has_offsets(layout: CheckpointLayout) -> bool:
    try:
        return any(name.isdigit() for name in os.listdir(layout.offsets))
    except FileNotFoundError:
        return False
