"""Where a streaming WriteToSpark's files go: pyarrow's paths named back as Spark names them
(`streaming/spark_writes.py`)."""
from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from sparkbeam.streaming.spark_writes import _for_arrow, _uri


@pytest.mark.parametrize(("location", "path", "expected"), [
    ("/data/out", "/data/out/_sparkbeam-staging/q-0", "/data/out/_sparkbeam-staging/q-0"),
    ("file:///data/out", "/data/out/_s", "file:///data/out/_s"),
    ("hdfs://nn:8020/data/out", "/data/out/_s", "hdfs://nn:8020/data/out/_s"),
    ("s3a://bucket/data/out", "bucket/data/out/_s", "s3a://bucket/data/out/_s"),
    ("gs://bucket/out", "bucket/out/_s", "gs://bucket/out/_s"),
])
def test_a_path_is_named_back_with_its_scheme_and_bucket_once(location: str, path: str,
                                                              expected: str) -> None:
    assert _uri(location, path) == expected


def test_spark_s3_schemes_are_pyarrows_s3_and_local_paths_round_trip(tmp_path) -> None:
    assert _for_arrow("s3a://bucket/x") == "s3://bucket/x"
    assert _for_arrow("s3n://bucket/x") == "s3://bucket/x"
    assert _for_arrow("hdfs://nn/x") == "hdfs://nn/x" and _for_arrow("/x") == "/x"
    fs, root = pafs.FileSystem.from_uri(f"file://{tmp_path}")
    assert _uri(f"file://{tmp_path}", root) == f"file://{tmp_path}"
