"""Errors -> gRPC status codes, in one table, and the failure text a client sees."""
from __future__ import annotations

import grpc
import pytest

from sparkbeam.errors import (
    JobNotFoundError,
    JobStateError,
    PlanningError,
    SparkBeamError,
    Unsupported,
    UnsupportedFeatureError,
    UserCodeError,
)
from sparkbeam.jobservice.status import describe_failure, grpc_status, status_code
from tests.unit.jobservice.fakes import USER_TRACEBACK

pytestmark = pytest.mark.timeout(30)


class Aborted(Exception):
    pass


class FakeContext:
    """Records the abort; like grpc, abort always raises."""

    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None
        self.details = ""

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        raise Aborted(details)


@pytest.mark.parametrize(
    "error, code",
    [
        (JobNotFoundError("no job 'x'"), grpc.StatusCode.NOT_FOUND),
        (UnsupportedFeatureError([Unsupported("a", "b")]), grpc.StatusCode.UNIMPLEMENTED),
        (JobStateError("running"), grpc.StatusCode.FAILED_PRECONDITION),
        (PlanningError("bad proto"), grpc.StatusCode.INVALID_ARGUMENT),
        (SparkBeamError("bad option"), grpc.StatusCode.INVALID_ARGUMENT),
        (KeyError("job-001"), grpc.StatusCode.INTERNAL),  # a LookupError is a bug, not UNKNOWN
        (RuntimeError("bug"), grpc.StatusCode.INTERNAL),
    ],
)
def test_each_error_has_one_code(error: Exception, code: grpc.StatusCode) -> None:
    assert status_code(error) == code
    context = FakeContext()
    with pytest.raises(Aborted), grpc_status(context, "GetState", "job-001"):
        raise error
    assert context.code == code
    assert context.code != grpc.StatusCode.UNKNOWN


def test_the_client_gets_the_errors_own_message() -> None:
    context = FakeContext()
    features = [Unsupported("transform beam:x", "transform 'A'"),
                Unsupported("coder beam:y", "pcollection 'B'")]
    with pytest.raises(Aborted), grpc_status(context, "Prepare"):
        raise UnsupportedFeatureError(features)
    assert "2 unsupported feature(s)" in context.details
    assert "transform 'A'" in context.details and "pcollection 'B'" in context.details


def test_unexpected_errors_name_the_rpc_and_job() -> None:
    context = FakeContext()
    with pytest.raises(Aborted), grpc_status(context, "Cancel", "job-007"):
        raise KeyError("handle")
    assert context.details == "Cancel job-007 failed: KeyError: 'handle'"


def test_success_and_generator_exit_pass_through() -> None:
    context = FakeContext()
    with grpc_status(context, "GetJobs"):
        pass
    with pytest.raises(GeneratorExit), grpc_status(context, "GetStateStream"):
        raise GeneratorExit
    assert context.code is None


def test_failure_text_carries_the_user_traceback() -> None:
    error = UserCodeError("stage-001", "Explode", "ValueError", "boom", USER_TRACEBACK)
    text = describe_failure("job-001", error)
    assert text.startswith("job-001 failed: UserCodeError: user code failed in transform")
    assert 'File "my_pipeline.py", line 7, in explode' in text


def test_failure_text_of_a_foreign_error_has_its_traceback_and_causes() -> None:
    def explode() -> None:
        try:
            raise OSError("disk gone")
        except OSError as exc:
            raise RuntimeError("stage-002 lost its output") from exc

    try:
        explode()
    except RuntimeError as exc:
        text = describe_failure("job-002", exc)
    assert text.startswith("job-002 failed: RuntimeError: stage-002 lost its output")
    assert "OSError: disk gone" in text and "in explode" in text
    assert describe_failure("job-003", None) == "job-003 failed (the executor gave no error)"
