"""One job's staging session: its state, its artifacts' futures, dedup decisions, its outcome.

States: REGISTERED (the job service registered the token) -> STAGING (a client connected)
-> STAGED or FAILED. FAILED is sticky and keeps the root cause, the first error from any
source (the client's stream, a write, a protocol violation, closing the service); every later
error is only a consequence. `wait` returns the staged artifacts or raises with that cause.
A failed session counts as ended only once all its writers have settled (deleted their
temporary files), so whoever sees the failure also sees a clean destination.
"""
from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from apache_beam.portability.api import beam_runner_api_pb2

from sparkbeam.artifacts.failures import (
    Aborted,
    StagingQuotaExceeded,
    StagingStateError,
    StagingTimeout,
    root_cause,
)
from sparkbeam.artifacts.flow import FailureLatch
from sparkbeam.artifacts.payloads import declared_sha256, file_artifact, original_name
from sparkbeam.artifacts.store import ArtifactStore, StagedContent
from sparkbeam.errors import ArtifactStagingError

_LOGGER = logging.getLogger(__name__)

ArtifactInformation = beam_runner_api_pb2.ArtifactInformation
DependencySets = dict[str, list[ArtifactInformation]]


class SessionState(enum.Enum):
    REGISTERED = "registered"
    STAGING = "staging"
    STAGED = "staged"
    FAILED = "failed"


@dataclass
class _Entry:
    artifact: ArtifactInformation  # as the client resolved it; gives the role to keep
    content: Future[StagedContent]
    transferred: bool  # False: satisfied by content staged already (dedup)


@dataclass(frozen=True)
class StagingSummary:
    """What a finished session moved: for logs and the job's message stream."""

    artifacts: int
    transferred: int
    transferred_bytes: int
    deduplicated: int
    skipped_bytes: int


class StagingSession:
    """Bookkeeping of one staging token; thread-safe."""

    def __init__(
        self,
        token: str,
        dependency_sets: Mapping[str, Sequence[ArtifactInformation]],
        store: ArtifactStore,
    ) -> None:
        self.token = token
        self.dependency_sets: DependencySets = {
            env: [_copy(a) for a in artifacts] for env, artifacts in dependency_sets.items()
        }
        self.latch = FailureLatch()
        self._store = store
        # Reentrant: failing the latch under this lock may settle a writer on this very thread
        # (its done-callback, `_settled`, takes the lock again).
        self._lock = threading.RLock()
        self._ended = threading.Event()
        self._state = SessionState.REGISTERED
        self._entries: dict[str, list[_Entry]] = {env: [] for env in self.dependency_sets}
        self._by_sha: dict[str, Future[StagedContent]] = {}
        self._by_identity: dict[bytes, Future[StagedContent]] = {}
        self._unsettled = 0
        self._result: DependencySets | None = None
        self.received_bytes = 0  # artifact bytes the client sent (quota)

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def error(self) -> BaseException | None:
        """The root cause of the failure, or None."""
        return self.latch.error

    def begin(self) -> None:
        """A client connected for this token; only the first one may stage."""
        with self._lock:
            if self._state is not SessionState.REGISTERED:
                raise StagingStateError(
                    f"staging token {self.token} is {self._state.value}: a client already "
                    "connected for it (expected a registered token nobody has staged yet)"
                )
            self._state = SessionState.STAGING

    def reuse(self, env: str, artifact: ArtifactInformation) -> bool:
        """Records `artifact` as satisfied without transfer if its content is known; or False.

        Known content: content with the artifact's declared sha256, staged before in the
        destination or in this session (or under way); or, for artifacts that declare no
        digest, the very same artifact (byte-identical description) in another environment
        of this session, as when environments share dependencies.
        """
        sha = declared_sha256(artifact)
        identity = artifact.SerializeToString(deterministic=True)
        with self._lock:
            content = self._by_sha.get(sha) if sha else self._by_identity.get(identity)
        if content is None and sha is not None:
            found = self._store.find(sha, original_name(artifact))
            if found is not None:
                content = Future()
                content.set_result(found)
        if content is None:
            return False
        with self._lock:
            self._entries[env].append(_Entry(artifact, content, transferred=False))
        return True

    def track(
        self, env: str, artifact: ArtifactInformation, content: Future[StagedContent]
    ) -> None:
        """Records an artifact being transferred; `content` resolves when it is committed."""
        sha = declared_sha256(artifact)
        identity = artifact.SerializeToString(deterministic=True)
        with self._lock:
            self._entries[env].append(_Entry(artifact, content, transferred=True))
            if sha is not None:
                self._by_sha.setdefault(sha, content)
            self._by_identity.setdefault(identity, content)
            self._unsettled += 1
        content.add_done_callback(self._settled)

    def count_received(self, size: int, quota: int | None, label: str) -> None:
        """Adds `size` received bytes; raises `StagingQuotaExceeded` once they pass `quota`."""
        with self._lock:
            self.received_bytes += size
            received = self.received_bytes
        if quota is not None and received > quota:
            raise StagingQuotaExceeded(
                f"{label}: the job's artifacts passed its staging quota of {quota} bytes "
                f"({received} bytes received so far; the server's --max-staged-bytes)"
            )

    def contents(self) -> list[StagedContent]:
        """The content this session staged or reuses, as far as it is committed."""
        with self._lock:
            futures = [e.content for entries in self._entries.values() for e in entries]
        return [f.result() for f in futures if f.done() and f.exception() is None]

    @property
    def idle(self) -> bool:
        """Not staging now: no client yet, or ended with every writer settled."""
        return self._ended.is_set() or self._state is SessionState.REGISTERED

    def futures(self) -> list[Future[StagedContent]]:
        """Every artifact's future, in no particular order."""
        with self._lock:
            return [e.content for entries in self._entries.values() for e in entries]

    def succeed(self) -> StagingSummary:
        """All futures resolved: builds the staged dependency sets and ends the session."""
        with self._lock:
            if self.latch.error is not None:
                raise Aborted(self.latch.error) from self.latch.error
            self._result = {
                env: [_staged_artifact(e) for e in entries]
                for env, entries in self._entries.items()
            }
            self._state = SessionState.STAGED
            summary = self._summary_locked()
        self._ended.set()
        return summary

    def fail(self, error: BaseException) -> bool:
        """Fails the session with `error` unless it already ended; True if this was the cause."""
        with self._lock:
            if self._state is SessionState.STAGED:
                return False
            first = self.latch.fail(root_cause(error))
            self._state = SessionState.FAILED
            ended = self._unsettled == 0
        if first:
            _LOGGER.warning("%s: artifact staging failed: %s", self.token, self.latch.error)
        if ended:
            self._ended.set()
        return first

    def wait(self, timeout: float | None = None) -> DependencySets:
        """The staged dependency sets; raises the failure, or `StagingTimeout`.

        A failure is reported even if some writer has not settled within `timeout`.
        """
        ended = self._ended.wait(timeout)
        error = self.latch.error
        if error is not None:
            raise ArtifactStagingError(
                f"artifact staging for {self.token} failed: {_describe(error)}"
            ) from error
        if not ended:
            raise StagingTimeout(
                f"artifact staging for {self.token} is still {self._state.value} after "
                f"{timeout}s (expected the client to finish ReverseArtifactRetrievalService)"
            )
        assert self._result is not None
        return {env: [_copy(a) for a in artifacts] for env, artifacts in self._result.items()}

    def _settled(self, _: Future[StagedContent]) -> None:
        with self._lock:
            self._unsettled -= 1
            ended = self._unsettled == 0 and self._state is SessionState.FAILED
        if ended:
            self._ended.set()

    def _summary_locked(self) -> StagingSummary:
        entries = [e for es in self._entries.values() for e in es]
        moved = {id(e.content): _staged(e).size for e in entries if e.transferred}
        reused = [_staged(e).size for e in entries if not e.transferred]
        return StagingSummary(
            artifacts=len(entries),
            transferred=len(moved),
            transferred_bytes=sum(moved.values()),
            deduplicated=len(reused),
            skipped_bytes=sum(reused),
        )


def _staged(entry: _Entry) -> StagedContent:
    return entry.content.result(timeout=0)


def _staged_artifact(entry: _Entry) -> ArtifactInformation:
    content = _staged(entry)
    return file_artifact(content.location, content.sha256, entry.artifact)


def _copy(artifact: ArtifactInformation) -> ArtifactInformation:
    copy = ArtifactInformation()
    copy.CopyFrom(artifact)
    return copy


def _describe(error: BaseException) -> str:
    if isinstance(error, ArtifactStagingError):
        return str(error)
    return f"{type(error).__name__}: {error}"
