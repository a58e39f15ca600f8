"""Staging over real gRPC with Beam's own client side, and with clients that misbehave."""
from __future__ import annotations

import errno
import hashlib
import os
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from apache_beam.portability.api import beam_artifact_api_pb2, beam_runner_api_pb2

from sparkbeam.artifacts import FsspecDestination, LocalDirectory
from sparkbeam.artifacts.naming import is_temp_name
from sparkbeam.artifacts.payloads import FILE_URN, URL_URN
from sparkbeam.errors import ArtifactStagingError
from tests.component.artifacts.clients import (
    FakeClient,
    beam_provider,
    client_file,
    staged_path,
)

pytestmark = pytest.mark.timeout(90)

Response = beam_artifact_api_pb2.ArtifactResponseWrapper


def listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory)) if directory.exists() else []


class CountingProvider:
    """Beam's client-side provider that counts the artifacts the server asked for."""

    def __init__(self, **options: Any) -> None:
        self._inner = beam_provider(**options)
        self.gets: list[str] = []

    def ResolveArtifacts(self, request: Any) -> Any:  # noqa: N802 - Beam's name
        return self._inner.ResolveArtifacts(request)

    def GetArtifact(self, request: Any) -> Any:  # noqa: N802 - Beam's name
        path = beam_runner_api_pb2.ArtifactFilePayload.FromString(
            request.artifact.type_payload
        ).path
        self.gets.append(os.path.basename(path))
        return self._inner.GetArtifact(request)


def test_beam_client_stages_every_environment_and_workers_read_them_back(
    make_server: Any, tmp_path: Path
) -> None:
    server = make_server()
    client = tmp_path / "client"
    wheel = client_file(client, "pkg-1.0-py3-none-any.whl", os.urandom(3 << 20))  # many chunks
    requirements = client_file(client, "requirements.txt", b"numpy\n")
    empty = client_file(client, "empty.txt", b"")
    session = client_file(client, "main_session.pkl", b"pickled" * 100)
    server.staging.register_job(
        "job-1",
        {"py": [wheel, requirements, empty], "other": [requirements, session], "none": []},
    )
    server.offer("job-1")

    deps = server.staging.resolved_deps("job-1", timeout=10)
    assert server.staging.is_staged("job-1")
    expected = {"py": [wheel, requirements, empty], "other": [requirements, session], "none": []}
    for env, originals in expected.items():
        assert len(deps[env]) == len(originals)
        for staged, original in zip(deps[env], originals, strict=True):
            data = Path(staged_path(original)).read_bytes()
            path = staged_path(staged)
            assert staged.type_urn == FILE_URN and path.startswith(str(tmp_path / "staged"))
            assert Path(path).read_bytes() == data
            assert staged.role_payload == original.role_payload  # workers install by role
            assert server.fetch(staged) == data  # through the retrieval service
    resolved = server.retrieval_stub().ResolveArtifacts(
        beam_artifact_api_pb2.ResolveArtifactsRequest(artifacts=deps["py"]), timeout=10
    )
    assert list(resolved.replacements) == deps["py"]
    assert sorted(n.split("-", 1)[1] for n in listing(tmp_path / "staged")) == sorted(
        ["pkg-1.0-py3-none-any.whl", "requirements.txt", "empty.txt", "main_session.pkl"]
    )
    assert ("job-1", "staged 5 artifact(s): 4 transferred "
            f"({(3 << 20) + 6 + 700} bytes), 1 deduplicated") in server.messages


def test_content_staged_before_is_not_transferred_again(make_server: Any, tmp_path: Path) -> None:
    server = make_server()
    data = os.urandom(200_000)
    digest = hashlib.sha256(data).hexdigest()
    server.staging.register_job("job-1", {"py": [client_file(tmp_path / "c1", "a.whl", data)]})
    server.offer("job-1")
    server.staging.resolved_deps("job-1", timeout=10)

    # A later job whose client declares digests: known content is not asked for again,
    # even under another name; new content is.
    known = client_file(tmp_path / "c2", "renamed.whl", data, sha256=digest)
    new = client_file(tmp_path / "c2", "new.txt", b"new")
    server.staging.register_job("job-2", {"py": [known, new]})
    provider = CountingProvider()
    server.offer("job-2", provider)
    deps = server.staging.resolved_deps("job-2", timeout=10)
    assert provider.gets == ["new.txt"]
    assert Path(staged_path(deps["py"][0])).read_bytes() == data
    assert ("job-2", f"1 artifact(s) were staged already: {len(data)} bytes not transferred "
            "again") in server.messages
    assert len(listing(tmp_path / "staged")) == 2


def test_unknown_token_is_not_found(make_server: Any) -> None:
    server = make_server()
    with pytest.raises(grpc.RpcError) as caught:
        server.offer("no-such-token")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown staging token 'no-such-token'" in caught.value.details()


def test_a_second_client_for_a_staged_token_is_refused(make_server: Any, tmp_path: Path) -> None:
    server = make_server()
    server.staging.register_job("job-1", {"py": [client_file(tmp_path, "a", b"a")]})
    server.offer("job-1")
    with pytest.raises(grpc.RpcError) as caught:
        server.offer("job-1")
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "staging token job-1 is staged" in caught.value.details()
    assert server.staging.is_staged("job-1")  # the refused client did not harm the session


class SlowDirectory(LocalDirectory):
    """A local directory whose writes take a while, so the receiver must wait for them."""

    def open_write(self, name: str) -> Any:
        handle = super().open_write(name)
        write = handle.write

        def slow_write(data: bytes) -> int:
            time.sleep(0.002)
            return write(data)

        handle.write = slow_write
        return handle


def test_huge_artifact_with_a_small_byte_budget(make_server: Any, tmp_path: Path) -> None:
    budget, chunk = 16 << 10, 64 << 10  # every chunk alone is larger than the budget
    server = make_server(
        SlowDirectory(tmp_path / "staged"), max_pending_bytes=budget, writer_threads=1,
        queue_chunks=2,
    )
    data = os.urandom(6 << 20)
    server.staging.register_job("job-1", {"py": [client_file(tmp_path / "c", "huge.bin", data)]})
    started = time.monotonic()
    server.offer("job-1", beam_provider(chunk_size=chunk))
    (staged,) = server.staging.resolved_deps("job-1", timeout=30)["py"]
    assert Path(staged_path(staged)).read_bytes() == data
    assert chunk <= server.staging.peak_pending_bytes < budget + chunk
    assert server.staging.pending_bytes == 0
    assert time.monotonic() - started < 60


def test_beam_client_failing_mid_transfer(make_server: Any, tmp_path: Path) -> None:
    server = make_server()
    good = client_file(tmp_path / "c", "good.txt", b"good")
    broken = client_file(tmp_path / "c", "broken.bin", os.urandom(300_000))

    class FailingReader:
        def __init__(self, path: str) -> None:
            self._file = open(path, "rb")  # noqa: SIM115 - closed in __exit__

        def __enter__(self) -> FailingReader:
            return self

        def __exit__(self, *exc: object) -> None:
            self._file.close()

        def read(self, n: int) -> bytes:
            if self._file.tell() >= 100_000:
                raise OSError("the client's disk failed while reading broken.bin")
            return self._file.read(n)

    def reader(path: str) -> Any:
        if path.endswith("broken.bin"):
            return FailingReader(path)
        return open(path, "rb")  # noqa: SIM115 - Beam's provider closes it

    server.staging.register_job("job-1", {"py": [good, broken]})
    with pytest.raises(OSError, match="the client's disk failed"):  # the client sees its cause
        server.offer("job-1", beam_provider(chunk_size=10_000, file_reader=reader))
    # The protocol has no way for a client to send its error, so the server's root cause is
    # what it saw: the call cancelled, or (depending on timing in gRPC) the stream ended.
    with pytest.raises(ArtifactStagingError, match="artifact staging for job-1 failed: "
                       "(job-1: )?the (client's stream broke|staging call ended|client ended "
                       "its stream before sending chunk)"):
        server.staging.resolved_deps("job-1", timeout=10)
    assert not server.staging.is_staged("job-1")
    assert not any(is_temp_name(n) for n in listing(tmp_path / "staged"))
    assert not any(n.endswith("broken.bin") for n in listing(tmp_path / "staged"))


def test_fake_client_breaking_mid_stream(make_server: Any, tmp_path: Path) -> None:
    server = make_server()
    artifact = client_file(tmp_path / "c", "big.bin", b"x" * 1000)
    server.staging.register_job("job-1", {"py": [artifact]})
    client = FakeClient(server)
    client.send(Response(staging_token="job-1"))
    assert client.next_request().HasField("resolve_artifact")
    client.send(Response(resolve_artifact_response=beam_artifact_api_pb2.ResolveArtifactsResponse(
        replacements=[artifact])))
    assert client.next_request().HasField("get_artifact")
    for _ in range(2):
        client.send(Response(get_artifact_response=beam_artifact_api_pb2.GetArtifactResponse(
            data=b"x" * 100)))
    client.send(ConnectionResetError("client process died"))  # gRPC cancels the call
    with pytest.raises(grpc.RpcError) as caught:
        client.next_request()
    # gRPC's client ends its own call (UNKNOWN, "Exception iterating requests!"); the server
    # only learns that the call was cancelled, and fails the session with that.
    assert caught.value.code() in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED)
    with pytest.raises(ArtifactStagingError, match="job-1 failed: (job-1: )?the (client's stream "
                       r"broke \(cancelled or disconnected\)|staging call ended|client ended "
                       "its stream before sending chunk 2)"):
        server.staging.resolved_deps("job-1", timeout=10)
    assert listing(tmp_path / "staged") == []
    deadline = time.monotonic() + 10  # the server's call thread may still be unwinding
    while server.staging.pending_bytes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.staging.pending_bytes == 0


def test_fake_client_ending_its_stream_early_gets_the_reason(
    make_server: Any, tmp_path: Path
) -> None:
    server = make_server()
    artifact = client_file(tmp_path / "c", "big.bin", b"x" * 1000)
    server.staging.register_job("job-1", {"py": [artifact]})
    client = FakeClient(server)
    client.send(Response(staging_token="job-1"))
    client.next_request()
    client.send(Response(resolve_artifact_response=beam_artifact_api_pb2.ResolveArtifactsResponse(
        replacements=[artifact])))
    client.next_request()
    client.send(Response(get_artifact_response=beam_artifact_api_pb2.GetArtifactResponse(
        data=b"x" * 100)))
    client.send(FakeClient.END)  # half-close without is_last
    with pytest.raises(grpc.RpcError) as caught:
        client.next_request()
    assert caught.value.code() == grpc.StatusCode.ABORTED
    assert caught.value.details() == (
        "the client ended its stream before sending chunk 1 of artifact 'big.bin' #0 of "
        "environment 'py' (job-1)"
    )
    with pytest.raises(ArtifactStagingError, match="before sending chunk 1 of artifact 'big.bin'"):
        server.staging.resolved_deps("job-1", timeout=10)
    assert listing(tmp_path / "staged") == []


class FullDisk(LocalDirectory):
    """A local directory that runs out of space after `capacity` bytes per file."""

    capacity = 150_000

    def open_write(self, name: str) -> Any:
        handle = super().open_write(name)
        write = handle.write

        def full_write(data: bytes) -> int:
            if handle.tell() + len(data) > self.capacity:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return write(data)

        handle.write = full_write
        return handle


def test_destination_failing_on_write(make_server: Any, tmp_path: Path) -> None:
    server = make_server(FullDisk(tmp_path / "staged"))
    small = client_file(tmp_path / "c", "small.txt", b"fits")
    big = client_file(tmp_path / "c", "big.bin", os.urandom(400_000))
    server.staging.register_job("job-1", {"py": [small, big]})
    with pytest.raises(grpc.RpcError) as caught:
        server.offer("job-1", beam_provider(chunk_size=50_000))
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert "writing artifact 'big.bin'" in caught.value.details()
    assert "failed after 150000 bytes: OSError: [Errno 28] No space left on device" in (
        caught.value.details()
    )
    with pytest.raises(ArtifactStagingError, match=r"job-1 failed: writing artifact 'big.bin'"
                       r".* \[Errno 28\] No space left on device") as failed:
        server.staging.resolved_deps("job-1", timeout=10)
    assert isinstance(failed.value.__cause__.__cause__, OSError)
    names = listing(tmp_path / "staged")
    assert not any(is_temp_name(n) for n in names)  # the half-written file is gone
    assert [n.split("-", 1)[1] for n in names] == ["small.txt"]  # complete files only
    assert server.staging.pending_bytes == 0


def test_retrieval_serves_only_staged_artifacts(make_server: Any, tmp_path: Path) -> None:
    server = make_server()
    (tmp_path / "staged" / ".partial-0123456789abcdef0123456789abcdef").write_bytes(b"half")

    def refused(path: str, type_urn: str = FILE_URN) -> grpc.RpcError:
        payload = (beam_runner_api_pb2.ArtifactFilePayload(path=path) if type_urn == FILE_URN
                   else beam_runner_api_pb2.ArtifactUrlPayload(url=path))
        artifact = beam_runner_api_pb2.ArtifactInformation(
            type_urn=type_urn, type_payload=payload.SerializeToString()
        )
        with pytest.raises(grpc.RpcError) as caught:
            server.fetch(artifact)
        return caught.value

    outside = refused("/etc/passwd")
    assert outside.code() == grpc.StatusCode.NOT_FOUND
    assert "'/etc/passwd' is not an artifact staged in LocalDirectory(" in outside.details()
    escape = refused(str(tmp_path / "staged" / ".." / "client.txt"))
    assert escape.code() == grpc.StatusCode.NOT_FOUND
    temp = refused(str(tmp_path / "staged" / ".partial-0123456789abcdef0123456789abcdef"))
    assert temp.code() == grpc.StatusCode.NOT_FOUND
    missing = refused(str(tmp_path / "staged" / ("0" * 32 + "-gone.txt")))
    assert missing.code() == grpc.StatusCode.NOT_FOUND and "does not exist" in missing.details()
    url = refused("https://example.com/x.whl", URL_URN)
    assert url.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"expected an artifact of type {FILE_URN}" in url.details()


def test_fsspec_destination_end_to_end(make_server: Any, tmp_path: Path) -> None:
    destination = FsspecDestination(f"memory://sparkbeam-tests/{uuid.uuid4().hex}/staged")
    server = make_server(destination)
    data = os.urandom(300_000)
    server.staging.register_job("job-1", {"py": [client_file(tmp_path, "a.whl", data)]})
    server.offer("job-1")
    (staged,) = server.staging.resolved_deps("job-1", timeout=10)["py"]
    assert staged_path(staged).startswith("memory:///sparkbeam-tests/")
    assert server.fetch(staged) == data
    assert len(destination.fs.ls(destination.root)) == 1
