"""The staging protocol driven in process (no sockets): Beam's client, and scripted clients."""
from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from apache_beam.portability.api import beam_artifact_api_pb2, beam_runner_api_pb2
from apache_beam.runners.portability import artifact_service as beam_artifacts

from sparkbeam.artifacts import ArtifactStagingService, LocalDirectory, payloads
from sparkbeam.artifacts.failures import (
    Aborted,
    ArtifactStorageError,
    ClientStreamError,
    InvalidArtifactRequest,
    ServiceClosed,
    StagingStateError,
    StagingTimeout,
    UnknownStagingToken,
    status_code,
    status_message,
)
from sparkbeam.errors import ArtifactStagingError

pytestmark = pytest.mark.timeout(60)

Response = beam_artifact_api_pb2.ArtifactResponseWrapper


def client_file(directory: Path, name: str, data: bytes) -> beam_runner_api_pb2.ArtifactInformation:
    path = directory / name
    path.write_bytes(data)
    return beam_runner_api_pb2.ArtifactInformation(
        type_urn=payloads.FILE_URN,
        type_payload=beam_runner_api_pb2.ArtifactFilePayload(path=str(path)).SerializeToString(),
        role_urn=payloads.STAGING_TO_URN,
        role_payload=beam_runner_api_pb2.ArtifactStagingToRolePayload(
            staged_name=name
        ).SerializeToString(),
    )


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ArtifactStagingService]:
    staging = ArtifactStagingService(
        LocalDirectory(tmp_path / "staged"), max_pending_bytes=64, writer_threads=2,
        queue_chunks=2,
    )
    yield staging
    staging.close()


def staged_files(tmp_path: Path) -> list[str]:
    return sorted(os.listdir(tmp_path / "staged"))


def in_process_stub(service: ArtifactStagingService) -> Any:
    return SimpleNamespace(ReverseArtifactRetrievalService=service.stage)


def beam_retrieval(chunk_size: int = 10) -> Any:
    return beam_artifacts.ArtifactRetrievalService(
        beam_artifacts.BeamFilesystemHandler(None).file_reader, chunk_size=chunk_size
    )


def scripted(*messages: Response | BaseException) -> Iterator[Response]:
    for message in messages:
        if isinstance(message, BaseException):
            raise message
        yield message


def token(value: str) -> Response:
    return Response(staging_token=value)


def resolved(*artifacts: beam_runner_api_pb2.ArtifactInformation) -> Response:
    return Response(
        resolve_artifact_response=beam_artifact_api_pb2.ResolveArtifactsResponse(
            replacements=list(artifacts)
        )
    )


def chunk(data: bytes, is_last: bool = False) -> Response:
    return Response(
        get_artifact_response=beam_artifact_api_pb2.GetArtifactResponse(data=data), is_last=is_last
    )


def test_beam_client_in_process_round_trip(service: ArtifactStagingService, tmp_path: Path) -> None:
    shared = client_file(tmp_path, "shared.txt", b"shared bytes " * 20)
    wheel = client_file(tmp_path, "pkg.whl", os.urandom(1000))
    service.register_job("job-1", {"a": [wheel, shared], "b": [shared], "c": []})
    beam_artifacts.offer_artifacts(in_process_stub(service), beam_retrieval(), "job-1")
    deps = service.resolved_deps("job-1", timeout=10)
    assert service.is_staged("job-1") and list(deps) == ["a", "b", "c"] and deps["c"] == []
    for env, originals in (("a", [wheel, shared]), ("b", [shared])):
        for staged, original in zip(deps[env], originals, strict=True):
            payload = beam_runner_api_pb2.ArtifactFilePayload.FromString(staged.type_payload)
            source = beam_runner_api_pb2.ArtifactFilePayload.FromString(original.type_payload)
            data = Path(source.path).read_bytes()
            assert staged.type_urn == payloads.FILE_URN
            assert Path(payload.path).read_bytes() == data
            assert payload.sha256 == hashlib.sha256(data).hexdigest()
            assert staged.role_urn == original.role_urn
            assert staged.role_payload == original.role_payload
    assert len(staged_files(tmp_path)) == 2


def test_empty_stream_is_a_client_error(service: ArtifactStagingService) -> None:
    with pytest.raises(ClientStreamError, match="ended its stream before sending the staging"):
        list(service.stage(scripted()))


def test_first_message_without_token_is_bad_input(service: ArtifactStagingService) -> None:
    with pytest.raises(InvalidArtifactRequest, match="expected the staging token in the stream's"):
        list(service.stage(scripted(resolved())))


def test_unknown_token(service: ArtifactStagingService) -> None:
    with pytest.raises(UnknownStagingToken, match="unknown staging token 'nope'"):
        list(service.stage(scripted(token("nope"))))
    with pytest.raises(UnknownStagingToken, match="unknown staging token 'nope'"):
        service.resolved_deps("nope")
    with pytest.raises(UnknownStagingToken):
        service.is_staged("nope")
    assert status_code(UnknownStagingToken("x")) == grpc.StatusCode.NOT_FOUND


def test_registering_a_token_twice_is_refused(service: ArtifactStagingService) -> None:
    service.register_job("job-1", {})
    with pytest.raises(StagingStateError, match="staging token job-1 is registered already"):
        service.register_job("job-1", {})
    with pytest.raises(InvalidArtifactRequest, match="non-empty staging token"):
        service.register_job("", {})


def test_wrong_reply_fails_the_session(service: ArtifactStagingService, tmp_path: Path) -> None:
    service.register_job("job-1", {"py": [client_file(tmp_path, "a", b"a")]})
    with pytest.raises(InvalidArtifactRequest, match=(
        "job-1: expected a ResolveArtifactsResponse for environment 'py', "
        "got a GetArtifactResponse"
    )):
        list(service.stage(scripted(token("job-1"), chunk(b"x"))))
    with pytest.raises(ArtifactStagingError, match="job-1 failed: .*expected a Resolve"):
        service.resolved_deps("job-1", timeout=5)
    assert not service.is_staged("job-1")


def test_stream_ending_mid_artifact_leaves_nothing(
    service: ArtifactStagingService, tmp_path: Path
) -> None:
    artifact = client_file(tmp_path, "big.bin", b"x" * 100)
    service.register_job("job-1", {"py": [artifact]})
    with pytest.raises(ClientStreamError, match=(
        "the client ended its stream before sending chunk 2 of artifact 'big.bin' #0 of "
        "environment 'py' \\(job-1\\)"
    )):
        list(service.stage(scripted(token("job-1"), resolved(artifact), chunk(b"x" * 40),
                                    chunk(b"x" * 40))))
    with pytest.raises(ArtifactStagingError, match="before sending chunk 2") as caught:
        service.resolved_deps("job-1", timeout=5)
    assert isinstance(caught.value.__cause__, ClientStreamError)
    assert staged_files(tmp_path) == []  # the temporary file is gone, no final name exists
    assert service.pending_bytes == 0


def test_stream_raising_mid_artifact(service: ArtifactStagingService, tmp_path: Path) -> None:
    artifact = client_file(tmp_path, "big.bin", b"x" * 100)
    service.register_job("job-1", {"py": [artifact]})
    with pytest.raises(ClientStreamError, match="stream failed .* ConnectionResetError: peer gone"):
        list(service.stage(scripted(token("job-1"), resolved(artifact), chunk(b"x" * 40),
                                    ConnectionResetError("peer gone"))))
    with pytest.raises(ArtifactStagingError, match="peer gone"):
        service.resolved_deps("job-1", timeout=5)
    assert staged_files(tmp_path) == []


def test_declared_digest_mismatch_is_bad_input(
    service: ArtifactStagingService, tmp_path: Path
) -> None:
    artifact = beam_runner_api_pb2.ArtifactInformation(
        type_urn=payloads.FILE_URN,
        type_payload=beam_runner_api_pb2.ArtifactFilePayload(
            path="/c/a.txt", sha256="0" * 64
        ).SerializeToString(),
    )
    service.register_job("job-1", {"py": [artifact]})
    with pytest.raises(Aborted) as caught:
        list(service.stage(scripted(token("job-1"), resolved(artifact),
                                    chunk(b"abc", is_last=True))))
    assert status_code(caught.value) == grpc.StatusCode.INVALID_ARGUMENT
    assert "expected content with the declared sha256 000" in status_message(caught.value)
    assert staged_files(tmp_path) == []


def test_a_second_client_for_a_token_under_way_is_refused_without_harm(
    service: ArtifactStagingService, tmp_path: Path
) -> None:
    artifact = client_file(tmp_path, "a", b"abc")
    service.register_job("job-1", {"py": [artifact]})
    first = service.stage(scripted(token("job-1"), resolved(artifact),
                                   chunk(b"abc", is_last=True)))
    next(first)  # the first client is connected: the server asked it to resolve
    with pytest.raises(StagingStateError, match="staging token job-1 is staging"):
        list(service.stage(scripted(token("job-1"))))
    list(first)
    assert service.is_staged("job-1")
    with pytest.raises(StagingStateError, match="staging token job-1 is staged"):
        list(service.stage(scripted(token("job-1"))))


def test_resolved_deps_times_out_while_the_client_is_away(
    service: ArtifactStagingService,
) -> None:
    service.register_job("job-1", {})
    with pytest.raises(StagingTimeout, match="job-1 is still registered after 0.01s") as caught:
        service.resolved_deps("job-1", timeout=0.01)
    assert isinstance(caught.value, TimeoutError)


def test_close_fails_sessions_under_way_and_releases_their_client(tmp_path: Path) -> None:
    service = ArtifactStagingService(LocalDirectory(tmp_path / "staged"), max_pending_bytes=8)
    artifact = client_file(tmp_path, "a", b"x" * 100)
    service.register_job("job-1", {"py": [artifact]})
    gate = threading.Event()

    def stalling_client() -> Iterator[Response]:
        yield token("job-1")
        yield resolved(artifact)
        yield chunk(b"x" * 50)
        gate.wait(10)  # the client stalls mid-artifact
        yield chunk(b"x" * 50)

    errors: list[BaseException] = []

    def run() -> None:
        try:
            list(service.stage(stalling_client()))
        except ArtifactStagingError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    with pytest.raises(StagingTimeout):
        service.resolved_deps("job-1", timeout=0.2)
    service.close()
    with pytest.raises(ArtifactStagingError, match="the artifact staging service was closed"):
        service.resolved_deps("job-1", timeout=5)
    gate.set()
    thread.join(10)
    assert not thread.is_alive()
    assert status_code(errors[0]) == grpc.StatusCode.UNAVAILABLE
    assert staged_files(tmp_path) == []
    with pytest.raises(ServiceClosed, match="cannot register job-2: the service is closed"):
        service.register_job("job-2", {})


def test_on_message_errors_do_not_fail_staging(tmp_path: Path) -> None:
    def broken(_token: str, _text: str) -> None:
        raise RuntimeError("listener bug")

    service = ArtifactStagingService(LocalDirectory(tmp_path / "staged"), on_message=broken)
    try:
        service.register_job("job-1", {"py": [client_file(tmp_path, "a", b"abc")]})
        beam_artifacts.offer_artifacts(in_process_stub(service), beam_retrieval(), "job-1")
        assert service.is_staged("job-1")
    finally:
        service.close()


@pytest.mark.parametrize(
    "error, code",
    [
        (UnknownStagingToken("x"), grpc.StatusCode.NOT_FOUND),
        (InvalidArtifactRequest("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (StagingStateError("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (ClientStreamError("x"), grpc.StatusCode.ABORTED),
        (ArtifactStorageError("x"), grpc.StatusCode.INTERNAL),
        (ServiceClosed("x"), grpc.StatusCode.UNAVAILABLE),
        (Aborted(ArtifactStorageError("disk")), grpc.StatusCode.INTERNAL),  # the root decides
        (KeyError("bug"), grpc.StatusCode.INTERNAL),  # never UNKNOWN
    ],
)
def test_status_codes(error: BaseException, code: grpc.StatusCode) -> None:
    assert status_code(error) == code


def test_constructor_refuses_nonsense(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="writer_threads must be positive, got 0"):
        ArtifactStagingService(LocalDirectory(tmp_path), writer_threads=0)
