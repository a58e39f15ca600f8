"""WriteToFilesPerBatch's replace-not-add rule (`streaming/sinks.py`), with the Spark task's
identity given (no Spark)."""
from __future__ import annotations

import pytest

from sparkbeam.streaming import sinks
from sparkbeam.streaming.sinks import _WritePerBatch, read_lines


def _bundle(directory: str, lines: list[str]) -> None:
    """One bundle through a new DoFn instance, as a stage run key by key may do."""
    fn = _WritePerBatch(directory, ".txt")
    fn.setup()
    fn.start_bundle()
    for line in lines:
        list(fn.process(line))
    fn.finish_bundle()


def test_instances_of_one_task_attempt_add_and_a_retry_replaces(tmp_path, monkeypatch:
                                                                 pytest.MonkeyPatch) -> None:
    out = str(tmp_path)
    monkeypatch.setattr(sinks, "_task_identity", lambda: ("000003", 1, 70))
    _bundle(out, ["a"])
    _bundle(out, ["b", "c"])  # another key of the same attempt: added, nothing replaced
    assert sorted(read_lines(out)) == ["a", "b", "c"]
    monkeypatch.setattr(sinks, "_task_identity", lambda: ("000003", 1, 71))  # a retry
    _bundle(out, ["a"])
    assert read_lines(out) == ["a"]
    monkeypatch.setattr(sinks, "_task_identity", lambda: ("000003", 0, 72))  # other partition
    _bundle(out, ["z"])
    assert sorted(read_lines(out)) == ["a", "z"]
