"""A file write's bundles on the direct path (`engine/direct_writes.py`), without Spark: Beam's
own text sink writes what its `WriteBundles` would, an element its coder refuses writes nothing
of the batch, and a failing file fails the task naming the transform."""
from __future__ import annotations

import os
import tempfile

import pytest
from apache_beam.io import textio
from apache_beam.io.iobase import _WriteBundleDoFn
from apache_beam.transforms.window import GlobalWindow

from sparkbeam.engine.direct_steps import Step
from sparkbeam.engine.direct_writes import BundleWrites, WriteFailed
from sparkbeam.plan.direct_paths import is_bundle_write


def _writes(size: int = 1000, header: str | None = None) -> tuple[BundleWrites, str]:
    out = os.path.join(tempfile.mkdtemp(), "out")
    sink = textio._TextSink(out, header=header)  # noqa: SLF001 - Beam's own sink
    init = sink.initialize_write()
    dofn = _WriteBundleDoFn(sink)
    assert is_bundle_write(dofn)
    step = Step("t1", "Write/WriteBundles", dofn.process, 0, (None, init), {})
    return BundleWrites(step, size, 1 << 30), init


def _read(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def test_batches_go_to_one_file_per_bundle_as_beams_writer_writes_them() -> None:
    writes, _ = _writes(size=3, header="H")
    assert writes.write(["a", "é"], None) == ([], [])
    assert not writes.full()
    assert writes.write(["b"], [7]) == ([], [])
    assert writes.full()
    (finished,) = writes.finish()
    assert finished.windows == (GlobalWindow(),)
    assert finished.timestamp == GlobalWindow().max_timestamp()
    assert _read(finished.value) == ["H", "a", "é", "b"]
    assert writes.finish() == []  # nothing open: nothing handed on


class _NoText:
    def __str__(self) -> str:
        raise ValueError("no text")


def test_an_element_the_coder_refuses_writes_nothing_of_its_batch() -> None:
    writes, _ = _writes()
    writes.write(["a"], None)
    with pytest.raises(ValueError, match="no text"):
        writes.write(["b", _NoText()], None)
    (finished,) = writes.finish()
    assert _read(finished.value) == ["a"]


def test_a_failing_file_fails_naming_the_transform() -> None:
    writes, _ = _writes()
    writes.write(["a"], None)
    writes.writer.temp_handle.close()  # the file goes away under the writer
    with pytest.raises(WriteFailed, match=r"Write/WriteBundles: writing a bundle's file failed"):
        writes.write(["b"], None)
    assert writes.finish() == []  # the failed file is never handed on


def test_a_sink_writing_records_its_own_way_keeps_the_bundle_processor() -> None:
    class Own(textio._TextSink):  # noqa: SLF001
        def write_record(self, file_handle, value):  # type: ignore[no-untyped-def]
            super().write_record(file_handle, value.upper())

    assert not is_bundle_write(_WriteBundleDoFn(Own(os.path.join(tempfile.mkdtemp(), "o"))))
