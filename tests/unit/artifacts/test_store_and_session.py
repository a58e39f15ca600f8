"""Dedup bookkeeping, write-then-commit sinks and the session's life cycle, without gRPC."""
from __future__ import annotations

import hashlib
import os
from concurrent.futures import Future
from pathlib import Path

import pytest
from apache_beam.portability.api import beam_runner_api_pb2

from sparkbeam.artifacts import payloads
from sparkbeam.artifacts.destinations import LocalDirectory
from sparkbeam.artifacts.failures import (
    ArtifactStorageError,
    ClientStreamError,
    InvalidArtifactRequest,
    StagingStateError,
    StagingTimeout,
)
from sparkbeam.artifacts.naming import is_temp_name, staged_name
from sparkbeam.artifacts.session import SessionState, StagingSession
from sparkbeam.artifacts.store import ArtifactStore, ContentIndex, StagedContent
from sparkbeam.errors import ArtifactStagingError

DATA = b"some wheel bytes"
SHA = hashlib.sha256(DATA).hexdigest()


def file_artifact(name: str, sha256: str = "") -> beam_runner_api_pb2.ArtifactInformation:
    return beam_runner_api_pb2.ArtifactInformation(
        type_urn=payloads.FILE_URN,
        type_payload=beam_runner_api_pb2.ArtifactFilePayload(
            path=f"/client/{name}", sha256=sha256
        ).SerializeToString(),
        role_urn=payloads.STAGING_TO_URN,
        role_payload=beam_runner_api_pb2.ArtifactStagingToRolePayload(
            staged_name=name
        ).SerializeToString(),
    )


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(LocalDirectory(tmp_path / "staged"))


def files(store: ArtifactStore) -> list[str]:
    return sorted(os.listdir(Path(store.destination.location("x")).parent))


def stage_bytes(store: ArtifactStore, name: str, data: bytes, expected: str | None = None
                ) -> StagedContent:
    sink = store.sink(label=f"artifact {name!r}", original_name=name, expected_sha256=expected)
    for i in range(0, len(data), 4):
        sink.write(data[i:i + 4])
    return sink.complete()


# --- ContentIndex and ArtifactStore ----------------------------------------------------------


def test_index_keeps_the_first_entry_per_digest() -> None:
    index = ContentIndex()
    first = StagedContent("n1", "/n1", SHA, 3)
    assert index.add(first) is first
    assert index.add(StagedContent("n2", "/n2", SHA, 3)) is first
    assert index.get(SHA) is first and len(index) == 1
    index.forget(SHA)
    assert index.get(SHA) is None


def test_sink_commits_under_the_staged_name_only_when_complete(store: ArtifactStore) -> None:
    sink = store.sink(label="artifact 'pkg.whl'", original_name="pkg.whl", expected_sha256=SHA)
    sink.write(DATA[:5])
    (temp,) = files(store)
    assert is_temp_name(temp)  # nothing under a final name while incomplete
    sink.write(DATA[5:])
    content = sink.complete()
    assert content.name == staged_name("pkg.whl", SHA) and files(store) == [content.name]
    assert content.size == len(DATA) and content.sha256 == SHA
    assert Path(content.location).read_bytes() == DATA
    assert store.find(SHA, "anything") == content


def test_a_digest_mismatch_is_bad_input_and_leaves_no_file(store: ArtifactStore) -> None:
    sink = store.sink(label="artifact 'pkg.whl'", original_name="pkg.whl",
                      expected_sha256="0" * 64)
    sink.write(DATA)
    with pytest.raises(InvalidArtifactRequest, match=(
        f"artifact 'pkg.whl': expected content with the declared sha256 {'0' * 64}, "
        f"got {len(DATA)} bytes with sha256 {SHA}"
    )):
        sink.complete()
    assert [f for f in files(store) if not is_temp_name(f)] == []  # no final name
    sink.discard()  # as the writer does after a failed complete()
    assert files(store) == []


def test_discard_deletes_the_temporary_file(store: ArtifactStore) -> None:
    sink = store.sink(label="artifact 'a'", original_name="a", expected_sha256=None)
    sink.write(b"half")
    sink.discard()
    sink.discard()  # twice is harmless
    assert files(store) == []


def test_same_content_is_stored_once_even_under_another_name(store: ArtifactStore) -> None:
    first = stage_bytes(store, "a.whl", DATA)
    again = stage_bytes(store, "b.whl", DATA)  # digest computed while writing: dedup on disk
    assert again == first and files(store) == [first.name]


def test_find_sees_content_staged_before_a_restart(tmp_path: Path) -> None:
    before = ArtifactStore(LocalDirectory(tmp_path))
    content = stage_bytes(before, "a.whl", DATA)
    after = ArtifactStore(LocalDirectory(tmp_path))  # a new index, the same directory
    assert after.find(SHA, "a.whl") == content
    assert after.find(SHA, "other-name.whl") == content  # now in the index, whatever the name


def test_find_forgets_content_deleted_behind_its_back(store: ArtifactStore) -> None:
    content = stage_bytes(store, "a.whl", DATA)
    store.destination.delete(content.name)
    assert store.find(SHA, "a.whl") is None and store.index.get(SHA) is None


def test_storage_errors_say_what_where_and_after_how_many_bytes(tmp_path: Path) -> None:
    class FullDisk(LocalDirectory):
        def open_write(self, name: str):  # type: ignore[no-untyped-def]
            handle = super().open_write(name)
            original = handle.write

            def write(data: bytes) -> int:
                if handle.tell() + len(data) > 6:
                    raise OSError(28, "No space left on device")
                return original(data)

            handle.write = write  # type: ignore[method-assign]
            return handle

    store = ArtifactStore(FullDisk(tmp_path))
    sink = store.sink(label="artifact 'big.whl'", original_name="big.whl", expected_sha256=None)
    sink.write(b"1234")
    with pytest.raises(ArtifactStorageError, match=(
        r"writing artifact 'big.whl' at .*\.partial-[0-9a-f]+ failed after 4 bytes: "
        r"OSError: \[Errno 28\] No space left on device"
    )):
        sink.write(b"5678")
    sink.discard()
    assert os.listdir(tmp_path) == []


# --- StagingSession -----------------------------------------------------------------------------


def done(content: StagedContent) -> Future[StagedContent]:
    future: Future[StagedContent] = Future()
    future.set_result(content)
    return future


def test_declared_digest_already_staged_is_reused_and_counted(store: ArtifactStore) -> None:
    staged = stage_bytes(store, "pkg.whl", DATA)
    known = file_artifact("pkg.whl", sha256=SHA)
    session = StagingSession("job-1", {"py": [known]}, store)
    session.begin()
    assert session.reuse("py", known)
    summary = session.succeed()
    assert (summary.transferred, summary.deduplicated, summary.skipped_bytes) == (0, 1, len(DATA))
    (result,) = session.wait(0)["py"]
    payload = beam_runner_api_pb2.ArtifactFilePayload.FromString(result.type_payload)
    assert payload.path == staged.location and payload.sha256 == SHA
    assert result.role_payload == known.role_payload  # the role (install name) is kept


def test_one_transfer_per_content_within_a_session(store: ArtifactStore) -> None:
    with_sha = file_artifact("pkg.whl", sha256=SHA)
    without_sha = file_artifact("req.txt")
    session = StagingSession("job-1", {"a": [with_sha, without_sha], "b": []}, store)
    session.begin()
    assert not session.reuse("a", with_sha) and not session.reuse("a", without_sha)
    transfer_1: Future[StagedContent] = Future()
    transfer_2: Future[StagedContent] = Future()
    session.track("a", with_sha, transfer_1)
    session.track("a", without_sha, transfer_2)
    # the same content (declared digest) or the very same artifact again: no second transfer
    assert session.reuse("b", file_artifact("renamed.whl", sha256=SHA))
    assert session.reuse("b", file_artifact("req.txt"))
    assert not session.reuse("b", file_artifact("other.txt"))
    transfer_1.set_result(StagedContent("n1", "/n1", SHA, 10))
    transfer_2.set_result(StagedContent("n2", "/n2", "f" * 64, 7))
    summary = session.succeed()
    assert summary.artifacts == 4 and summary.transferred == 2
    assert summary.transferred_bytes == 17 and summary.skipped_bytes == 17


def test_a_session_stages_once(store: ArtifactStore) -> None:
    session = StagingSession("job-1", {}, store)
    session.begin()
    with pytest.raises(StagingStateError, match="staging token job-1 is staging: a client already"):
        session.begin()


def test_wait_times_out_while_staging_then_raises_the_root_cause(store: ArtifactStore) -> None:
    session = StagingSession("job-1", {"py": [file_artifact("a")]}, store)
    session.begin()
    with pytest.raises(StagingTimeout, match="artifact staging for job-1 is still staging after"):
        session.wait(0.01)
    root = ClientStreamError("job-1: the client's stream broke")
    assert session.fail(root)
    assert not session.fail(ArtifactStagingError("a consequence"))  # the first cause stays
    with pytest.raises(ArtifactStagingError, match="job-1 failed: job-1: the client's stream") as e:
        session.wait(1)
    assert e.value.__cause__ is root and session.state is SessionState.FAILED


def test_a_failed_session_ends_only_when_its_writers_settle(store: ArtifactStore) -> None:
    session = StagingSession("job-1", {"py": [file_artifact("a")]}, store)
    session.begin()
    writing: Future[StagedContent] = Future()
    session.track("py", file_artifact("a"), writing)
    session.fail(OSError("disk gone"))
    with pytest.raises(ArtifactStagingError, match="OSError: disk gone"):
        session.wait(0.01)  # the failure is reported even before the writer settles
    assert not session._ended.is_set()
    writing.set_exception(OSError("disk gone"))
    assert session._ended.is_set()


def test_a_staged_session_cannot_fail_afterwards(store: ArtifactStore) -> None:
    session = StagingSession("job-1", {"py": []}, store)
    session.begin()
    session.succeed()
    assert not session.fail(ClientStreamError("call ended"))
    assert session.wait(0) == {"py": []} and session.state is SessionState.STAGED


def test_register_copies_the_artifacts(store: ArtifactStore) -> None:
    artifacts = [file_artifact("a")]
    session = StagingSession("job-1", {"py": artifacts}, store)
    artifacts[0].type_urn = "changed"
    assert session.dependency_sets["py"][0].type_urn == payloads.FILE_URN
