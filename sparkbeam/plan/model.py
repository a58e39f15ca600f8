"""The Plan: what the executor needs to run a pipeline, as frozen dataclasses.

Protos travel as serialized bytes (PySpark cannot pickle upb messages captured in closures).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2

from sparkbeam.plan.native_spark import SparkRead, RunnerWrite
from sparkbeam.plan.native_text import TextRead

IMPULSE_BUFFER = b"impulse"

# Environments whose stages run on a Beam SDK worker of their own, reached over gRPC; every
# other stage runs on sparkbeam's embedded bundle processor (`control/lease.py` leases by this,
# the plan's rewrites for the embedded worker check it).
_GRPC_ENVIRONMENT_URNS = frozenset(
    [common_urns.environments.PROCESS.urn, common_urns.environments.EXTERNAL.urn]
)


def runs_embedded(environment: bytes) -> bool:
    """Whether a stage of this serialized environment runs on the embedded bundle processor
    (in whichever process leases it), not on an SDK worker of its own."""
    if not environment:
        return True
    env = beam_runner_api_pb2.Environment.FromString(environment)
    return env.urn not in _GRPC_ENVIRONMENT_URNS


class StageKind(enum.Enum):
    """How a stage's input reaches it and what it keeps between elements; computed once, when
    the plan is made. The executors and the checks dispatch on it through tables that fail
    closed (a kind without a row is an error, never a default)."""

    PLAIN = "plain"  # any partitioning; nothing kept across elements
    GROUPED = "grouped"  # reads GroupByKey output: partitioned by key, each key's rows together
    STATEFUL = "stateful"  # user state or timers: partitioned by key, keys finished in turn
    SPLITTABLE = "splittable"  # processes restrictions of a splittable DoFn: input spread
    STATEFUL_SPLITTABLE = "stateful splittable"  # both: refused at Prepare (`plan.check`)

    @property
    def keyed(self) -> bool:
        """Its input is partitioned by the encoded key, each key's rows together."""
        return self in (StageKind.GROUPED, StageKind.STATEFUL, StageKind.STATEFUL_SPLITTABLE)

    @property
    def stateful(self) -> bool:
        """It keeps user state or timers per key."""
        return self in (StageKind.STATEFUL, StageKind.STATEFUL_SPLITTABLE)

    @staticmethod
    def of(*, stateful: bool, grouped: bool, splittable: bool) -> StageKind:
        if stateful:
            return StageKind.STATEFUL_SPLITTABLE if splittable else StageKind.STATEFUL
        if grouped:
            return StageKind.GROUPED
        return StageKind.SPLITTABLE if splittable else StageKind.PLAIN


@dataclass(frozen=True)
class StageInput:
    """A DATA_INPUT transform of a stage and the buffer it reads."""

    transform_id: str
    buffer_id: bytes
    coder_id: str  # windowed coder of the elements on the data channel


@dataclass(frozen=True)
class StageOutput:
    """A DATA_OUTPUT transform of a stage and the buffer it writes."""

    transform_id: str
    buffer_id: bytes
    coder_id: str
    key_coder_id: str | None = None  # set when a consumer needs each element's key


@dataclass(frozen=True)
class TimerFamily:
    """A timer family of a stateful ParDo in a stage."""

    transform_id: str
    family_id: str
    coder_id: str
    time_domain: int


@dataclass(frozen=True)
class SideInputUse:
    """A side input read by a transform of a stage, materialised from a buffer."""

    transform_id: str
    tag: str
    buffer_id: bytes
    access_pattern: bytes  # serialized FunctionSpec
    coder_id: str  # windowed coder of the side input's elements


@dataclass(frozen=True)
class Grouping:
    """A runner-executed GroupByKey: its buffer is grouped by key (and window) when read."""

    buffer_id: bytes
    transform_id: str
    input_coder_id: str
    output_coder_id: str
    windowing_strategy_id: str
    # Batch: grouped per window by the runner (the default trigger, windows other than the
    # trivial global one: `engine/grouping.py`), else by Beam's GroupingBuffer.
    by_window: bool = False
    # Batch, the global window grouped from columns (`engine/keyed_columns.py`): every row of
    # its buffer is a count and that many of a key's values, encoded without their windowed
    # headers and keys (`plan/packed_rows.py`), never an element.
    counted: bool = False
    # Batch, Beam's Sessions grouped per window: every row of its buffer is a count and that
    # many of a key's window bounds and values, or a count of 0 and one element
    # (`engine/session_rows.py`, `plan/packed_rows.py`).
    session_rows: bool = False


@dataclass(frozen=True)
class DirectChain:
    """A plain stage whose Map/FlatMap/Filter functions (and lifted combiner) batch calls
    directly (`plan/direct_paths.py`): its input's data transform, the ParDos in order
    (transform id, output PCollection), the pre-combine ending the chain if any, the output's
    data transform, and every PCollection the chain reads or writes, in order."""

    input_transform: str
    steps: tuple[tuple[str, str], ...]
    combine: str | None
    output_transform: str
    pcollections: tuple[str, ...]


@dataclass(frozen=True)
class Stage:
    """A fused stage: one ProcessBundleDescriptor run as Spark tasks."""

    index: int
    name: str
    label: str  # readable id, e.g. "stage-003"
    description: str  # user-facing transform names, for the Spark UI and errors
    transforms: tuple[str, ...]
    descriptor: bytes
    inputs: tuple[StageInput, ...]
    outputs: tuple[StageOutput, ...]
    side_inputs: tuple[SideInputUse, ...] = ()
    timers: tuple[TimerFamily, ...] = ()
    kind: StageKind = StageKind.PLAIN
    environment_id: str = ""  # the SDK environment its transforms run in
    environment: bytes = b""  # that Environment, serialized (tasks pick their worker by it)
    direct: DirectChain | None = None  # batch: its functions called without the SDK's harness
    # Batch: the stateful ParDo (transform id) called without the SDK's harness.
    direct_stateful: str | None = None

    @property
    def display(self) -> str:
        return f"{self.label} [{self.description}]"


@dataclass(frozen=True)
class Plan:
    """A pipeline turned into stages in topological order."""

    components: bytes
    stages: tuple[Stage, ...]
    groupings: dict[bytes, Grouping] = field(default_factory=dict)
    pickle_library: str = "default"
    # Streaming: why it runs as a stream without --streaming ("" if the flag said so or in
    # batch), and the pipeline's fingerprint its checkpoint directory records (JSON).
    streaming_reason: str = ""
    fingerprint: str = ""
    # Batch: buffers Spark makes by itself (`plan/native_text.py`), and which path each
    # translatable transform took and why, one line each.
    text_reads: dict[bytes, TextRead] = field(default_factory=dict)
    # ReadFromSpark's queries by buffer, and WriteToSpark's writes of buffers (`native_spark.py`).
    spark_reads: dict[bytes, SparkRead] = field(default_factory=dict)
    spark_writes: tuple[RunnerWrite, ...] = ()
    # Streaming: exactly-once WriteToKafka's writes of buffers (`plan/stream_plan.py`).
    kafka_writes: tuple[RunnerWrite, ...] = ()
    decisions: tuple[str, ...] = ()
    # Batch: transforms whose stages stay Spark tasks though they now feed only side inputs
    # (`plan/write_results.py`: a write's WriteBundles, which fed a shuffle in Beam's expansion).
    kept_in_spark: frozenset[str] = frozenset()
    # Batch: buffers whose producers may pack several of a key's elements in a row
    # (`plan/packed_rows.py`).
    packed: frozenset[bytes] = frozenset()


def side_input_proto(stage: Stage, use: SideInputUse) -> beam_runner_api_pb2.SideInput:
    """The SideInput of `use` as the stage's descriptor declares it."""
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
    payload = beam_runner_api_pb2.ParDoPayload.FromString(
        descriptor.transforms[use.transform_id].spec.payload)
    if use.tag not in payload.side_inputs:
        raise KeyError(f"{stage.label}: transform {use.transform_id} has no side input {use.tag}")
    return payload.side_inputs[use.tag]
