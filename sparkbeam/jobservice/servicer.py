"""The Beam Job API servicer: every RPC is decode -> call the JobManager -> encode.

Errors become gRPC status codes in status.py; nothing here decides anything.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from apache_beam.portability.api import (
    beam_job_api_pb2,
    beam_job_api_pb2_grpc,
    endpoints_pb2,
    metrics_pb2,
)

from sparkbeam.jobservice.job import Job
from sparkbeam.jobservice.manager import JobManager
from sparkbeam.jobservice.status import grpc_status

pb = beam_job_api_pb2


class JobService(beam_job_api_pb2_grpc.JobServiceServicer):
    """Serves the Beam Job API over a JobManager (which holds the injected executor)."""

    def __init__(self, jobs: JobManager) -> None:
        self._jobs = jobs

    def DescribePipelineOptions(
        self, request: pb.DescribePipelineOptionsRequest, context: Any
    ) -> pb.DescribePipelineOptionsResponse:
        with grpc_status(context, "DescribePipelineOptions"):
            options = self._jobs.executor.describe_options()
            return pb.DescribePipelineOptionsResponse(options=options)

    def Prepare(
        self, request: pb.PrepareJobRequest, context: Any
    ) -> pb.PrepareJobResponse:
        with grpc_status(context, "Prepare", request.job_name):
            prep = self._jobs.prepare(request.job_name, request.pipeline, request.pipeline_options)
            return pb.PrepareJobResponse(
                preparation_id=prep.preparation_id,
                artifact_staging_endpoint=endpoints_pb2.ApiServiceDescriptor(
                    url=prep.staging_endpoint
                ),
                staging_session_token=prep.staging_token,
            )

    def Run(self, request: pb.RunJobRequest, context: Any) -> pb.RunJobResponse:
        with grpc_status(context, "Run", request.preparation_id):
            return pb.RunJobResponse(job_id=self._jobs.run(request.preparation_id))

    def GetJobs(self, request: pb.GetJobsRequest, context: Any) -> pb.GetJobsResponse:
        with grpc_status(context, "GetJobs"):
            return pb.GetJobsResponse(job_info=[_job_info(job) for job in self._jobs.jobs()])

    def GetState(
        self, request: pb.GetJobStateRequest, context: Any
    ) -> pb.JobStateEvent:
        with grpc_status(context, "GetState", request.job_id):
            return self._jobs.get(request.job_id).state_event()

    def GetPipeline(
        self, request: pb.GetJobPipelineRequest, context: Any
    ) -> pb.GetJobPipelineResponse:
        with grpc_status(context, "GetPipeline", request.job_id):
            return pb.GetJobPipelineResponse(pipeline=self._jobs.get(request.job_id).pipeline)

    def Cancel(self, request: pb.CancelJobRequest, context: Any) -> pb.CancelJobResponse:
        with grpc_status(context, "Cancel", request.job_id):
            return pb.CancelJobResponse(state=self._jobs.get(request.job_id).cancel())  # type: ignore[arg-type]

    def Drain(self, request: pb.DrainJobRequest, context: Any) -> pb.DrainJobResponse:
        with grpc_status(context, "Drain", request.job_id):
            return pb.DrainJobResponse(state=self._jobs.get(request.job_id).drain())  # type: ignore[arg-type]

    def GetStateStream(
        self, request: pb.GetJobStateRequest, context: Any
    ) -> Iterator[pb.JobStateEvent]:
        with grpc_status(context, "GetStateStream", request.job_id):
            yield from self._jobs.get(request.job_id).follow_states(context.is_active)

    def GetMessageStream(
        self, request: pb.JobMessagesRequest, context: Any
    ) -> Iterator[pb.JobMessagesResponse]:
        with grpc_status(context, "GetMessageStream", request.job_id):
            yield from self._jobs.get(request.job_id).follow_messages(context.is_active)

    def GetJobMetrics(
        self, request: pb.GetJobMetricsRequest, context: Any
    ) -> pb.GetJobMetricsResponse:
        with grpc_status(context, "GetJobMetrics", request.job_id):
            committed, attempted = self._jobs.get(request.job_id).metrics()
            return pb.GetJobMetricsResponse(metrics=_metric_results(committed, attempted))


def _job_info(job: Job) -> pb.JobInfo:
    return pb.JobInfo(
        job_id=job.job_id,
        job_name=job.job_name,
        pipeline_options=job.options,
        state=job.state,  # type: ignore[arg-type]
    )


def _metric_results(
    committed: list[metrics_pb2.MonitoringInfo], attempted: list[metrics_pb2.MonitoringInfo]
) -> pb.MetricResults:
    return pb.MetricResults(committed=committed, attempted=attempted)
