"""Prometheus metrics of the pipeline's long-running processes: each capture worker and
the replayer serves its own on a port of its own (``capture.metrics_port``,
``replay.metrics_port``; off when 0). The figures are read at scrape time from what the
process counts anyway (a worker's stats, the replayer's latest progress): nothing is
counted twice."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

    from .capture._worker import WorkerStats
    from .replay._replayer import Progress


def serve(port: int, setting: str, collect: Callable[[], Iterable[Metric]]) -> None:
    """Serve ``collect``'s metrics, with the process's own (memory, CPU), on ``port`` from
    a thread of this process."""
    from prometheus_client import PLATFORM_COLLECTOR, PROCESS_COLLECTOR, start_http_server
    from prometheus_client.registry import Collector, CollectorRegistry

    class Figures(Collector):
        def collect(self) -> Iterable[Metric]:
            return collect()

    registry = CollectorRegistry(auto_describe=False)
    for collector in (Figures(), PROCESS_COLLECTOR, PLATFORM_COLLECTOR):
        registry.register(collector)
    try:
        start_http_server(port, registry=registry)
    except OSError as e:
        raise ConfigError(f"{setting}: cannot serve metrics on port {port}: {e.strerror or e}",
                          fix=f"give {setting} a free port, or 0 for no metrics") from None


def capture_port(base: int, content: int) -> int:
    """The port of node ``content``'s worker: the coordinator's on ``base``, segment N's on
    ``base + 1 + N``."""
    return base + 1 + content


def _one(kind: type[CounterMetricFamily | GaugeMetricFamily], name: str, documentation: str,
         labels: dict[str, str], value: float) -> Metric:
    """A metric family holding one sample, labelled ``labels``."""
    family = kind(name, documentation, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def capture_metrics(stats: WorkerStats, pipeline: str) -> list[Metric]:
    from prometheus_client.core import CounterMetricFamily as Counter
    from prometheus_client.core import GaugeMetricFamily as Gauge

    labels = {"pipeline": pipeline, "node": str(stats.node)}
    events = Counter("gpcdc_capture_events", "messages produced to Kafka, by kind", labels=[*labels, "kind"])
    for kind, count in sorted(stats.kinds.items()):
        events.add_metric([*labels.values(), kind], count)
    out = [
        events,
        _one(Counter, "gpcdc_capture_bytes", "bytes of messages produced to Kafka", labels, stats.bytes),
        _one(Counter, "gpcdc_capture_transactions", "transactions decoded", labels, stats.transactions),
        _one(Counter, "gpcdc_capture_reconnects", "sessions started again after an error", labels, stats.restarts),
        _one(Counter, "gpcdc_capture_rolled_back_parts", "prepared parts rolled back, never sent", labels,
             stats.rolled_back_parts),
        _one(Gauge, "gpcdc_capture_acknowledged_lsn", "the slot's confirmed position (Kafka holds everything before "
             "it)", labels, stats.acked_lsn),
        _one(Gauge, "gpcdc_capture_lag_bytes", "WAL the server has sent past the slot's confirmed position", labels,
             max(0, stats.server_lsn - stats.acked_lsn) if stats.server_lsn else 0),
        _one(Gauge, "gpcdc_capture_streaming", "1 while the worker streams, 0 while it reconnects or waits for Kafka",
             labels, 1.0 if stats.state == "streaming" else 0.0),
    ]
    if stats.resolved_ts_ms:
        out += [_one(Gauge, "gpcdc_capture_watermark_timestamp_seconds", "server time of the last resolved watermark",
                     labels, stats.resolved_ts_ms / 1000),
                _one(Gauge, "gpcdc_capture_lag_seconds", "now minus the server time the last resolved watermark "
                     "covers", labels, max(0.0, time.time() - stats.resolved_ts_ms / 1000))]
    return out


def replay_metrics(progress: Progress | None, pipeline: str, target: str) -> list[Metric]:
    from prometheus_client.core import CounterMetricFamily as Counter
    from prometheus_client.core import GaugeMetricFamily as Gauge
    from prometheus_client.core import SummaryMetricFamily

    if progress is None:
        return []  # not started yet: no figure rather than zeros
    labels = {"pipeline": pipeline, "target": target}
    batches = SummaryMetricFamily("gpcdc_replay_batch_commit_seconds", "time to apply and commit a batch (one target "
                                  "transaction)", labels=list(labels))
    batches.add_metric(list(labels.values()), count_value=progress.batches, sum_value=progress.batch_seconds)
    return [
        _one(Counter, "gpcdc_replay_applied_transactions", "source transactions applied (DDL ones among them)", labels,
             progress.transactions),
        _one(Counter, "gpcdc_replay_applied_rows", "rows applied", labels, progress.rows),
        _one(Counter, "gpcdc_replay_applied_ddl", "DDL transactions applied", labels, progress.ddl),
        _one(Counter, "gpcdc_replay_quarantined_messages", "malformed messages set aside", labels, progress.set_aside),
        _one(Gauge, "gpcdc_replay_pending_transactions", "arrived in part, or whole and not yet applied", labels,
             progress.pending),
        _one(Gauge, "gpcdc_replay_lag_seconds", "now minus the source commit time of the oldest transaction not yet "
             "applied", labels, progress.lag_ms / 1000),
        _one(Gauge, "gpcdc_replay_caught_up", "1 once every partition was read to where it ended when the run began",
             labels, 1.0 if progress.caught_up else 0.0),
        batches,
    ]
