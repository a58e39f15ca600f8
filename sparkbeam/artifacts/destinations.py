"""Where staged artifacts live: a local directory by default, any fsspec URL by option.

A destination is a flat namespace of plain file names under one root. The staging service
writes each artifact under a temporary name and commits it (an atomic rename where the storage
has one) to its final name only once the content is complete and checked, so a final name
never shows half-written bytes. Every method refuses names with separators, `.`, `..` or NUL,
so nothing can be read or written outside the root, whatever a caller passes.
"""
from __future__ import annotations

import contextlib
import os
from typing import IO, Any, Protocol, runtime_checkable

from sparkbeam.artifacts.naming import check_plain_name


@runtime_checkable
class ArtifactDestination(Protocol):
    """Storage for staged artifacts: a flat set of named files under one root."""

    def open_write(self, name: str) -> IO[bytes]:
        """Opens `name` (a temporary name) for writing, replacing what was there."""
        ...

    def commit(self, temp_name: str, final_name: str) -> None:
        """Renames a completely written temporary file to its final name (replacing it)."""
        ...

    def exists(self, name: str) -> bool:
        """Whether a file of this name is there."""
        ...

    def size(self, name: str) -> int:
        """The size in bytes of the file of this name."""
        ...

    def open_read(self, name: str) -> IO[bytes]:
        """Opens the file of this name for reading."""
        ...

    def delete(self, name: str) -> None:
        """Removes the file of this name; a missing file is not an error."""
        ...

    def location(self, name: str) -> str:
        """The path or URL of the file of this name, as written into FILE artifact payloads."""
        ...

    def name_at(self, location: str) -> str | None:
        """The inverse of `location`: the name at this path or URL, or None if not under root."""
        ...


class LocalDirectory:
    """Artifacts as files in one local directory (created if missing).

    `fsync` makes each commit durable: the bytes reach the disk before the rename makes them
    visible under their final name, so even a crash cannot leave a final name half-written.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self._fsync = fsync
        os.makedirs(self.root, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalDirectory({self.root!r})"

    def open_write(self, name: str) -> IO[bytes]:
        return open(self._path(name), "wb")

    def commit(self, temp_name: str, final_name: str) -> None:
        temp, final = self._path(temp_name), self._path(final_name)
        if self._fsync:
            fd = os.open(temp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(temp, final)

    def exists(self, name: str) -> bool:
        return os.path.isfile(self._path(name))

    def size(self, name: str) -> int:
        return os.path.getsize(self._path(name))

    def open_read(self, name: str) -> IO[bytes]:
        return open(self._path(name), "rb")

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._path(name))

    def location(self, name: str) -> str:
        return self._path(name)

    def name_at(self, location: str) -> str | None:
        path = os.path.abspath(location)
        if os.path.dirname(path) != self.root:
            return None
        name = os.path.basename(path)
        return name if name not in ("", ".", "..") else None

    def _path(self, name: str) -> str:
        return os.path.join(self.root, check_plain_name(name))


class FsspecDestination:
    """Artifacts as files under any fsspec URL (`s3://bucket/staging`, `gs://…`, `memory://…`).

    fsspec is imported only when one is made, so it stays an optional dependency. On object
    stores a commit is a copy and a delete: an object appears whole under its final name or
    not at all, which is what the staging service needs.
    """

    def __init__(self, url: str, **storage_options: Any) -> None:
        try:
            from fsspec.core import url_to_fs
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                f"FsspecDestination({url!r}) needs fsspec: pip install fsspec "
                "(and the filesystem's own package, e.g. s3fs or gcsfs)"
            ) from exc
        self.url = url
        self.fs, root = url_to_fs(url, **storage_options)
        self.root = str(root).rstrip("/") or "/"
        self.fs.makedirs(self.root, exist_ok=True)

    def __repr__(self) -> str:
        return f"FsspecDestination({self.url!r})"

    def open_write(self, name: str) -> IO[bytes]:
        handle: IO[bytes] = self.fs.open(self._path(name), "wb")
        return handle

    def commit(self, temp_name: str, final_name: str) -> None:
        temp, final = self._path(temp_name), self._path(final_name)
        self.fs.mv(temp, final)

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self._path(name)))

    def size(self, name: str) -> int:
        return int(self.fs.size(self._path(name)))

    def open_read(self, name: str) -> IO[bytes]:
        handle: IO[bytes] = self.fs.open(self._path(name), "rb")
        return handle

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self._path(name))

    def location(self, name: str) -> str:
        return str(self.fs.unstrip_protocol(self._path(name)))

    def name_at(self, location: str) -> str | None:
        # The filesystem's own normalisation, so "memory://x" and "memory:///x" both match.
        path = str(self.fs._strip_protocol(location))
        parent, _, name = path.rpartition("/")
        if (parent or "/") != self.root:
            return None
        try:
            return check_plain_name(name)
        except ValueError:
            return None

    def _path(self, name: str) -> str:
        check_plain_name(name)
        return f"{self.root.rstrip('/')}/{name}"
