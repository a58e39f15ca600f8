"""Staged names: unique, readable, length-capped, never able to leave the staging root."""
from __future__ import annotations

import hashlib
import os

import pytest
from apache_beam.portability.api import beam_runner_api_pb2
from hypothesis import given
from hypothesis import strategies as st

from sparkbeam.artifacts import payloads
from sparkbeam.artifacts.failures import InvalidArtifactRequest
from sparkbeam.artifacts.naming import (
    HASH_CHARS,
    MIN_NAME_LEN,
    check_plain_name,
    is_staged_name,
    is_temp_name,
    staged_name,
    temp_name,
)

SHA = hashlib.sha256(b"content").hexdigest()
OTHER_SHA = hashlib.sha256(b"other content").hexdigest()


def assert_safe(name: str, max_len: int = 128) -> None:
    assert is_staged_name(name), name
    assert len(name) <= max_len
    assert "/" not in name and "\\" not in name and "\0" not in name
    assert name not in ("", ".", "..") and not os.path.isabs(name)
    assert os.path.normpath(os.path.join("/root", name)) == f"/root/{name}"


def test_keeps_the_base_name_after_the_digest() -> None:
    name = staged_name("apache_beam-2.77.0-py3-none-any.whl", SHA)
    assert name == f"{SHA[:HASH_CHARS]}-apache_beam-2.77.0-py3-none-any.whl"
    assert_safe(name)


@pytest.mark.parametrize(
    "original, readable",
    [
        ("dir/sub/pkg.tar.gz", "pkg.tar.gz"),  # posix separators: the base name
        ("C:\\Users\\me\\pkg.whl", "pkg.whl"),  # windows separators too
        ("/etc/passwd", "passwd"),  # absolute paths lose their directories
        ("../../etc/passwd", "passwd"),  # so do relative escapes
        ("dir/", "dir"),  # a trailing separator
        ("..", "artifact"),  # nothing but a parent reference
        ("a/..", "artifact"),
        (".", "artifact"),
        ("", "artifact"),  # no name at all
        ("///", "artifact"),
        ("a\0b", "a%00b"),  # NUL is escaped, not kept
        ("new\nline", "new%0Aline"),
        ("with space.txt", "with%20space.txt"),
        ("ünï.txt", "%C3%BCn%C3%AF.txt"),
        ("100%.txt", "100%25.txt"),  # the escape character escapes itself: injective
        ("~tilde", "%7Etilde"),  # '~' marks truncation only
    ],
)
def test_unsafe_names_are_reduced_and_escaped(original: str, readable: str) -> None:
    name = staged_name(original, SHA)
    assert name == f"{SHA[:HASH_CHARS]}-{readable}"
    assert_safe(name)


def test_very_long_names_are_capped_and_keep_their_extension() -> None:
    name = staged_name("x" * 1000 + ".tar.gz", SHA)
    assert len(name) == 128
    assert name.endswith("~.tar.gz") and name.startswith(f"{SHA[:HASH_CHARS]}-xxxx")
    assert_safe(name)
    short = staged_name("y" * 1000, SHA, max_len=MIN_NAME_LEN)
    assert len(short) == MIN_NAME_LEN and short.endswith("~")


def test_truncation_never_splits_an_escape() -> None:
    for cut in range(60, 70):
        name = staged_name("ü" * 200, SHA, max_len=cut)
        readable = name.split("-", 1)[1].rstrip("~")
        assert all(part == "" or part[:2] in ("C3", "BC") for part in readable.split("%"))
        assert_safe(name, cut)


def test_same_base_name_different_content_gives_different_names() -> None:
    assert staged_name("a/setup.py", SHA) != staged_name("b/setup.py", OTHER_SHA)
    # ... while the same content under the same name is the same file: that is dedup
    assert staged_name("a/setup.py", SHA) == staged_name("b/setup.py", SHA.upper())


def test_bad_digest_or_too_small_cap_are_refused() -> None:
    with pytest.raises(ValueError, match="expected a sha256 of 64 hex digits, got 'abc'"):
        staged_name("x", "abc")
    with pytest.raises(ValueError, match="64 hex digits"):
        staged_name("x", "g" * 64)
    with pytest.raises(ValueError, match=f"max_len must be at least {MIN_NAME_LEN}"):
        staged_name("x", SHA, max_len=10)


@given(original=st.text(), max_len=st.integers(MIN_NAME_LEN, 300))
def test_any_name_is_safe_and_capped(original: str, max_len: int) -> None:
    assert_safe(staged_name(original, SHA, max_len=max_len), max_len)


@given(a=st.text(max_size=40), b=st.text(max_size=40))
def test_distinct_short_base_names_stay_distinct(a: str, b: str) -> None:
    # escaping, unlike stripping, keeps names apart (when neither is cut for length)
    from sparkbeam.artifacts.naming import base_name

    if base_name(a) != base_name(b) and base_name(a) and base_name(b):
        assert staged_name(a, SHA, max_len=300) != staged_name(b, SHA, max_len=300)


def test_temp_names_are_fresh_and_never_staged_names() -> None:
    first, second = temp_name(), temp_name()
    assert first != second and is_temp_name(first) and not is_staged_name(first)
    assert not is_temp_name(staged_name("x", SHA))


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a\\b", "/abs", "a\0b"])
def test_plain_names_refuse_anything_that_could_leave_the_root(bad: str) -> None:
    with pytest.raises(ValueError, match="expected a plain file name"):
        check_plain_name(bad)


def _file(
    path: str, sha256: str = "", staged_as: str = ""
) -> beam_runner_api_pb2.ArtifactInformation:
    artifact = beam_runner_api_pb2.ArtifactInformation(
        type_urn=payloads.FILE_URN,
        type_payload=beam_runner_api_pb2.ArtifactFilePayload(
            path=path, sha256=sha256
        ).SerializeToString(),
    )
    if staged_as:
        artifact.role_urn = payloads.STAGING_TO_URN
        artifact.role_payload = beam_runner_api_pb2.ArtifactStagingToRolePayload(
            staged_name=staged_as
        ).SerializeToString()
    return artifact


def test_original_name_prefers_the_staging_role_then_the_path() -> None:
    assert payloads.original_name(_file("/tmp/x/y.whl", staged_as="pkg.whl")) == "pkg.whl"
    assert payloads.original_name(_file("/tmp/x/y.whl")) == "/tmp/x/y.whl"


def test_url_names_drop_query_and_fragment() -> None:
    artifact = beam_runner_api_pb2.ArtifactInformation(
        type_urn=payloads.URL_URN,
        type_payload=beam_runner_api_pb2.ArtifactUrlPayload(
            url="https://host/dist/pkg.whl?token=secret#frag"
        ).SerializeToString(),
    )
    assert payloads.original_name(artifact) == "pkg.whl"


def test_declared_digest_from_file_or_embedded_payloads() -> None:
    assert payloads.declared_sha256(_file("/x", sha256=SHA.upper())) == SHA
    assert payloads.declared_sha256(_file("/x")) is None
    embedded = beam_runner_api_pb2.ArtifactInformation(
        type_urn=payloads.EMBEDDED_URN,
        type_payload=beam_runner_api_pb2.EmbeddedFilePayload(data=b"content").SerializeToString(),
    )
    assert payloads.declared_sha256(embedded) == SHA


def test_malformed_payloads_and_digests_are_bad_input() -> None:
    with pytest.raises(InvalidArtifactRequest, match="declares an invalid sha256.*'nothex'"):
        payloads.declared_sha256(_file("/x", sha256="nothex"))
    garbage = beam_runner_api_pb2.ArtifactInformation(
        type_urn=payloads.FILE_URN, type_payload=b"\xff\xff\xff"
    )
    with pytest.raises(InvalidArtifactRequest, match="cannot decode the ArtifactFilePayload"):
        payloads.declared_sha256(garbage)
