"""Progress lines of running jobs: in SparkJob's messages and the job server's message stream
(`sparkbeam run`'s, on stderr, are tests/integration/test_cli.py's word count)."""
from __future__ import annotations

import re
import time
from pathlib import Path

import apache_beam as beam
import grpc
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import environments

from sparkbeam.jobservice.server import JobServer
from sparkbeam.plan.model import Plan, Stage
from sparkbeam.runner import SparkJob, prepare
from sparkbeam.spark_executor import SparkJobExecutor

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"stage-\d+ \[.*\]: [\d,]+ elements, .* \d+% \(\d+/\d+ tasks\)")


class _SlowBundles(beam.DoFn):
    """Sleeps at the start of every bundle, so the job runs long enough to report progress."""

    def start_bundle(self) -> None:
        time.sleep(0.05)

    def process(self, element):  # type: ignore[no-untyped-def]
        yield element


def _grouped(p: beam.Pipeline, n: int) -> None:
    # Distinct keys: the stage after the GroupByKey reads exactly n grouped elements.
    _ = (p
         | "Numbers" >> beam.Create(range(n), reshuffle=False)
         | "Key" >> beam.Map(lambda x: (x, 1))
         | "Group" >> beam.GroupByKey()
         | "Slow" >> beam.ParDo(_SlowBundles()))


def _stage_of(plan: Plan, transform: str) -> Stage:
    (stage,) = [s for s in plan.stages if transform in s.description]
    return stage


def _last_line_of(stage: Stage, lines: list[str]) -> str:
    return [line for line in lines if line.startswith(stage.display + ":")][-1]


def test_running_job_reports_progress_lines_and_exact_final_counts() -> None:
    n = 3000
    options = PipelineOptions(["--progress_interval=0.5", "--bundle_size=50"])
    p = beam.Pipeline(options=options)
    _grouped(p, n)
    proto = p.to_runner_api(default_environment=environments.EmbeddedPythonEnvironment.default())
    plan = prepare(proto, options)
    messages: list[str] = []
    job = SparkJob(plan, options, on_message=messages.append)
    job.start()
    assert job.wait(300)
    assert job.state == PipelineState.DONE, job.error

    lines = [m for m in messages if LINE.fullmatch(m)]
    finished = messages.index(next(m for m in messages if "finished in" in m))
    running = [m for m in messages[:finished] if LINE.fullmatch(m)]
    slow = _stage_of(plan, "Slow")
    # Lines while the job ran (before the final one per stage), e.g. the stage part done.
    assert len(running) > len(plan.stages), messages
    final = _last_line_of(slow, lines)
    assert final.startswith(f"{slow.display}: {n:,} elements, ")
    assert re.search(r" 100% \((\d+)/\1 tasks\)$", final), final


def test_progress_lines_can_be_disabled() -> None:
    options = PipelineOptions(["--progress_interval=0"])
    p = beam.Pipeline(options=options)
    _grouped(p, 10)
    proto = p.to_runner_api(default_environment=environments.EmbeddedPythonEnvironment.default())
    messages: list[str] = []
    job = SparkJob(prepare(proto, options), options, on_message=messages.append)
    job.start()
    assert job.wait(300)
    assert job.state == PipelineState.DONE, job.error
    assert not [m for m in messages if LINE.fullmatch(m)], messages


def test_job_server_streams_progress_lines(tmp_path: Path) -> None:
    server = JobServer(SparkJobExecutor(), artifacts_dir=str(tmp_path / "artifacts"))
    server.start()
    try:
        options = PipelineOptions([
            "--runner=PortableRunner", f"--job_endpoint={server.endpoint}",
            "--environment_type=LOOPBACK", "--progress_interval=0.5", "--job_server_timeout=600",
        ])
        p = beam.Pipeline(options=options)
        _grouped(p, 200)
        assert p.run().wait_until_finish() == PipelineState.DONE
        with grpc.insecure_channel(server.endpoint) as channel:
            stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
            (job,) = stub.GetJobs(beam_job_api_pb2.GetJobsRequest()).job_info
            stream = stub.GetMessageStream(
                beam_job_api_pb2.JobMessagesRequest(job_id=job.job_id), timeout=60)
            texts = [m.message_response.message_text for m in stream
                     if m.HasField("message_response")]
        progress = [t for t in texts if LINE.fullmatch(t)]
        assert any(" [Slow]: 200 elements, " in t and " 100% (" in t for t in progress), texts
    finally:
        server.stop()
