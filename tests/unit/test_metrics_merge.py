from __future__ import annotations

from apache_beam.metrics import monitoring_infos
from apache_beam.metrics.cells import DistributionData, StringSetData
from apache_beam.metrics.metricbase import MetricName

from sparkbeam.metrics import SparkMetrics


def _infos():  # type: ignore[no-untyped-def]
    return [
        monitoring_infos.int64_user_counter("ns", "c", 2, ptransform="T"),
        monitoring_infos.int64_user_counter("ns", "c", 3, ptransform="T"),
        monitoring_infos.int64_user_distribution(
            "ns", "d", DistributionData(5, 2, 1, 4), ptransform="T"),
        monitoring_infos.int64_user_distribution(
            "ns", "d", DistributionData(9, 1, 9, 9), ptransform="T"),
        monitoring_infos.user_set_string("ns", "s", StringSetData({"a"}), ptransform="T"),
        monitoring_infos.user_set_string("ns", "s", StringSetData({"zzz"}), ptransform="T"),
    ]


def test_infos_from_many_tasks_merge_per_metric() -> None:
    result = SparkMetrics(_infos()).query()
    (c,) = result["counters"]
    assert c.key.metric == MetricName("ns", "c") and c.committed == 5 and c.attempted == 5
    (d,) = result["distributions"]
    assert (d.committed.sum, d.committed.count, d.committed.min, d.committed.max) == (14, 3, 1, 9)
    (s,) = result["string_sets"]
    assert s.committed == {"a", "zzz"}


def test_attempted_can_exceed_committed() -> None:
    committed = _infos()[:1]
    attempted = _infos()[:2]
    (c,) = SparkMetrics(committed, attempted).query()["counters"]
    assert (c.committed, c.attempted) == (2, 5)
