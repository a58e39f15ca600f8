"""One error hierarchy for sparkbeam.

Every message says what failed, where (job, stage, transform), what was expected and what came.
"""
from __future__ import annotations

from dataclasses import dataclass, field


class SparkBeamError(Exception):
    """Base class of every error sparkbeam raises on purpose."""


@dataclass(frozen=True)
class Unsupported:
    """One feature of a pipeline that sparkbeam cannot execute."""

    what: str  # e.g. "transform URN beam:transform:foo:v1"
    where: str  # e.g. "transform 'Read/Foo'"
    hint: str = ""

    def __str__(self) -> str:
        text = f"{self.what} in {self.where}"
        return f"{text} ({self.hint})" if self.hint else text


class UnsupportedFeatureError(SparkBeamError):
    """The pipeline uses features sparkbeam cannot run; all of them are listed at once."""

    def __init__(self, features: list[Unsupported]) -> None:
        self.features = list(features)
        lines = "\n".join(f"  - {f}" for f in self.features)
        super().__init__(
            f"sparkbeam cannot run this pipeline: {len(self.features)} unsupported "
            f"feature(s) found when preparing the job:\n{lines}"
        )


class InvalidPipelineError(SparkBeamError):
    """The pipeline proto is malformed: references that do not resolve, cycles, no transforms
    (a broken or hostile client, not a feature sparkbeam lacks)."""


class PlanningError(SparkBeamError):
    """The pipeline proto could not be turned into stages."""


@dataclass
class UserCodeError(SparkBeamError):
    """An exception raised by user code (a DoFn, a CombineFn, a coder) inside a Spark task."""

    stage: str
    transform: str
    exc_type: str
    exc_message: str
    user_traceback: str
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(str(self))

    def __str__(self) -> str:
        return (
            f"user code failed in transform '{self.transform}' of {self.stage}: "
            f"{self.exc_type}: {self.exc_message}\n"
            f"--- traceback from the Spark task ---\n{self.user_traceback}"
        )


class ExecutionError(SparkBeamError):
    """Spark failed to run a stage for a reason other than user code."""


class SdkWorkerError(ExecutionError, RuntimeError):
    """An SDK worker (PROCESS/EXTERNAL environment) could not start, died or was lost."""


class SdkWorkerTimeout(SdkWorkerError, TimeoutError):
    """An SDK worker did not connect in time."""


class JobCancelledError(SparkBeamError):
    """The job was cancelled while it ran."""


class JobNotFoundError(SparkBeamError):
    """No job or preparation has the id a Job API request named."""


class JobStateError(SparkBeamError):
    """A request does not fit the job's current state (run twice, drain a batch job, run
    a job whose artifacts were not staged, ...)."""


class ArtifactStagingError(SparkBeamError):
    """Staging a job's artifacts failed (client, transfer or storage); carries the root cause."""
