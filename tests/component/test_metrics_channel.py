"""Attempt reports reach the driver's collector over a real loopback socket."""
from __future__ import annotations

import time

from apache_beam.metrics import monitoring_infos

from sparkbeam.control.metrics_channel import (
    AttemptKey,
    MetricsCollector,
    MetricsReporter,
    decode_report,
    encode_report,
)


def _counter(n: int):  # type: ignore[no-untyped-def]
    return monitoring_infos.int64_user_counter("ns", "c", n, ptransform="T")


def test_report_round_trip() -> None:
    key = AttemptKey("job-001", "stage-002", 7, 3, 1)
    report = decode_report(encode_report(key, [_counter(4), _counter(5)])[4:])
    assert report.key == key
    assert [monitoring_infos.extract_counter_value(i) for i in report.infos] == [4, 5]
    assert (report.final, report.ok) == (False, True)


def test_report_header_says_whether_the_attempt_ended_and_succeeded() -> None:
    key = AttemptKey("job-001", "stage-002", 7, 3, 1)
    failed = decode_report(encode_report(key, [], final=True, ok=False)[4:])
    assert (failed.final, failed.failed, failed.succeeded) == (True, True, False)
    done = decode_report(encode_report(key, [], final=True)[4:])
    assert (done.failed, done.succeeded) == (False, True)


def test_latest_report_of_each_attempt_counts_once() -> None:
    collector = MetricsCollector()
    try:
        first = MetricsReporter(collector.address, AttemptKey("job-9", "s", 1, 0, 0), interval=0)
        retry = MetricsReporter(collector.address, AttemptKey("job-9", "s", 1, 0, 1), interval=0)
        first.report([_counter(2)])
        first.report([_counter(2), _counter(3)], final=True)  # cumulative: replaces the first
        retry.report([_counter(10)], final=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
            len(ended := collector.attempt_reports("job-9")) == 2
            and all(r.final for r in ended.values())
        ):
            time.sleep(0.02)
        reports = collector.reports("job-9")
        totals = {k.attempt: sum(monitoring_infos.extract_counter_value(i) for i in v)
                  for k, v in reports.items()}
        assert totals == {0: 5, 1: 10}
        assert collector.reports("job-other") == {}
        ended = {k.attempt: (r.final, r.ok) for k, r in collector.attempt_reports("job-9").items()}
        assert ended == {0: (True, True), 1: (True, True)}
    finally:
        collector.close()


def test_unreachable_collector_is_not_fatal() -> None:
    reporter = MetricsReporter("127.0.0.1:1", AttemptKey("j", "s", 0, 0, 0), interval=0)
    reporter.report([_counter(1)], final=True)  # logs a warning, raises nothing
