"""Side inputs: a materialised buffer turned into the state entries its readers request.

Mirrors FnApiRunnerExecutionContext.commit_side_inputs_to_state, per reading transform, on the
driver; the result is shipped to the tasks of the reading stage (no pyspark here).
"""
from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners import pipeline_context as beam_pipeline_context
from apache_beam.runners.portability.fn_api_runner.execution import WindowGroupingBuffer

from sparkbeam import urns
from sparkbeam.errors import ExecutionError
from sparkbeam.plan.model import SideInputUse


def side_input_state(
    uses: Iterable[SideInputUse],
    elements: Mapping[bytes, list[bytes]],
    ctx: beam_pipeline_context.PipelineContext,
) -> dict[bytes, list[bytes]]:
    """State key (serialized) -> data chunks, for every side input in `uses`."""
    state: dict[bytes, list[bytes]] = {}

    def put(key: beam_fn_api_pb2.StateKey, data: bytes) -> None:
        state.setdefault(key.SerializeToString(), []).append(data)

    for use in uses:
        spec = beam_runner_api_pb2.FunctionSpec.FromString(use.access_pattern)
        by_window = WindowGroupingBuffer(spec, ctx.coders[use.coder_id])
        # One stream of all the values: `append` decodes until its input ends, so this is
        # the same as a call per value, without a stream per value (100 k values of a pair of
        # ints: 0.13-0.15 s against 0.15-0.30 s).
        by_window.append(b"".join(elements.get(use.buffer_id, ())))
        if spec.urn == urns.SIDE_ITERABLE:
            for _, window, data, _ in by_window.encoded_items():
                put(beam_fn_api_pb2.StateKey(
                    iterable_side_input=beam_fn_api_pb2.StateKey.IterableSideInput(
                        transform_id=use.transform_id, side_input_id=use.tag, window=window)),
                    data)
        elif spec.urn == urns.SIDE_MULTIMAP:
            for key, window, data, count in by_window.encoded_items():
                put(beam_fn_api_pb2.StateKey(
                    multimap_side_input=beam_fn_api_pb2.StateKey.MultimapSideInput(
                        transform_id=use.transform_id, side_input_id=use.tag,
                        window=window, key=key)),
                    data)
                put(beam_fn_api_pb2.StateKey(
                    multimap_keys_side_input=beam_fn_api_pb2.StateKey.MultimapKeysSideInput(
                        transform_id=use.transform_id, side_input_id=use.tag, window=window)),
                    key)
                put(beam_fn_api_pb2.StateKey(
                    multimap_keys_values_side_input=beam_fn_api_pb2.StateKey.
                    MultimapKeysValuesSideInput(
                        transform_id=use.transform_id, side_input_id=use.tag, window=window)),
                    key + struct.pack(">i", count) + data)
        else:
            raise ExecutionError(
                f"side input '{use.tag}' of transform '{use.transform_id}' uses access pattern "
                f"{spec.urn}; expected {urns.SIDE_ITERABLE} or {urns.SIDE_MULTIMAP}"
            )
    return state
