"""Names of staged artifacts: unique, readable, length-capped, and unable to leave the root.

A staged name is `<first 32 hex digits of the content's sha256>-<readable part>`. The digest
makes it unique per content (two artifacts with the same base name and different bytes get
different names; the same bytes under the same name are the same file, which is how dedup
finds them again after a restart). The readable part is the original file's base name with
every character outside a small safe set percent-escaped, rather than dropped, so distinct
names stay distinct and no path separator, NUL or control character can survive; the digest
prefix means the result is never empty, `.` or `..`, and never starts with a separator.
"""
from __future__ import annotations

import re
import string
import uuid

HASH_CHARS = 32  # 128 bits of the sha256: collisions are not a practical concern
MIN_NAME_LEN = HASH_CHARS + 1 + 8  # digest, dash, and room for a readable fragment
DEFAULT_READABLE = "artifact"
TEMP_PREFIX = ".partial-"
TRUNCATION_MARK = "~"

_SAFE = frozenset(string.ascii_letters + string.digits + "._-+=@,")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
_STAGED = re.compile(rf"^[0-9a-f]{{{HASH_CHARS}}}-[A-Za-z0-9._\-+=@,%~]+$")
_TEMP = re.compile(rf"^{re.escape(TEMP_PREFIX)}[0-9a-f]{{32}}$")
_EXTENSION = re.compile(r"(?:\.[A-Za-z0-9]{1,10}){1,3}$")
_SEPARATORS = re.compile(r"[/\\]")


def staged_name(original_name: str, sha256: str, *, max_len: int = 128) -> str:
    """The name under which content with this `sha256` is staged, keeping `original_name` readable.

    Raises ValueError for a malformed digest or a `max_len` too small for digest and name.
    """
    digest = normalize_sha256(sha256)
    if max_len < MIN_NAME_LEN:
        raise ValueError(f"max_len must be at least {MIN_NAME_LEN} characters, got {max_len}")
    readable = _escape(base_name(original_name)) or DEFAULT_READABLE
    return f"{digest[:HASH_CHARS]}-{_clip(readable, max_len - HASH_CHARS - 1)}"


def normalize_sha256(sha256: str) -> str:
    """The digest in lower-case hex; ValueError unless it is 64 hex digits."""
    if not isinstance(sha256, str) or not _SHA256.match(sha256):
        raise ValueError(f"expected a sha256 of 64 hex digits, got {sha256!r}")
    return sha256.lower()


def base_name(original_name: str) -> str:
    """The last path component of a name, for either separator; '' if there is none."""
    parts = [p for p in _SEPARATORS.split(original_name) if p not in ("", ".")]
    if not parts or parts[-1] == "..":
        return ""
    return parts[-1]


def is_staged_name(name: str) -> bool:
    """Whether `name` has the shape `staged_name` produces (and so is safe under a root)."""
    return bool(_STAGED.match(name))


def temp_name() -> str:
    """A fresh name to write an artifact under until its content is complete and checked."""
    return f"{TEMP_PREFIX}{uuid.uuid4().hex}"


def is_temp_name(name: str) -> bool:
    """Whether `name` is one `temp_name` made."""
    return bool(_TEMP.match(name))


def check_plain_name(name: str) -> str:
    """`name` if it names a file directly inside a root; ValueError otherwise."""
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or _SEPARATORS.search(name)
        or "\0" in name
    ):
        raise ValueError(
            f"expected a plain file name (no separators, not '.' or '..'), got {name!r}"
        )
    return name


def _escape(text: str) -> str:
    out = []
    for char in text:
        if char in _SAFE:
            out.append(char)
        else:
            out.extend(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
    return "".join(out)


def _clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, keeping its extension(s) and marking the cut."""
    if len(text) <= limit:
        return text
    match = _EXTENSION.search(text)
    extension = match.group(0) if match else ""
    if len(extension) > limit // 2:
        extension = ""
    stem = text[: limit - len(extension) - len(TRUNCATION_MARK)]
    # Never leave half of a %XX escape behind.
    cut = stem.rfind("%", max(0, len(stem) - 2))
    if cut != -1:
        stem = stem[:cut]
    return f"{stem}{TRUNCATION_MARK}{extension}"
