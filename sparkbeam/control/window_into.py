"""An operation of the embedded SDK worker: a WindowInto(GlobalWindows) without a DoFn.

Beam's bundle processor runs every WindowInto as a ParDo of its `WindowIntoDoFn`, whose
`process` takes the window as a parameter: Beam's `PerWindowInvoker` then calls it once for each
of an element's windows, fills in its arguments through `insert_values_in_args`, and the DoFn
builds an `AssignContext`, asks `GlobalWindows.assign`, which makes a `GlobalWindow()` (its
`__init__` reads a proto constant and makes a `Timestamp` every time), and yields a new
`WindowedValue`. Beam's `WriteImpl` (every `WriteToText` and `FileBasedSink`) re-windows each
element it writes into the global window that way. Measured in-process on a sessions reduce
stage writing its sessions with WriteToText (bench/ANALYSIS.md): ~22 % of the stage.

For the global window, Beam's output is known without the DoFn: for each window of the element,
the element with its timestamp in the global window, with no pane (`PANE_INFO_UNKNOWN`, what a
`WindowedValue` built without one gets). `IntoGlobalWindowOperation` emits exactly that. The plan
(`plan/global_window.py`) gives such transforms `urns.INTO_GLOBAL_WINDOW` only in stages this
worker runs; a Beam SDK worker of its own never sees the URN. Importing this module registers it
with Beam's `BeamTransformFactory`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import common
from apache_beam.runners.worker import bundle_processor, operation_specs, operations
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils import windowed_value

from sparkbeam import urns

_IN_GLOBAL_WINDOW = (GlobalWindow(),)


class IntoGlobalWindowOperation(operations.Operation):  # type: ignore[misc]
    """Each element once per window it is in, in the global window, timestamp kept, no pane."""

    def process(self, o: Any) -> None:
        with self.scoped_process_state:
            for _ in o.windows:
                self.output(windowed_value.create(o.value, o.timestamp_micros, _IN_GLOBAL_WINDOW))


@bundle_processor.BeamTransformFactory.register_urn(
    urns.INTO_GLOBAL_WINDOW, beam_runner_api_pb2.WindowingStrategy)
def _create_into_global_window(
    factory: bundle_processor.BeamTransformFactory,
    transform_id: str,
    transform_proto: beam_runner_api_pb2.PTransform,
    parameter: beam_runner_api_pb2.WindowingStrategy,
    consumers: Mapping[str, list[operations.Operation]],
) -> IntoGlobalWindowOperation:
    op = IntoGlobalWindowOperation(
        common.NameContext(transform_proto.unique_name, transform_id),
        operation_specs.WorkerFlatten(None, [factory.get_only_output_coder(transform_proto)]),
        factory.counter_factory, factory.state_sampler)
    return factory.augment_oldstyle_op(op, transform_proto.unique_name, consumers)
