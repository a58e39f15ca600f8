"""Which text reads Spark's text source takes over, and the bytes it must produce."""
from __future__ import annotations

import gzip

import apache_beam as beam
import pytest
from apache_beam import coders
from apache_beam.coders.coders import GlobalWindowCoder
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.runners.pipeline_context import PipelineContext
from hypothesis import given
from hypothesis import strategies as st

from sparkbeam.plan.batch import plan_batch
from sparkbeam.plan.native_text import (
    TEXT_BUFFER_PREFIX,
    translate_text_reads,
    varint,
    wire_prefix,
)


def _decisions(read: beam.PTransform) -> list[str]:
    p = beam.Pipeline()
    _ = p | "Lines" >> read | beam.Map(len)
    _, reads, decisions = translate_text_reads(p.to_runner_api())
    assert len(decisions) == 1
    assert bool(reads) == decisions[0].native
    return [str(d) for d in decisions]


def test_plain_files_are_read_by_spark_and_the_read_expansion_leaves_the_pipeline(
        tmp_path) -> None:
    (tmp_path / "a.txt").write_bytes(b"x\r\ny\n")
    (tmp_path / "b.txt").write_bytes(b"")  # no lines either way: not handed to Spark
    p = beam.Pipeline()
    _ = p | "Lines" >> beam.io.ReadFromText(f"{tmp_path}/*.txt") | beam.Map(len)
    proto, reads, decisions = translate_text_reads(p.to_runner_api())
    assert [str(d) for d in decisions] == ["Lines/Read: Spark's text source (1 file(s), 5 bytes)"]
    (read,) = reads.values()
    assert read.files == (str(tmp_path / "a.txt"),) and read.sizes == (5,)
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert "Lines/Read" in names and not any(n.startswith("Lines/Read/") for n in names)
    plan = plan_batch(p.to_runner_api())
    (stage,) = plan.stages
    assert [i.buffer_id for i in stage.inputs] == [read.buffer_id]
    assert read.buffer_id.startswith(TEXT_BUFFER_PREFIX)
    assert plan.text_reads[read.buffer_id].prefix  # checked against the fused coder


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"skip_header_lines": 1}, "skip_header_lines=1 has no Spark equivalent"),
    ({"delimiter": b";"}, "delimiter=b';' has no Spark equivalent"),
    ({"escapechar": b"|"}, "escapechar=b'|' has no Spark equivalent"),
    ({"strip_trailing_newlines": False}, "strip_trailing_newlines=False has no Spark"),
    ({"coder": coders.BytesCoder()}, "coder BytesCoder has no Spark equivalent"),
    ({"compression_type": CompressionTypes.GZIP}, "compression_type=gzip has no Spark"),
])
def test_options_spark_cannot_reproduce_keep_beams_reader(tmp_path, kwargs, reason) -> None:
    (tmp_path / "a.txt").write_bytes(b"x\n")
    (decision,) = _decisions(beam.io.ReadFromText(f"{tmp_path}/a.txt", **kwargs))
    assert decision.startswith("Lines/Read: Beam's reader (") and reason in decision


@pytest.mark.parametrize(("name", "content", "reason"), [
    ("a.gz", gzip.compress(b"x\n", mtime=0), "may be compressed"),
    ("a.TXT.BZ2", b"x\n", "may be compressed"),
    ("bom.txt", b"\xef\xbb\xbfx\n", "starts with a byte-order mark"),
    ("cr.txt", b"x\ny\r", "ends with a lone '\\r'"),
    ("_hidden.txt", b"x\n", "would not read the path"),
    ("odd[1].txt", b"x\n", "would not read the path"),
    ("per%cent.txt", b"x\n", "would not read the path"),
    ("part._COPYING_", b"x\n", "would not read the path"),
    ("caf\u00e9.txt", b"x\n", "would not read the path"),
])
def test_files_spark_would_read_differently_keep_beams_reader(
        tmp_path, name, content, reason) -> None:
    (tmp_path / name).write_bytes(content)
    pattern = str(tmp_path / name).replace("[", "?").replace("]", "?")
    (decision,) = _decisions(beam.io.ReadFromText(pattern))
    assert "Beam's reader" in decision and reason in decision


@pytest.mark.parametrize(("link", "target", "content"), [
    ("latest.txt.gz", "archive-2024", gzip.compress(b"x\n", mtime=0)),  # Beam decompresses it
    ("plain-link.gz", "a.txt", b"x\n"),  # Beam fails on it: not gzip
])
def test_a_link_named_as_compressed_keeps_beams_reader(tmp_path, link, target, content) -> None:
    """Beam's AUTO compression reads the matched name, a link's own; Spark, given the link's
    target, would read its bytes as they are (found by helper-7)."""
    (tmp_path / target).write_bytes(content)
    (tmp_path / link).symlink_to(tmp_path / target)
    (decision,) = _decisions(beam.io.ReadFromText(str(tmp_path / link)))
    assert "Beam's reader" in decision and f"{link} may be compressed" in decision


def test_a_file_with_a_hadoop_checksum_beside_it_keeps_beams_reader(tmp_path) -> None:
    (tmp_path / "part-0.txt").write_bytes(b"edited after Spark wrote it\n")
    (tmp_path / ".part-0.txt.crc").write_bytes(b"crc")
    (decision,) = _decisions(beam.io.ReadFromText(f"{tmp_path}/part-*"))
    assert "checksum file .part-0.txt.crc" in decision


def test_paths_through_symbolic_links_are_the_files_beam_opens(tmp_path) -> None:
    (tmp_path / "x" / "y").mkdir(parents=True)
    (tmp_path / "x" / "a.txt").write_bytes(b"right\n")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "link").symlink_to(tmp_path / "x" / "y")
    (tmp_path / "d" / "a.txt").write_bytes(b"wrong\n")  # where 'link/..' reads textually
    p = beam.Pipeline()
    _ = p | beam.io.ReadFromText(f"{tmp_path}/d/link/../a.txt") | beam.Map(len)
    _, reads, _ = translate_text_reads(p.to_runner_api())
    (read,) = reads.values()
    assert read.files == (str(tmp_path / "x" / "a.txt"),)


def test_reads_with_file_names_and_non_text_reads_are_left_alone(tmp_path) -> None:
    (tmp_path / "a.txt").write_bytes(b"x\n")
    p = beam.Pipeline()
    _ = p | beam.io.ReadFromTextWithFilename(f"{tmp_path}/a.txt") | "A" >> beam.Map(str)
    _ = p | beam.Create([1]) | "B" >> beam.Map(str)
    _, reads, decisions = translate_text_reads(p.to_runner_api())
    assert reads == {} and decisions == []


def test_off_keeps_beams_reader(tmp_path) -> None:
    (tmp_path / "a.txt").write_bytes(b"x\n")
    p = beam.Pipeline()
    _ = p | beam.io.ReadFromText(f"{tmp_path}/a.txt") | beam.Map(len)
    plan = plan_batch(p.to_runner_api(), native=False)
    assert plan.text_reads == {} and plan.decisions == ()
    assert len(plan.stages) == 2  # Beam's read: the source's split, then the SDF


@given(st.integers(min_value=0, max_value=2**35 - 1))
def test_varint_is_beams(n: int) -> None:
    assert varint(n) == coders.VarIntCoder().encode(n)


@given(st.text())
def test_a_line_is_the_prefix_its_length_and_its_bytes(text: str) -> None:
    coder = coders.WindowedValueCoder(coders.StrUtf8Coder(), GlobalWindowCoder())
    prefix = wire_prefix(coder.get_impl())
    assert prefix is not None
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.timestamp import MIN_TIMESTAMP
    from apache_beam.utils.windowed_value import WindowedValue

    data = text.encode("utf-8", "surrogatepass")
    if data != text.encode("utf-8", "ignore"):
        return  # not a line a file can hold
    encoded = coder.get_impl().encode_nested(WindowedValue(text, MIN_TIMESTAMP, (GlobalWindow(),)))
    assert encoded == prefix + varint(len(data)) + data


def test_a_coder_that_writes_lines_otherwise_has_no_prefix() -> None:
    ctx = PipelineContext()
    pickled = coders.WindowedValueCoder(coders.PickleCoder(), GlobalWindowCoder())
    assert wire_prefix(ctx.coders.get_by_id(ctx.coders.get_id(pickled)).get_impl()) is None


_LINE_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"),
                     max_size=20)


@given(lines=st.lists(st.tuples(
    st.one_of(_LINE_TEXT, st.builds(lambda c, n: c * n, st.sampled_from(["x", "é", "\r"]),
                                    st.sampled_from([127, 128, 2**14 - 1, 2**14]))),
    st.booleans()), max_size=30), start=st.integers(0, 3), large=st.booleans())
def test_a_tasks_lines_become_beams_elements(lines: list[tuple[str, bool]], start: int,
                                             large: bool) -> None:
    # What a text-reading stage's tasks make of Spark's lines (`engine/arrow.py`'s
    # `encoded_lines`): each line less one final '\r', as Beam's coder encodes it, even from
    # a batch that is a slice of a larger one.
    import pyarrow as pa
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.timestamp import MIN_TIMESTAMP
    from apache_beam.utils.windowed_value import WindowedValue

    from sparkbeam.engine.arrow import encoded_lines

    texts = [text + ("\r" if cr else "") for text, cr in lines]
    impl = coders.WindowedValueCoder(coders.StrUtf8Coder(), GlobalWindowCoder()).get_impl()
    prefix = wire_prefix(impl)
    assert prefix is not None
    column = pa.array(["pad"] * start + texts, pa.large_string() if large else pa.string())
    batch = pa.RecordBatch.from_arrays([column], names=["value"]).slice(start)
    out = list(encoded_lines(prefix)([batch]))
    got = [bytes(v) for b in out for v in b.column(2).to_pylist()]
    expected = [impl.encode_nested(WindowedValue(t[:-1] if t.endswith("\r") else t,
                                                 MIN_TIMESTAMP, (GlobalWindow(),)))
                for t in texts]
    assert got == expected
    for b in out:
        assert b.column(0).to_pylist() == [0] * b.num_rows
        assert b.column(1).null_count == b.num_rows


def test_a_line_of_four_varint_bytes_is_beams() -> None:
    import pyarrow as pa

    from sparkbeam.engine.arrow import encoded_lines

    line = "y" * (2**21) + "\r"
    (batch,) = encoded_lines(b"")([pa.RecordBatch.from_arrays([pa.array([line, ""])],
                                                              names=["value"])])
    assert batch.column(2).to_pylist() == [varint(2**21) + b"y" * 2**21, varint(0)]


def test_spark_splits_follow_sparks_rule() -> None:
    # Spark's FilePartition rule, worked by hand: the split is an even share of the bytes
    # and open costs per core, at least the open cost and at most the largest split.
    from sparkbeam.plan.native_text import spark_splits

    mb = 1 << 20
    assert spark_splits([12 * mb], 2, mb, 128 * mb) == 2  # split 6.5 MB
    assert spark_splits([12 * mb], 2, 4 * mb, 128 * mb) == 2  # 8 MB, then the 4 MB left
    assert spark_splits([mb // 2], 2, mb, 128 * mb) == 1  # under the open cost
    assert spark_splits([300_000] * 12, 2, mb, 128 * mb) == 2  # 6 to a 7.8 MB task
    assert spark_splits([3 * mb] * 3, 2, mb, 128 * mb) == 3  # 3 + 1 + 3 > 6 MB
    assert spark_splits([125 * mb] * 4, 2, mb, 128 * mb) == 4  # capped at 128 MB
    assert spark_splits([10_240] * 100, 8, mb, 128 * mb) == 8  # at most eight 1 MB tasks
    assert spark_splits([], 2, mb, 128 * mb) == 0


def test_a_sessions_byte_settings_are_read_as_spark_writes_them() -> None:
    from sparkbeam.execute.session import bytes_setting

    class Conf:
        def __init__(self, value: object) -> None:
            self.value = value

        def get(self, name: str) -> object:
            if isinstance(self.value, Exception):
                raise self.value
            return self.value

    class Session:
        def __init__(self, value: object) -> None:
            self.conf = Conf(value)

    for text, value in [("4194304b", 4 << 20), ("1048576", 1 << 20), ("1m", 1 << 20),
                        ("2MB", 2 << 20), ("1g", 1 << 30), ("64k", 64 << 10)]:
        assert bytes_setting(Session(text), "x", 7) == value, text
    assert bytes_setting(Session("lots"), "x", 7) == 7
    assert bytes_setting(Session(RuntimeError("no conf")), "x", 7) == 7
