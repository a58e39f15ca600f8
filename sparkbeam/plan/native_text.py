"""ReadFromText through Spark's text source, where the result is provably Beam's.

Beam's `ReadFromText` is a `Read` of a `_TextSource`: in Python, per line, a buffered scan for
separators, a range tracker's claim and a coder's decode (about half of a word count's read
stage, bench/ANALYSIS.md). Spark's text source splits files into lines in the JVM. At Prepare,
each `Read` of a `_TextSource` whose options Spark reproduces exactly becomes a data input of
its consumers' stage reading a buffer the executor makes with Spark (`TextRead`); any other
`Read` keeps Beam's reader, and the plan says which path each took and why.

Exactly Beam's lines, because the translation only applies when:
- lines end at '\\n', a '\\r' before it dropped (Beam's default separators; Spark is told
  `lineSep='\\n'`, and the '\\r' is removed from the bytes, not the decoded text). A lone
  '\\r' is not a separator for Beam, so a file whose last byte is '\\r' (which Beam keeps in
  its last line) keeps Beam's reader;
- the files are local, plain (no compressed suffix either side would decompress), not
  starting with a UTF-8 byte-order mark (Hadoop's line reader drops it, Beam keeps it), and
  named so that Hadoop reads each path as itself (ASCII, no glob characters, no '%' or ':'),
  does not skip it (hidden: '_' or '.' first; in copy: a '._COPYING_' suffix) and does not
  check it against a checksum file beside it (a '.NAME.crc' that Hadoop or Spark wrote, which
  an edit since makes Hadoop refuse the file);
- the coder is Beam's `StrUtf8Coder`, lines are stripped, and no header, delimiter or escape
  character is set.
The lines' bytes go to the SDK untouched: invalid UTF-8 fails the consuming stage, as Beam's
decode fails its read. The files are matched once, at Prepare (Beam matches them when the read
starts, which for a job run when it is prepared is the same moment); empty files have no lines
either way.
"""
from __future__ import annotations

import copy
import os
from collections.abc import Iterable
from dataclasses import dataclass

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2

from sparkbeam import urns
from sparkbeam.plan.native_spark import as_leaf

TEXT_BUFFER_PREFIX = b"spark-text:"
_READ = common_urns.deprecated_primitives.READ.urn
_PICKLED_SOURCE = "beam:source:pickled_python:v1"
_STRING = "beam:coder:string_utf8:v1"
# Suffixes Beam's AUTO or any of Hadoop's codecs decompress by (Hadoop matches them as given).
_COMPRESSED = (".gz", ".bz2", ".deflate", ".zst", ".zstd", ".lz4", ".snappy", ".lzo", ".lzma",
               ".xz", ".br", ".z", ".zz", ".lz", ".gzip")
_AWKWARD = set("*?[]{}\\%:")  # Hadoop reads paths as glob patterns and URIs
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class TextRead:
    """A `Read` of text files done by Spark: its lines are the buffer `buffer_id`."""

    transform: str  # the Read's name, e.g. "ReadLines/Read"
    buffer_id: bytes
    files: tuple[str, ...]  # absolute local paths, none empty
    sizes: tuple[int, ...]  # each file's bytes, as `files`
    # The encoded windowed value of a line up to the line's length (timestamp, window, pane),
    # checked against the stage's input coder once the pipeline is fused (`wire_prefix`).
    prefix: bytes = b""


@dataclass(frozen=True)
class Decision:
    """Which path a transform took and why, for the job's log and message stream."""

    transform: str
    native: bool
    reason: str

    def __str__(self) -> str:
        path = "Spark's text source" if self.native else "Beam's reader"
        return f"{self.transform}: {path} ({self.reason})"


def translate_text_reads(
    proto: beam_runner_api_pb2.Pipeline, skip: Iterable[str] = ()
) -> tuple[beam_runner_api_pb2.Pipeline, dict[bytes, TextRead], list[Decision]]:
    """`proto` with every translatable text `Read` (not named in `skip`) turned into a data
    input of a Spark-made buffer; the reads; a decision for every text `Read`."""
    reads: dict[bytes, TextRead] = {}
    decisions: list[Decision] = []
    out = proto
    for tid, transform in sorted(proto.components.transforms.items()):
        source = _text_source(transform)
        if source is None:
            continue
        name = transform.unique_name or tid
        if name in skip:
            decisions.append(Decision(name, False, "its elements' wire coder is not Beam's "
                                      "plain string encoding"))
            continue
        problem, files = _problem(proto, transform, source)
        if problem:
            decisions.append(Decision(name, False, problem))
            continue
        if out is proto:
            out = copy.deepcopy(proto)
        buffer_id = TEXT_BUFFER_PREFIX + tid.encode()
        as_leaf(out.components, tid, urns.DATA_INPUT, buffer_id)
        sizes = [size for _, size in files]
        reads[buffer_id] = TextRead(name, buffer_id, tuple(p for p, _ in files), tuple(sizes))
        decisions.append(Decision(name, True, f"{len(files)} file(s), {sum(sizes):,} bytes"))
    return out, reads, decisions


def _text_source(transform: beam_runner_api_pb2.PTransform) -> object | None:
    """The `_TextSource` a `Read` reads (exactly that class: `ReadFromTextWithFilename`'s
    subclass pairs lines with names), or None."""
    if transform.spec.urn != _READ:
        return None
    payload = beam_runner_api_pb2.ReadPayload.FromString(transform.spec.payload)
    if (payload.source.urn != _PICKLED_SOURCE
            or payload.is_bounded != beam_runner_api_pb2.IsBounded.BOUNDED):
        return None
    from apache_beam.internal import pickler
    from apache_beam.io import textio

    try:
        source = pickler.loads(payload.source.payload)
    except Exception:  # noqa: BLE001 - a source this process cannot load keeps Beam's path
        return None
    return source if type(source) is textio._TextSource else None  # noqa: SLF001


def _problem(
    proto: beam_runner_api_pb2.Pipeline, transform: beam_runner_api_pb2.PTransform, src: object
) -> tuple[str, list[tuple[str, int]]]:
    """Why Spark's text source would not read exactly Beam's lines ('' if it would), and the
    files with their sizes."""
    from apache_beam import coders
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    get = src.__dict__.get
    options = [
        (get("_strip_trailing_newlines") is not True, "strip_trailing_newlines=False"),
        (get("_skip_header_lines") != 0, f"skip_header_lines={get('_skip_header_lines')}"),
        (get("_header_matcher") is not None or get("_header_processor") is not None,
         "a header matcher"),
        (get("_delimiter") is not None, f"delimiter={get('_delimiter')!r}"),
        (get("_escapechar") is not None, f"escapechar={get('_escapechar')!r}"),
        (type(get("_coder")) is not coders.StrUtf8Coder,
         f"coder {type(get('_coder')).__name__}"),
        (get("_compression_type") not in (CompressionTypes.AUTO, CompressionTypes.UNCOMPRESSED),
         f"compression_type={get('_compression_type')}"),
    ]
    for bad, what in options:
        if bad:
            return f"{what} has no Spark equivalent", []
    outputs = list(transform.outputs.values())
    if len(outputs) != 1 or proto.components.coders[
            proto.components.pcollections[outputs[0]].coder_id].spec.urn != _STRING:
        return "its output is not coded as plain strings", []
    pattern_vp = get("_pattern")
    if pattern_vp is None or not pattern_vp.is_accessible():
        return "its file pattern is a runtime value", []
    pattern = str(pattern_vp.get())
    if FileSystems.get_scheme(pattern) not in (None, "file"):
        return f"{pattern} is not on the local file system", []
    try:
        matched = FileSystems.match([pattern])[0].metadata_list
    except Exception as exc:  # noqa: BLE001 - Beam's reader will say it, in its words
        return f"matching {pattern} failed: {exc}", []
    if not matched:
        return f"no file matches {pattern}", []
    files = []
    for meta in sorted(matched, key=lambda m: m.path):
        # Symbolic links resolved as the file system does: Hadoop, like `abspath`, would
        # resolve 'link/..' textually, to another file.
        path = os.path.realpath(meta.path)
        # Beam's AUTO compression goes by the matched name (a link's own), Spark's by the
        # file it is given (the link's target).
        problem = (f"{meta.path} may be compressed"
                   if os.path.basename(meta.path).lower().endswith(_COMPRESSED)
                   else _file_problem(path, meta.size_in_bytes))
        if problem:
            return problem, []
        if meta.size_in_bytes:
            files.append((path, int(meta.size_in_bytes)))
    return "", files


def _file_problem(path: str, size: int) -> str:
    base = os.path.basename(path)
    if base.lower().endswith(_COMPRESSED):
        return f"{path} may be compressed"
    if (not path.isascii() or _AWKWARD & set(path) or base[:1] in ("_", ".")
            or base.endswith("._COPYING_")):
        return f"Spark would not read the path {path!r} as it is"
    if os.path.exists(os.path.join(os.path.dirname(path), f".{base}.crc")):
        return f"Hadoop would check {path} against its checksum file .{base}.crc"
    if not size:
        return ""
    try:
        with open(path, "rb") as f:
            head = f.read(3)
            f.seek(size - 1)
            last = f.read(1)
    except OSError as exc:
        return f"{path} cannot be read here: {exc}"
    if head == _BOM:
        return f"{path} starts with a byte-order mark"
    if last == b"\r":
        return f"{path} ends with a lone '\\r'"
    return ""


def varint(n: int) -> bytes:
    """Beam's variable-length encoding of a non-negative int."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def wire_prefix(coder_impl: object) -> bytes | None:
    """What every line's encoding starts with under the stage input's windowed coder, or
    None when a line is not encoded as that prefix, its length and its bytes."""
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.timestamp import MIN_TIMESTAMP
    from apache_beam.utils.windowed_value import WindowedValue

    def encode(text: str) -> bytes:
        return coder_impl.encode_nested(  # type: ignore[attr-defined, no-any-return]
            WindowedValue(text, MIN_TIMESTAMP, (GlobalWindow(),)))

    try:
        empty = encode("")
        if not empty.endswith(b"\x00"):
            return None
        prefix = empty[:-1]
        for text in ("a", "é\u2603", "x" * 127, "y" * 128, "z" * 16_384, "\r"):
            data = text.encode("utf-8")
            if encode(text) != prefix + varint(len(data)) + data:
                return None
    except Exception:  # noqa: BLE001 - a coder of something else than strings
        return None
    return prefix


def spark_splits(sizes: Iterable[int], cores: int, open_cost: int, max_bytes: int) -> int:
    """How many tasks Spark's file source makes of files of `sizes` bytes (none empty):
    `FilePartition.maxSplitBytes` (at most `max_bytes`, spark.sql.files.maxPartitionBytes;
    an even share of the bytes per core, each file counted `open_cost` more, at least
    `open_cost`), each file cut in splits of that size, and the splits, longest first,
    packed into tasks of at most that many bytes, each split counted its open cost more
    (`getFilePartitions`)."""
    sizes = list(sizes)
    total = sum(sizes) + len(sizes) * open_cost
    split = min(max_bytes, max(open_cost, total // max(1, cores)))
    chunks = sorted((min(split, size - start) for size in sizes
                     for start in range(0, size, split)), reverse=True)
    tasks = current = 0  # the open task's bytes, its splits' open costs counted (0: none)
    for chunk in chunks:
        if current and current + chunk > split:
            tasks += 1
            current = 0
        current += chunk + open_cost
    return tasks + (current > 0)
