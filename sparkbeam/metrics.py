"""Beam MetricResults over the monitoring infos that come back from Spark tasks."""
from __future__ import annotations

from collections.abc import Iterable

from apache_beam import coders
from apache_beam.metrics import monitoring_infos
from apache_beam.metrics.cells import BoundedTrieData
from apache_beam.metrics.execution import MetricResult
from apache_beam.metrics.metric import MetricResults
from apache_beam.portability.api import metrics_pb2
from apache_beam.runners.portability import portable_metrics


def _union_payload(type_urn: str, a: bytes, b: bytes) -> bytes:
    """Merges the payloads Beam's `consolidate` has no combiner for (sets and tries)."""
    if type_urn == monitoring_infos.STRING_SET_TYPE:
        coder = coders.IterableCoder(coders.StrUtf8Coder())
        return coder.encode(sorted(set(coder.decode(a)) | set(coder.decode(b))))
    if type_urn == monitoring_infos.BOUNDED_TRIE_TYPE:
        left = BoundedTrieData.from_proto(metrics_pb2.BoundedTrie.FromString(a))
        right = BoundedTrieData.from_proto(metrics_pb2.BoundedTrie.FromString(b))
        return left.combine(right).to_proto().SerializeToString()
    return b  # other kinds without a combiner: the latest report wins


def merge_infos(infos: Iterable[metrics_pb2.MonitoringInfo]) -> list[metrics_pb2.MonitoringInfo]:
    """Merges the monitoring infos of many bundles and tasks into one per metric."""
    merged: dict = {}
    rest = []
    for info in monitoring_infos.consolidate(list(infos)):
        if info.type in _SET_LIKE:
            key = monitoring_infos.to_key(info)
            if key in merged:
                merged[key].payload = _union_payload(info.type, merged[key].payload,
                                                     info.payload)
            else:
                merged[key] = metrics_pb2.MonitoringInfo()
                merged[key].CopyFrom(info)
        else:
            rest.append(info)
    return rest + list(merged.values())


_SET_LIKE = frozenset([monitoring_infos.STRING_SET_TYPE, monitoring_infos.BOUNDED_TRIE_TYPE])


class SparkMetrics(MetricResults):
    """Committed = from successful task attempts (the rows Spark kept); attempted = every
    attempt reported so far (equal to committed unless an attempt's infos were reported
    separately, e.g. live from a running task)."""

    def __init__(
        self,
        committed: Iterable[metrics_pb2.MonitoringInfo],
        attempted: Iterable[metrics_pb2.MonitoringInfo] | None = None,
        user_metrics_only: bool = True,
    ) -> None:
        self.committed_infos = merge_infos(committed)
        self.attempted_infos = (
            merge_infos(attempted) if attempted is not None else list(self.committed_infos)
        )
        self._committed = self._split(self.committed_infos, user_metrics_only)
        self._attempted = self._split(self.attempted_infos, user_metrics_only)

    @staticmethod
    def _split(infos: list[metrics_pb2.MonitoringInfo], user_only: bool) -> list[dict]:
        return list(portable_metrics.from_monitoring_infos(infos, user_only))

    def query(self, filter=None):  # type: ignore[no-untyped-def, override]
        kinds = [self.COUNTERS, self.DISTRIBUTIONS, self.GAUGES, self.STRINGSETS,
                 self.BOUNDED_TRIES]
        out = {}
        for i, kind in enumerate(kinds):
            committed, attempted = self._committed[i], self._attempted[i]
            keys = list(dict.fromkeys(list(attempted) + list(committed)))
            out[kind] = [
                MetricResult(k, committed.get(k), attempted.get(k))
                for k in keys
                if self.matches(filter, k)
            ]
        return out

    def monitoring_infos(self) -> list[metrics_pb2.MonitoringInfo]:
        return list(self.committed_infos)


def element_counts(infos: Iterable[metrics_pb2.MonitoringInfo]) -> dict[str, int]:
    """PCollection id -> elements counted by the SDK (beam:metric:element_count:v1)."""
    counts: dict[str, int] = {}
    for info in infos:
        if info.urn == monitoring_infos.ELEMENT_COUNT_URN:
            pcoll = info.labels.get(monitoring_infos.PCOLLECTION_LABEL, "")
            counts[pcoll] = counts.get(pcoll, 0) + monitoring_infos.extract_counter_value(info)
    return counts
