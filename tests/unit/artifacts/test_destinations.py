"""Destinations: the local directory and fsspec URLs (fsspec's in-memory filesystem)."""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from sparkbeam.artifacts.destinations import (
    ArtifactDestination,
    FsspecDestination,
    LocalDirectory,
)

# fsspec is installed in the project's venv, so FsspecDestination is tested against fsspec's
# own in-memory filesystem (no skip: if fsspec goes missing, these tests fail loudly).


@pytest.fixture(params=["local", "fsspec-memory"])
def destination(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactDestination:
    if request.param == "local":
        return LocalDirectory(tmp_path / "staged")
    return FsspecDestination(f"memory://sparkbeam-tests/{uuid.uuid4().hex}/staged")


def test_write_commit_read_delete(destination: ArtifactDestination) -> None:
    assert isinstance(destination, ArtifactDestination)
    with destination.open_write(".partial-1") as handle:
        handle.write(b"hello")
    assert not destination.exists("final")
    destination.commit(".partial-1", "final")
    assert destination.exists("final") and not destination.exists(".partial-1")
    assert destination.size("final") == 5
    with destination.open_read("final") as handle:
        assert handle.read() == b"hello"
    destination.delete("final")
    destination.delete("final")  # missing is fine
    assert not destination.exists("final")


def test_commit_replaces_an_existing_final_name(destination: ArtifactDestination) -> None:
    for data in (b"one", b"two"):
        with destination.open_write(".partial-x") as handle:
            handle.write(data)
        destination.commit(".partial-x", "final")
    with destination.open_read("final") as handle:
        assert handle.read() == b"two"


def test_location_and_name_at_are_inverse(destination: ArtifactDestination) -> None:
    location = destination.location("abc-pkg.whl")
    assert destination.name_at(location) == "abc-pkg.whl"


@pytest.mark.parametrize("bad", ["", ".", "..", "../escape", "a/b", "/etc/passwd", "a\0b"])
def test_every_method_refuses_names_that_leave_the_root(
    destination: ArtifactDestination, bad: str
) -> None:
    for call in (
        lambda: destination.open_write(bad),
        lambda: destination.open_read(bad),
        lambda: destination.exists(bad),
        lambda: destination.size(bad),
        lambda: destination.delete(bad),
        lambda: destination.location(bad),
        lambda: destination.commit(".partial-1", bad),
        lambda: destination.commit(bad, "final"),
    ):
        with pytest.raises(ValueError, match="expected a plain file name"):
            call()


def test_local_name_at_refuses_paths_outside_the_root(tmp_path: Path) -> None:
    destination = LocalDirectory(tmp_path / "staged")
    assert destination.name_at("/etc/passwd") is None
    assert destination.name_at(destination.location("a").replace(":///", "://")) == "a"
    assert destination.name_at(destination.location("a").replace("/a", "/../a")) is None
    assert destination.name_at(str(tmp_path / "staged" / "sub" / "x")) is None
    assert destination.name_at(str(tmp_path / "staged" / ".." / "x")) is None
    assert destination.name_at(str(tmp_path / "staged")) is None
    assert destination.name_at(str(tmp_path / "staged" / "x")) == "x"


def test_fsspec_name_at_refuses_other_urls() -> None:
    destination = FsspecDestination(f"memory://sparkbeam-tests/{uuid.uuid4().hex}")
    assert destination.name_at("memory://elsewhere/x") is None
    assert destination.name_at(destination.location("a") + "/b") is None
    assert destination.name_at("/etc/passwd") is None
    assert destination.name_at(destination.location("a").replace(":///", "://")) == "a"
    assert destination.name_at(destination.location("a").replace("/a", "/../a")) is None


def test_local_commit_is_a_rename_within_the_root(tmp_path: Path) -> None:
    destination = LocalDirectory(tmp_path)
    with destination.open_write(".partial-1") as handle:
        handle.write(b"x")
    inode = os.stat(tmp_path / ".partial-1").st_ino
    destination.commit(".partial-1", "final")
    assert os.stat(tmp_path / "final").st_ino == inode  # renamed, not copied
