"""A file write's bundles written by a direct stage, as Beam's `_WriteBundleDoFn` writes them
(no pyspark).

Beam's `WriteImpl` (behind `WriteToText`, `WriteToParquet` and every `FileBasedSink`) ends the
stage that feeds it with `WriteBundles`: a DoFn that opens a writer on a bundle's first element
(`sink.open_writer(init_result, uuid)`), writes each element, hands on the writer's temporary
file when it is at capacity, and at the end of the bundle hands on the last one in the global
window at its maximum timestamp. `plan/direct_paths.is_bundle_write` admits it only where the
sink writes a record as `FileBasedSink.write_record` does: its coder's bytes, then
`write_encoded_record`.

A direct stage's "bundle" here is a run of its batches: the writer is closed once it holds
`--bundle_size` elements (by default 1,000,000, as a plain stage's bundle, even in a grouped
stage, whose bundles of the general path are 1,000 keys: fewer files, each an open, a close and
a rename less; Beam leaves the shard count to the runner when `num_shards` is not set) or
`--bundle_bytes` of their bytes, or when the task ends or hands over to the bundle processor.
A batch is still all or nothing: its records are encoded first, and an element the sink's
coder cannot encode hands the batch to the bundle processor before anything of it is written
(which then raises Beam's own error). A failure of the file itself, with records of the
batch written, fails the task (`WriteFailed`): those records cannot be taken back, and the
attempt's temporary files are never handed on, so no output holds them.
"""
from __future__ import annotations

import uuid
from typing import Any

from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from sparkbeam.engine.direct_steps import Step

_END = GlobalWindow().max_timestamp()


class WriteFailed(RuntimeError):
    """Writing a batch's records failed after some were written: the task fails."""


class BundleWrites:
    """One task's writes of a `WriteBundles` step (see the module doc)."""

    def __init__(self, step: Step, size: int, max_bytes: int) -> None:
        self.step = step
        dofn: Any = step.process.__self__  # type: ignore[attr-defined]  # a bound method
        self.sink = dofn.sink  # as its process reads it
        # The DoFn's one side input (its initialisation's result), filled in by `with_views`.
        (self.init_result,) = (a for i, a in enumerate(step.args) if i != step.element_at)
        self.size, self.max_bytes = size, max_bytes
        self.writer: Any = None
        self.written = self.bytes = 0

    def write(self, values: list[Any], src: list[int] | None) -> tuple[list[Any], list[int]]:
        """Writes a batch's values; the temporary files closed at capacity, each with the index
        of its element's windowed value (Beam hands such a file on in its element's window)."""
        encode = self.sink.coder.encode
        records = [encode(v) for v in values]  # raising here writes nothing: the batch hands over
        out: list[Any] = []
        out_src: list[int] = []
        try:
            for k, record in enumerate(records):
                if self.writer is None:
                    self.writer = self.sink.open_writer(self.init_result, str(uuid.uuid4()))
                    self.written = self.bytes = 0
                # `FileBasedSink.open_writer`'s (`is_bundle_write`): a `FileBasedSinkWriter`,
                # whose `write` is this with the record encoded again.
                writer = self.writer
                writer.num_records_written += 1
                self.sink.write_encoded_record(writer.temp_handle, record)
                self.written += 1
                self.bytes += len(record)
                if writer.at_capacity():
                    out.append(writer.close())
                    out_src.append(0 if src is None else src[k])
                    self.writer = None
        except Exception as exc:
            self.writer = None  # never closed, never handed on
            raise WriteFailed(f"{self.step.name}: writing a bundle's file failed: "
                              f"{exc!r}") from exc
        return out, out_src

    def full(self) -> bool:
        """Whether the open writer holds a bundle's worth."""
        return self.writer is not None and (self.written >= self.size
                                            or self.bytes >= self.max_bytes)

    def finish(self) -> list[WindowedValue]:
        """Beam's `finish_bundle`: the open writer's file, in the global window."""
        if self.writer is None:
            return []
        try:
            path = self.writer.close()
        except Exception as exc:
            raise WriteFailed(f"{self.step.name}: closing a bundle's file failed: "
                              f"{exc!r}") from exc
        finally:
            self.writer = None
        return [WindowedValue(path, _END, (GlobalWindow(),))]
