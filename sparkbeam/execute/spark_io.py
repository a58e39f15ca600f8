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

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from sparkbeam.engine.context import pipeline_context
from sparkbeam.errors import ExecutionError
from sparkbeam.execute.dataset import Datasets
from sparkbeam.plan.native_spark import SparkRead, RunnerWrite


def _loads(payload: bytes) -> Any:
    from apache_beam.internal import pickler

    return pickler.loads(payload)


def _coder(components: bytes, coder_id: str) -> Any:
    return pipeline_context(components).coders[coder_id].get_impl()


def _encoder(components: bytes, coder_id: str) -> Callable[[Any], bytes]:
    """A row's wire encoding under the windowed coder `coder_id`, as a bounded read's
    element (global window, minimum timestamp). Under the parameterised coder the plan
    gives reads (`plan/native_spark.py`) that is the row's own encoding: no windowed value
    made per row (~0.5 us of ~4)."""
    from apache_beam.coders.coders import ParamWindowedValueCoder
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.timestamp import MIN_TIMESTAMP
    from apache_beam.utils.windowed_value import WindowedValue

    coder = pipeline_context(components).coders[coder_id]
    if isinstance(coder, ParamWindowedValueCoder):
        return coder.wrapped_value_coder.get_impl().encode_nested  # type: ignore[no-any-return]
    impl, window = coder.get_impl(), (GlobalWindow(),)
    return lambda row: impl.encode_nested(  # type: ignore[no-any-return]
        WindowedValue(row, MIN_TIMESTAMP, window))


Batches = Iterator[pa.RecordBatch]


def read_query(ds: Datasets, read: SparkRead, coder_id: str, components: bytes
               ) -> tuple[Any, Callable[[Batches], Batches]]:
    """The DataFrame of `read`'s query, and what turns its Arrow batches, in a task, into
    stage input batches (input 0, no key, the row in the stage's wire encoding): done by the
    stage's own task where the read is its only input (`Datasets.map_stage(prepare=)`), else
    as a step of its own (`read_buffer`)."""
    source = _loads(read.source)
    try:
        df = source.query.dataframe(ds.spark)
    except Exception as exc:  # noqa: BLE001 - Spark's analysis errors, named by the transform
        raise ExecutionError(f"{read.transform}: Spark cannot read {read.described}: "
                             f"{type(exc).__name__}: {exc}") from exc

    def prepare(batches: Batches) -> Batches:
        encode, rows = _encoder(components, coder_id), source.to_beam()
        for batch in batches:
            try:
                values = pa.array([encode(row) for row in rows(batch)], pa.binary())
            except Exception as exc:
                # e.g. a null where the schema the pipeline was built with says none can be.
                raise ValueError(f"{read.transform}: a row of {read.described} does not fit "
                                 f"the Beam schema the pipeline was built with: "
                                 f"{type(exc).__name__}: {exc}") from exc
            yield pa.RecordBatch.from_arrays(
                [pa.nulls(len(values), pa.int32()).fill_null(0),
                 pa.nulls(len(values), pa.binary()), values], names=["input", "key", "value"])

    return df, prepare


def read_buffer(ds: Datasets, read: SparkRead, coder_id: str, components: bytes) -> Any:
    """The rows of `read`'s query as a buffer (key, value) of encoded elements."""
    df, prepare = read_query(ds, read, coder_id, components)
    return ds.encode_rows(df, prepare, f"{read.transform}: {read.described}")


def write_buffer(ds: Datasets, op: RunnerWrite, parts: list[Any], components: bytes
                 ) -> tuple[Any, Callable[[], None]]:
    """The target of `op` and the action writing the buffer's DataFrames (`parts`) to it."""
    target = _loads(op.payload)

    def decoder() -> Callable[[list[bytes]], pa.RecordBatch]:
        impl = _coder(components, op.coder_id)
        # A row in several windows is that many elements (Beam's model; the expansion other
        # runners run writes it once per window too).
        return lambda values: target.to_arrow([
            wv.value for wv in map(impl.decode_nested, values) for _ in wv.windows])

    df = ds.decode_rows(ds.union(parts), decoder, target.struct(),
                        f"{op.transform}: {target.describe()}")
    return target, lambda: target.write(df)


__all__ = ["read_buffer", "write_buffer"]
