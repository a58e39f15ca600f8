"""The one place where errors become gRPC status codes, and where error text is written.

A handler that lets an exception escape reaches the client as UNKNOWN with Python's repr;
every Job API handler runs inside `grpc_status(context, ...)` instead, which aborts the call
with the code of the first matching row of `STATUS_CODES` and the error's own message.
"""
from __future__ import annotations

import logging
import traceback
from types import TracebackType
from typing import Any

import grpc

from sparkbeam.errors import (
    JobNotFoundError,
    JobStateError,
    SparkBeamError,
    UnsupportedFeatureError,
)

_LOGGER = logging.getLogger(__name__)

# First match wins, so subclasses come before their bases.
STATUS_CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (JobNotFoundError, grpc.StatusCode.NOT_FOUND),  # unknown job or preparation id
    (UnsupportedFeatureError, grpc.StatusCode.UNIMPLEMENTED),  # the pipeline needs more
    (JobStateError, grpc.StatusCode.FAILED_PRECONDITION),  # not in this state
    (SparkBeamError, grpc.StatusCode.INVALID_ARGUMENT),  # bad pipeline or options
]


def status_code(exc: BaseException) -> grpc.StatusCode:
    """The gRPC code for an error raised while serving a Job API request.

    Anything not in STATUS_CODES is a bug of ours or of the executor: INTERNAL, never UNKNOWN.
    """
    for kind, code in STATUS_CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


class grpc_status:  # lower case: used like a function, `with grpc_status(context, "Run"):`
    """Runs a handler's body; an error aborts the call with its mapped code and message.

    A class rather than a @contextmanager so that type checkers know it never swallows an
    exception (`context.abort` always raises).
    """

    def __init__(self, context: Any, rpc: str, job_id: str = "") -> None:
        self._context = context
        self._where = f"{rpc} {job_id}".strip()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, SystemExit):
            # Something (an argument parser) tried to end the server from a handler thread:
            # the call fails, the server goes on.
            _LOGGER.error("%s tried to exit the server (SystemExit %s)", self._where, exc.code)
            self._context.abort(
                grpc.StatusCode.INTERNAL, f"{self._where} failed: SystemExit {exc.code}"
            )
        if exc is None or not isinstance(exc, Exception):
            return  # success, or GeneratorExit/KeyboardInterrupt: not ours to report
        code = status_code(exc)
        if code == grpc.StatusCode.INTERNAL:
            _LOGGER.error("%s failed unexpectedly", self._where, exc_info=exc)
            message = f"{self._where} failed: {type(exc).__name__}: {exc}"
        else:
            _LOGGER.info("%s refused (%s): %s", self._where, code.name, exc)
            message = str(exc)
        self._context.abort(code, message)


def describe_failure(job_id: str, error: BaseException | None) -> str:
    """The text a client sees when a job fails: the error, its causes and their tracebacks.

    A `UserCodeError` carries the user's traceback from the Spark task in its message.
    """
    if error is None:
        return f"{job_id} failed (the executor gave no error)"
    summary = f"{job_id} failed: {type(error).__name__}: {error}"
    # Our own errors already say what failed and where (and a UserCodeError holds the user's
    # traceback); the driver-side stack adds only noise, but their causes do not.
    shown = error.__cause__ if isinstance(error, SparkBeamError) else error
    if shown is None:
        return summary
    details = "".join(traceback.format_exception(shown)).rstrip()
    return f"{summary}\n\n{details}"
