"""ReadFromSpark and WriteToSpark run by Spark (`plan/native_spark.py`): the driver's side.

A read is the query's DataFrame turned, batch by batch in its own tasks, into a buffer of
elements in the consuming stage's wire encoding (global window, the minimum timestamp: what
Beam's bounded `Read` gives). A write is the input buffer decoded, batch by batch in its own
tasks, into Arrow batches of the target's Spark schema, and written by Spark's writer. The
objects that know the query, the target and the conversions (`io/spark.py`) arrive pickled in
the plan; this module only needs what they do:
- a source: `.query.dataframe(spark)`, `.query.describe()`, `.to_beam()` (Arrow batch ->
  Beam rows);
- a target: `.struct()` (its Spark schema), `.to_arrow(rows)`, `.write(df)`, `.describe()`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sparkbeam.engine.context import pipeline_context
from sparkbeam.execute.dataset import Datasets
from sparkbeam.plan.native_spark import SparkRead, SparkWriteOp


def _loads(payload: bytes) -> Any:
    from apache_beam.internal import pickler

    return pickler.loads(payload)


def _coder(components: bytes, coder_id: str) -> Any:
    return pipeline_context(components).coders[coder_id].get_impl()


def read_buffer(ds: Datasets, read: SparkRead, coder_id: str, components: bytes) -> Any:
    """The rows of `read`'s query as a buffer (key, value) of encoded elements."""
    source = _loads(read.source)
    df = source.query.dataframe(ds.spark)

    def encoder() -> Callable[[pa.RecordBatch], list[bytes]]:
        from apache_beam.transforms.window import GlobalWindow
        from apache_beam.utils.timestamp import MIN_TIMESTAMP
        from apache_beam.utils.windowed_value import WindowedValue

        impl, rows, window = _coder(components, coder_id), source.to_beam(), (GlobalWindow(),)
        return lambda batch: [impl.encode_nested(WindowedValue(row, MIN_TIMESTAMP, window))
                              for row in rows(batch)]

    return ds.encode_rows(df, encoder, f"{read.transform}: {read.described}")


def write_buffer(ds: Datasets, op: SparkWriteOp, parts: list[Any], components: bytes
                 ) -> tuple[Any, Callable[[], None]]:
    """The target of `op` and the action writing the buffer's DataFrames (`parts`) to it."""
    target = _loads(op.payload)

    def decoder() -> Callable[[list[bytes]], pa.RecordBatch]:
        impl = _coder(components, op.coder_id)
        return lambda values: target.to_arrow([impl.decode_nested(v).value for v in values])

    df = ds.decode_rows(ds.union(parts), decoder, target.struct(),
                        f"{op.transform}: {target.describe()}")
    return target, lambda: target.write(df)


__all__ = ["read_buffer", "write_buffer"]
