"""Why artifact staging or retrieval failed, and the gRPC status each failure becomes.

Every error here is an `ArtifactStagingError`, so the job service catches one type. The kinds
differ only in the status code a client sees; `STATUS_CODES` is the one table that maps them.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc

from sparkbeam.errors import ArtifactStagingError

_LOGGER = logging.getLogger(__name__)


class UnknownStagingToken(ArtifactStagingError):
    """No job was registered under this staging token."""


class StagingStateError(ArtifactStagingError):
    """The request does not fit the session's state (registered twice, staged twice, ...)."""


class InvalidArtifactRequest(ArtifactStagingError):
    """The client sent something malformed or out of protocol order (bad input)."""


class ClientStreamError(ArtifactStagingError):
    """The client's stream broke, was cancelled, or ended before staging finished."""


class ArtifactStorageError(ArtifactStagingError):
    """Writing, committing or reading a staged artifact in the destination failed."""


class StagingQuotaExceeded(ArtifactStagingError):
    """A job sent more artifact bytes than its staging quota allows."""


class ArtifactNotFound(ArtifactStagingError):
    """A worker asked for an artifact that is not staged here."""


class ServiceClosed(ArtifactStagingError):
    """The artifact service was closed while staging was under way."""


class StagingTimeout(ArtifactStagingError, TimeoutError):
    """Staging was still under way when the caller's timeout passed."""


class Aborted(ArtifactStagingError):
    """Work given up because the session already failed; `cause` is the session's root cause."""

    def __init__(self, cause: BaseException, what: str = "artifact staging") -> None:
        self.cause = cause
        super().__init__(f"{what} aborted: {type(cause).__name__}: {cause}")


# First match wins, so subclasses come before their bases.
STATUS_CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (UnknownStagingToken, grpc.StatusCode.NOT_FOUND),
    (ArtifactNotFound, grpc.StatusCode.NOT_FOUND),
    (StagingStateError, grpc.StatusCode.FAILED_PRECONDITION),
    (InvalidArtifactRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (StagingQuotaExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ClientStreamError, grpc.StatusCode.ABORTED),
    (ArtifactStorageError, grpc.StatusCode.INTERNAL),
    (ServiceClosed, grpc.StatusCode.UNAVAILABLE),
    (StagingTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
]


def root_cause(exc: BaseException) -> BaseException:
    """The error behind `Aborted` wrappers: what actually went wrong first."""
    while isinstance(exc, Aborted):
        exc = exc.cause
    return exc


def status_code(exc: BaseException) -> grpc.StatusCode:
    """The gRPC code of a failure; anything unexpected is INTERNAL, never UNKNOWN."""
    exc = root_cause(exc)
    for kind, code in STATUS_CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


def status_message(exc: BaseException) -> str:
    """The text a client reads: our own errors speak for themselves, others get their type."""
    exc = root_cause(exc)
    if isinstance(exc, ArtifactStagingError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


@contextmanager
def grpc_errors(context: Any, rpc: str) -> Iterator[None]:
    """Runs a servicer method's body; an error aborts the call with its code and message.

    Also wraps generator bodies: `GeneratorExit` is not an `Exception`, so it passes through.
    """
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - every error becomes a status, none escapes
        code = status_code(exc)
        if code == grpc.StatusCode.INTERNAL and not isinstance(
            root_cause(exc), ArtifactStagingError
        ):
            _LOGGER.exception("%s failed unexpectedly", rpc)
        else:
            _LOGGER.info("%s failed (%s): %s", rpc, code.name, status_message(exc))
        if context is None:
            raise
        context.abort(code, status_message(exc))
