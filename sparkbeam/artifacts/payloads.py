"""What an `ArtifactInformation` says about itself: its name, its declared digest, its label.

Malformed payloads are the client's bad input and raise `InvalidArtifactRequest`.
"""
from __future__ import annotations

import hashlib
import posixpath
from typing import Any
from urllib.parse import urlsplit

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from google.protobuf.message import DecodeError

from sparkbeam.artifacts.failures import InvalidArtifactRequest
from sparkbeam.artifacts.naming import normalize_sha256

FILE_URN: str = common_urns.artifact_types.FILE.urn
URL_URN: str = common_urns.artifact_types.URL.urn
EMBEDDED_URN: str = common_urns.artifact_types.EMBEDDED.urn
STAGING_TO_URN: str = common_urns.artifact_roles.STAGING_TO.urn

ArtifactInformation = beam_runner_api_pb2.ArtifactInformation


def original_name(artifact: ArtifactInformation) -> str:
    """The name the client knows this artifact by ('' if it has none).

    The staging role's `staged_name` wins (it is the name workers install the file under);
    then the file path or the URL's path. A URL's query and fragment are never used: they may
    hold credentials, and staged names end up in logs and directory listings.
    """
    if artifact.role_urn == STAGING_TO_URN:
        role = _parse(
            artifact, artifact.role_payload, beam_runner_api_pb2.ArtifactStagingToRolePayload
        )
        if role.staged_name:
            return str(role.staged_name)
    if artifact.type_urn == FILE_URN:
        return str(_file_payload(artifact).path)
    if artifact.type_urn == URL_URN:
        url = _parse(artifact, artifact.type_payload, beam_runner_api_pb2.ArtifactUrlPayload).url
        return posixpath.basename(urlsplit(url).path)
    return ""


def declared_sha256(artifact: ArtifactInformation) -> str | None:
    """The content's sha256 if the artifact tells it (file or URL payload, or embedded data).

    None when the client gave none; the digest is then computed while the bytes are written.
    """
    digest = ""
    if artifact.type_urn == FILE_URN:
        digest = _file_payload(artifact).sha256
    elif artifact.type_urn == URL_URN:
        digest = _parse(
            artifact, artifact.type_payload, beam_runner_api_pb2.ArtifactUrlPayload
        ).sha256
    elif artifact.type_urn == EMBEDDED_URN:
        data = _parse(
            artifact, artifact.type_payload, beam_runner_api_pb2.EmbeddedFilePayload
        ).data
        return hashlib.sha256(data).hexdigest()
    if not digest:
        return None
    try:
        return normalize_sha256(digest)
    except ValueError as exc:
        raise InvalidArtifactRequest(
            f"{describe(artifact)} declares an invalid sha256: {exc}"
        ) from exc


def describe(artifact: ArtifactInformation) -> str:
    """A short label for logs and error messages: its name, else its type."""
    try:
        name = original_name(artifact)
    except InvalidArtifactRequest:
        name = ""
    if name:
        return f"artifact {name!r}"
    return f"artifact of type {artifact.type_urn or '<no type>'}"


def file_artifact(
    location: str, sha256: str, role_of: ArtifactInformation
) -> ArtifactInformation:
    """A FILE artifact at `location` that keeps the role of the artifact it was staged from."""
    return beam_runner_api_pb2.ArtifactInformation(
        type_urn=FILE_URN,
        type_payload=beam_runner_api_pb2.ArtifactFilePayload(
            path=location, sha256=sha256
        ).SerializeToString(),
        role_urn=role_of.role_urn,
        role_payload=role_of.role_payload,
    )


def file_path(artifact: ArtifactInformation) -> str:
    """The path of a FILE artifact; InvalidArtifactRequest for any other type."""
    if artifact.type_urn != FILE_URN:
        raise InvalidArtifactRequest(
            f"expected an artifact of type {FILE_URN}, got {describe(artifact)}"
        )
    return str(_file_payload(artifact).path)


def _file_payload(artifact: ArtifactInformation) -> Any:
    return _parse(artifact, artifact.type_payload, beam_runner_api_pb2.ArtifactFilePayload)


def _parse(artifact: ArtifactInformation, data: bytes, kind: type) -> Any:
    message = kind()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise InvalidArtifactRequest(
            f"cannot decode the {kind.__name__} of an artifact of type "
            f"{artifact.type_urn or '<no type>'} (role {artifact.role_urn or '<none>'}): {exc}"
        ) from exc
    return message
