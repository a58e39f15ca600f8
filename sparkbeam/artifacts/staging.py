"""The job server's side of Beam's reverse artifact retrieval (`ArtifactStagingService`).

The job service registers each job's dependencies under a staging token. The client then
opens `ReverseArtifactRetrievalService` and sends the token; the server asks it, environment
by environment, to resolve the artifacts, and for each resolved artifact whose content is not
staged already, to send it (`GetArtifact`, answered as a run of chunks ending with
`is_last`). One artifact is requested at a time, so a client buffers at most one.

Chunks go from the gRPC thread to a bounded pool of writer threads through bounded queues,
with the bytes in flight capped by an overflowing semaphore (see flow.py). The stream ends,
OK, only when every artifact is committed; any failure (a broken client stream, bad input,
a storage error, closing the service) fails the session with its root cause and ends the
stream with a gRPC status carrying that cause, and `resolved_deps` raises it.

To serve: `beam_artifact_api_pb2_grpc.add_ArtifactStagingServiceServicer_to_server(service,
server)`. Each staging stream holds one server thread until its artifacts are written.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from typing import Any

import grpc
from apache_beam.portability.api import (
    beam_artifact_api_pb2,
    beam_artifact_api_pb2_grpc,
    beam_runner_api_pb2,
)

from sparkbeam.artifacts.destinations import ArtifactDestination
from sparkbeam.artifacts.failures import (
    Aborted,
    ClientStreamError,
    InvalidArtifactRequest,
    ServiceClosed,
    StagingStateError,
    UnknownStagingToken,
    grpc_errors,
    status_message,
)
from sparkbeam.artifacts.flow import ChunkWriter, OverflowingSemaphore
from sparkbeam.artifacts.payloads import declared_sha256, describe, original_name
from sparkbeam.artifacts.session import SessionState, StagingSession, StagingSummary
from sparkbeam.artifacts.store import ArtifactStore, StagedContent

_LOGGER = logging.getLogger(__name__)

ArtifactRequestWrapper = beam_artifact_api_pb2.ArtifactRequestWrapper
ArtifactResponseWrapper = beam_artifact_api_pb2.ArtifactResponseWrapper


class ArtifactStagingService(beam_artifact_api_pb2_grpc.ArtifactStagingServiceServicer):
    """Stages the artifacts of registered jobs into `destination`, deduplicated by content.

    `max_pending_bytes` caps the bytes received but not yet written, over all sessions
    (one chunk may overshoot it); `writer_threads` bounds the threads that write; each
    artifact queues at most `queue_chunks` chunks; `max_staged_bytes` caps what one job may
    send (None: no cap). `release` forgets a job's session and deletes the files no other
    session uses. `on_message(staging_token, text)` receives
    user-visible milestones (what was staged, bytes skipped by dedup, failures).
    """

    def __init__(
        self,
        destination: ArtifactDestination,
        *,
        max_pending_bytes: int = 100 << 20,
        writer_threads: int = 4,
        queue_chunks: int = 16,
        max_staged_bytes: int | None = None,
        on_message: Callable[[str, str], None] | None = None,
    ) -> None:
        for name, value in (
            ("max_pending_bytes", max_pending_bytes),
            ("writer_threads", writer_threads),
            ("queue_chunks", queue_chunks),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self.destination = destination
        self._store = ArtifactStore(destination)
        self._budget = OverflowingSemaphore(max_pending_bytes)
        self._pool = futures.ThreadPoolExecutor(
            max_workers=writer_threads, thread_name_prefix="sparkbeam-artifact-writer"
        )
        self._queue_chunks = queue_chunks
        self._max_staged_bytes = max_staged_bytes
        self._on_message = on_message
        self._lock = threading.Lock()
        self._sessions: dict[str, StagingSession] = {}
        # Content of released sessions, deleted once no session is staging (one that is might
        # be about to reuse it) and none of the remaining sessions uses it.
        self._unreferenced: dict[str, StagedContent] = {}
        self._closed = False

    @property
    def pending_bytes(self) -> int:
        """Bytes received and not yet written, now."""
        return self._budget.in_use

    @property
    def peak_pending_bytes(self) -> int:
        """The most bytes ever received and not yet written at once."""
        return self._budget.peak

    def register_job(
        self,
        staging_token: str,
        dependency_sets: Mapping[str, Sequence[beam_runner_api_pb2.ArtifactInformation]],
    ) -> None:
        """Expects a client to stage these dependencies (environment id -> artifacts)."""
        if not staging_token:
            raise InvalidArtifactRequest("expected a non-empty staging token, got ''")
        session = StagingSession(staging_token, dependency_sets, self._store)
        with self._lock:
            if self._closed:
                raise ServiceClosed(f"cannot register {staging_token}: the service is closed")
            if staging_token in self._sessions:
                raise StagingStateError(f"staging token {staging_token} is registered already")
            self._sessions[staging_token] = session
        _LOGGER.info(
            "%s: registered %d artifact(s) in %d environment(s)",
            staging_token,
            sum(len(a) for a in session.dependency_sets.values()),
            len(session.dependency_sets),
        )

    def resolved_deps(
        self, staging_token: str, timeout: float | None = None
    ) -> dict[str, list[beam_runner_api_pb2.ArtifactInformation]]:
        """Environment id -> staged FILE artifacts (staged path and sha256; roles kept).

        Waits for the client to finish. Raises `ArtifactStagingError` with the root cause if
        staging failed, `StagingTimeout` (also a TimeoutError) if still under way after
        `timeout` seconds, `UnknownStagingToken` if the token was never registered.
        """
        return self._session(staging_token).wait(timeout)

    def release(self, staging_token: str) -> None:
        """Forgets a job's session (failing it if still under way) and deletes the staged
        files that no other session uses; a no-op for an unknown token."""
        with self._lock:
            session = self._sessions.pop(staging_token, None)
        if session is None:
            return
        session.fail(ServiceClosed(f"{staging_token} was released while staging"))
        with self._lock:
            for content in session.contents():
                self._unreferenced[content.name] = content
        self._delete_unreferenced()

    def _delete_unreferenced(self) -> None:
        # Under the lock, so no session begins staging (and reuses content) meanwhile.
        with self._lock:
            if not self._unreferenced or not all(s.idle for s in self._sessions.values()):
                return
            used = {c.name for s in self._sessions.values() for c in s.contents()}
            doomed = [c for name, c in self._unreferenced.items() if name not in used]
            self._unreferenced.clear()
            for content in doomed:
                self._store.index.forget(content.sha256)
                try:
                    self.destination.delete(content.name)
                except Exception:  # noqa: BLE001 - a file left behind must not fail a job
                    _LOGGER.warning("could not delete released artifact %s", content.name,
                                    exc_info=True)
        if doomed:
            _LOGGER.info("deleted %d released artifact(s)", len(doomed))

    def is_staged(self, staging_token: str) -> bool:
        """Whether every artifact of this token is staged (UnknownStagingToken if unknown)."""
        return self._session(staging_token).state is SessionState.STAGED

    def close(self) -> None:
        """Fails sessions under way, releases everyone waiting, and stops the writer threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sessions = list(self._sessions.values())
        error = ServiceClosed("the artifact staging service was closed")
        for session in sessions:
            session.fail(error)
        self._budget.fail(error)
        self._pool.shutdown(wait=True)
        _LOGGER.info("artifact staging service closed")

    def ReverseArtifactRetrievalService(  # noqa: N802 - the proto's name
        self, request_iterator: Iterator[ArtifactResponseWrapper], context: Any
    ) -> Iterator[ArtifactRequestWrapper]:
        with grpc_errors(context, "ReverseArtifactRetrievalService"):
            yield from self.stage(request_iterator, on_rpc_done=context.add_callback)

    def stage(
        self,
        responses: Iterator[ArtifactResponseWrapper],
        on_rpc_done: Callable[[Callable[[], None]], Any] | None = None,
    ) -> Iterator[ArtifactRequestWrapper]:
        """Drives one client's staging stream: yields requests, reads `responses`.

        `on_rpc_done(callback)` registers a callback for the end of the RPC, so a call that
        ends while this generator is suspended still fails the session.
        """
        first = _receive(responses, "the staging token (the stream's first message)")
        token = first.staging_token
        if not token:
            raise InvalidArtifactRequest(
                "expected the staging token in the stream's first message, got a "
                f"{_kind(first)} without one"
            )
        if self._closed:
            raise ServiceClosed(f"cannot stage {token}: the artifact staging service is closed")
        session = self._session(token)
        with self._lock:  # not while released content is being deleted
            session.begin()
        if on_rpc_done is not None:
            def call_ended() -> None:  # a no-op once the session has ended
                session.fail(ClientStreamError(
                    f"{token}: the staging call ended before staging finished "
                    "(cancelled by the client, or its deadline passed)"
                ))

            if on_rpc_done(call_ended) is False:  # the call is over already
                call_ended()
        self._message(
            token,
            f"staging {sum(len(a) for a in session.dependency_sets.values())} artifact(s) "
            f"of {len(session.dependency_sets)} environment(s)",
        )
        try:
            yield from self._exchange(session, responses)
            summary = self._await_writes(session)
        except GeneratorExit:
            session.fail(ClientStreamError(
                f"{token}: the staging stream was closed before staging finished"
            ))
            raise
        except Exception as exc:
            session.fail(exc)
            error = session.error
            assert error is not None
            self._message(token, f"artifact staging failed: {status_message(error)}")
            if error is exc:
                raise
            raise Aborted(error) from exc
        finally:
            self._delete_unreferenced()  # what waited for this session to end
        self._report(token, summary)

    def _exchange(
        self, session: StagingSession, responses: Iterator[ArtifactResponseWrapper]
    ) -> Iterator[ArtifactRequestWrapper]:
        token = session.token
        for env, artifacts in session.dependency_sets.items():
            if not artifacts:
                continue
            _LOGGER.info("%s: resolving %d artifact(s) of %r", token, len(artifacts), env)
            yield ArtifactRequestWrapper(
                resolve_artifact=beam_artifact_api_pb2.ResolveArtifactsRequest(artifacts=artifacts)
            )
            reply = _receive(responses, f"the resolution of environment {env!r}", token)
            if reply.WhichOneof("response") != "resolve_artifact_response":
                raise InvalidArtifactRequest(
                    f"{token}: expected a ResolveArtifactsResponse for environment {env!r}, "
                    f"got a {_kind(reply)}"
                )
            for index, artifact in enumerate(reply.resolve_artifact_response.replacements):
                session.latch.check()  # a writer failed: ask for nothing more
                label = f"{describe(artifact)} #{index} of environment {env!r} ({token})"
                if session.reuse(env, artifact):
                    _LOGGER.debug("%s: already staged", label)
                    continue
                yield ArtifactRequestWrapper(
                    get_artifact=beam_artifact_api_pb2.GetArtifactRequest(artifact=artifact)
                )
                writer: ChunkWriter[StagedContent] = ChunkWriter(
                    self._store.sink(
                        label=label,
                        original_name=original_name(artifact),
                        expected_sha256=declared_sha256(artifact),
                    ),
                    pool=self._pool,
                    budget=self._budget,
                    latch=session.latch,
                    max_queued=self._queue_chunks,
                    label=label,
                )
                session.track(env, artifact, writer.result)
                _receive_artifact(
                    responses, writer, label,
                    lambda size, label=label: session.count_received(  # type: ignore[misc]
                        size, self._max_staged_bytes, label),
                )

    def _await_writes(self, session: StagingSession) -> StagingSummary:
        """Blocks until every artifact is committed, or one write failed."""
        pending = session.futures()
        futures.wait(pending, return_when=futures.FIRST_EXCEPTION)
        session.latch.check()
        for future in pending:
            future.result()  # all done and none failed, unless the latch says otherwise
        return session.succeed()

    def _report(self, token: str, summary: StagingSummary) -> None:
        if summary.deduplicated:
            self._message(
                token,
                f"{summary.deduplicated} artifact(s) were staged already: "
                f"{summary.skipped_bytes} bytes not transferred again",
            )
        self._message(
            token,
            f"staged {summary.artifacts} artifact(s): {summary.transferred} transferred "
            f"({summary.transferred_bytes} bytes), {summary.deduplicated} deduplicated",
        )

    def _message(self, token: str, text: str) -> None:
        _LOGGER.info("%s: %s", token, text)
        if self._on_message is None:
            return
        try:
            self._on_message(token, text)
        except Exception:  # noqa: BLE001 - a broken listener must not fail staging
            _LOGGER.exception("%s: on_message raised", token)

    def _session(self, token: str) -> StagingSession:
        with self._lock:
            session = self._sessions.get(token)
        if session is None:
            raise UnknownStagingToken(
                f"unknown staging token {token!r}: no job was registered under it"
            )
        return session


def _receive_artifact(
    responses: Iterator[ArtifactResponseWrapper],
    writer: ChunkWriter[StagedContent],
    label: str,
    count: Callable[[int], None],
) -> None:
    """Feeds one artifact's chunks to its writer, up to and including the `is_last` one;
    `count` sees each chunk's size first (and may refuse it)."""
    chunks = 0
    while True:
        reply = _receive(responses, f"chunk {chunks} of {label}")  # the label names the token
        kind = reply.WhichOneof("response")
        if kind != "get_artifact_response" and not (kind is None and reply.is_last):
            raise InvalidArtifactRequest(
                f"expected a GetArtifactResponse (chunk {chunks}) of {label}, "
                f"got a {_kind(reply)}"
            )
        count(len(reply.get_artifact_response.data))
        writer.put(reply.get_artifact_response.data)
        chunks += 1
        if reply.is_last:
            writer.close()
            return


def _receive(
    responses: Iterator[ArtifactResponseWrapper], expecting: str, token: str = ""
) -> ArtifactResponseWrapper:
    """The client's next message; its absence or a broken stream is a `ClientStreamError`."""
    where = f"{token}: " if token else ""
    try:
        return next(responses)
    except StopIteration:
        raise ClientStreamError(
            f"{where}the client ended its stream before sending {expecting}"
        ) from None
    except grpc.RpcError as exc:
        raise ClientStreamError(
            f"{where}the client's stream broke (cancelled or disconnected) while the "
            f"server waited for {expecting}"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - whatever the stream raised, it is the client's
        raise ClientStreamError(
            f"{where}the client's stream failed while the server waited for {expecting}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _kind(reply: ArtifactResponseWrapper) -> str:
    kind = reply.WhichOneof("response")
    name = {
        "resolve_artifact_response": "ResolveArtifactsResponse",
        "get_artifact_response": "GetArtifactResponse",
    }.get(kind or "", "message with no response")
    return f"{name}{' (is_last)' if reply.is_last else ''}"
