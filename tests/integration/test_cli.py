"""The `sparkbeam` command: `run` a pipeline script, and serve jobs with `job-server`."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONPATH=str(ROOT))


def test_sparkbeam_run_executes_the_wordcount_example(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "counts"
    proc = subprocess.run(
        [sys.executable, "-m", "sparkbeam.cli", "run", str(ROOT / "examples" / "wordcount.py"),
         "--", "--output", str(out), "--spark_master=local[2]", "--progress_interval=0.5"],
        capture_output=True, text=True, timeout=300, env=_env(), check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "word counts written to:" in proc.stdout
    lines = [ln for f in tmp_path.glob("counts*") for ln in f.read_text().splitlines()]
    counts = dict(ln.rsplit(": ", 1) for ln in lines)
    assert counts["better"] == str(8 * 200)  # "better" appears 8 times in the Zen
    # Progress lines on stderr: the counting stage read one element per distinct word, and
    # each stage's last line says it finished all its tasks (the text read's too, whose task
    # count Spark decides).
    assert re.search(rf"stage-\d+ \[Count/[^\]]*Format[^\]]*\]: {len(counts)} elements, "
                     r".* 100% \((\d+)/\1 tasks\)", proc.stderr), proc.stderr[-3000:]
    last = dict(re.findall(r"(stage-\d+) \[.*\]: [\d,]+ elements, .* (\d+% \(\d+/\d+ tasks\))",
                           proc.stderr))
    assert len(last) >= 4, proc.stderr[-3000:]
    assert all(re.fullmatch(r"100% \((\d+)/\1 tasks\)", v) for v in last.values()), last


SPARK_LOG_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (WARN|INFO) ", re.M)


def test_make_run_is_quiet_and_says_where_the_output_is(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`make run` as a newcomer sees it: no Spark warnings or log profile lines, no Beam
    import warnings; what ran, how long it took and where the output is."""
    out = tmp_path / "wordcount"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "wordcount.py"), "--output", str(out)],
        capture_output=True, text=True, timeout=300, env=_env(), check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not SPARK_LOG_LINE.search(proc.stderr), proc.stderr
    for noise in ("apitools", "log4j profile", "Setting default log level"):
        assert noise not in proc.stderr, proc.stderr
    assert re.search(r"counted the words of .+ on Spark \(local\[\*\]\) in [\d.]+ s",
                     proc.stdout), proc.stdout
    written = sorted(str(p) for p in tmp_path.glob("wordcount-*-of-*"))
    assert written and all(f"  {path}" in proc.stdout for path in written)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_job_server_command_serves_a_portable_runner_client(tmp_path) -> None:  # type: ignore[no-untyped-def]
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "sparkbeam.cli", "job-server", "--port", str(port),
         "--artifacts-dir", str(tmp_path / "artifacts")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        client = tmp_path / "client.py"
        client.write_text(
            "import apache_beam as beam\n"
            "from apache_beam.options.pipeline_options import PipelineOptions\n"
            "from apache_beam.testing.util import assert_that, equal_to\n"
            f"opts = PipelineOptions(['--runner=PortableRunner', '--job_endpoint=localhost:{port}',"
            " '--environment_type=LOOPBACK', '--spark_master=local[2]',"
            " '--job_server_timeout=600'])\n"
            "with beam.Pipeline(options=opts) as p:\n"
            "    assert_that(p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 10),"
            " equal_to([10, 20, 30]))\n"
            "print('CLIENT OK')\n"
        )
        proc = subprocess.run([sys.executable, str(client)], capture_output=True, text=True,
                              timeout=300, env=_env(), check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "CLIENT OK" in proc.stdout
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
