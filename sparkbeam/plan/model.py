"""The Plan: what the executor needs to run a pipeline, as frozen dataclasses.

Protos travel as serialized bytes (PySpark cannot pickle upb messages captured in closures).
"""
from __future__ import annotations

from dataclasses import dataclass, field

IMPULSE_BUFFER = b"impulse"


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
    stateful: bool = False  # user state or timers: input partitioned by key, keys finished in turn
    keyed_input: bool = False  # input partitioned and sorted by key (stateful or grouped input)
    splittable: bool = False  # processes restrictions of a splittable DoFn: spread its input
    environment_id: str = ""  # the SDK environment its transforms run in
    environment: bytes = b""  # that Environment, serialized (tasks pick their worker by it)

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

    def consumers(self, buffer_id: bytes) -> list[Stage]:
        return [s for s in self.stages if any(i.buffer_id == buffer_id for i in s.inputs)]

    def side_input_consumers(self, buffer_id: bytes) -> list[Stage]:
        return [
            s for s in self.stages if any(si.buffer_id == buffer_id for si in s.side_inputs)
        ]
