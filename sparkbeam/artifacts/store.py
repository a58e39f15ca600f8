"""Content-addressed artifacts in one destination: dedup lookups and write-then-commit sinks.

Content is known by its sha256. `ArtifactStore.find` answers "is this content staged
already?" from an in-memory index, checked against the destination (a file removed behind our
back is forgotten), and from the destination itself (names embed the digest, so content staged
before a restart is found again). `StagedFileSink` writes an artifact under a temporary name,
hashing as it goes, and commits it to its staged name only when complete and, if the client
declared a digest, only when the bytes match it; on any failure the temporary file is deleted.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from sparkbeam.artifacts.destinations import ArtifactDestination
from sparkbeam.artifacts.failures import ArtifactStorageError, InvalidArtifactRequest
from sparkbeam.artifacts.naming import staged_name, temp_name
from sparkbeam.errors import ArtifactStagingError

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class StagedContent:
    """Bytes committed to the destination under `name`, readable at `location`."""

    name: str
    location: str
    sha256: str
    size: int


class ContentIndex:
    """sha256 -> the content committed under it. Thread-safe; the first entry for a digest wins."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_sha: dict[str, StagedContent] = {}

    def get(self, sha256: str) -> StagedContent | None:
        """The content staged with this digest, if recorded."""
        with self._lock:
            return self._by_sha.get(sha256)

    def add(self, content: StagedContent) -> StagedContent:
        """Records `content` unless its digest is recorded already; returns the recorded one."""
        with self._lock:
            return self._by_sha.setdefault(content.sha256, content)

    def forget(self, sha256: str) -> None:
        """Drops the entry of this digest (its file is gone)."""
        with self._lock:
            self._by_sha.pop(sha256, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_sha)


class ArtifactStore:
    """Staged artifacts of one destination, deduplicated by content."""

    def __init__(self, destination: ArtifactDestination, *, max_name_len: int = 128) -> None:
        self.destination = destination
        self.index = ContentIndex()
        self.max_name_len = max_name_len

    def find(self, sha256: str, original_name: str) -> StagedContent | None:
        """Content with this digest that is staged already, or None."""
        known = self.index.get(sha256)
        if known is not None:
            if self.destination.exists(known.name):
                return known
            _LOGGER.info("staged %s disappeared from %s", known.name, self.destination)
            self.index.forget(sha256)
        name = staged_name(original_name, sha256, max_len=self.max_name_len)
        if not self.destination.exists(name):
            return None
        content = StagedContent(
            name, self.destination.location(name), sha256, self.destination.size(name)
        )
        return self.index.add(content)

    def sink(
        self, *, label: str, original_name: str, expected_sha256: str | None = None
    ) -> StagedFileSink:
        """A sink that stages one artifact's bytes; see `StagedFileSink`."""
        return StagedFileSink(self, label, original_name, expected_sha256)


class StagedFileSink:
    """Writes one artifact to a temporary name, then commits it under its staged name.

    Opens nothing until the first chunk (or `complete`, for an empty artifact), on the writer
    thread. Storage errors become `ArtifactStorageError` saying what, where and after how many
    bytes; a digest that differs from the declared one is the client's `InvalidArtifactRequest`.
    """

    def __init__(
        self,
        store: ArtifactStore,
        label: str,
        original_name: str,
        expected_sha256: str | None,
    ) -> None:
        self._store = store
        self._label = label
        self._original_name = original_name
        self._expected = expected_sha256
        self._hasher = hashlib.sha256()
        self._size = 0
        self._temp: str | None = None
        self._handle: IO[bytes] | None = None

    @property
    def size(self) -> int:
        """Bytes written so far."""
        return self._size

    def write(self, chunk: bytes) -> None:
        handle = self._open()
        with self._storage_errors("writing"):
            handle.write(chunk)
        self._hasher.update(chunk)
        self._size += len(chunk)

    def complete(self) -> StagedContent:
        handle = self._open()
        with self._storage_errors("closing"):
            handle.close()
        self._handle = None
        digest = self._hasher.hexdigest()
        if self._expected is not None and digest != self._expected:
            raise InvalidArtifactRequest(
                f"{self._label}: expected content with the declared sha256 {self._expected}, "
                f"got {self._size} bytes with sha256 {digest}"
            )
        destination = self._store.destination
        assert self._temp is not None
        with self._storage_errors("committing"):
            existing = self._store.find(digest, self._original_name)
            if existing is not None:  # same bytes staged meanwhile, or under another name
                destination.delete(self._temp)
                self._temp = None
                return existing
            name = staged_name(self._original_name, digest, max_len=self._store.max_name_len)
            destination.commit(self._temp, name)
            self._temp = None
            content = StagedContent(name, destination.location(name), digest, self._size)
        _LOGGER.debug("%s: staged %d bytes as %s", self._label, self._size, name)
        return self._store.index.add(content)

    def discard(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(Exception):
                self._handle.close()
            self._handle = None
        if self._temp is not None:
            try:
                self._store.destination.delete(self._temp)
            except Exception:  # noqa: BLE001 - discarding must not raise; the log says why
                _LOGGER.warning(
                    "%s: could not delete temporary %s", self._label, self._temp, exc_info=True
                )
            self._temp = None

    def _open(self) -> IO[bytes]:
        if self._handle is None:
            if self._temp is not None:
                raise ArtifactStorageError(f"{self._label}: written to after it was closed")
            self._temp = temp_name()
            with self._storage_errors("opening"):
                self._handle = self._store.destination.open_write(self._temp)
        return self._handle

    @contextlib.contextmanager
    def _storage_errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except ArtifactStagingError:
            raise
        except Exception as exc:  # noqa: BLE001 - storage errors of any filesystem
            where = self._store.destination.location(self._temp) if self._temp else "?"
            raise ArtifactStorageError(
                f"{what} {self._label} at {where} failed after {self._size} bytes: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
