"""Capture workers: each node's logical decoding stream into Kafka, with no loss."""

from ._hosts import holder, parse_nodes
from ._processes import CaptureGroup, Started, child_environment, config_environment, run_worker
from ._repair import extend_pipeline, repair_segment
from ._reset import DroppedPipeline, drop_pipeline
from ._status import NodeStatus, capture_status, kafka_watermarks, wait_until_acknowledged
from ._worker import (
    CaptureWorker,
    WorkerSettings,
    WorkerStats,
    delete_topics,
    ensure_topics,
    producer_config,
    tune_for_capture,
)

__all__ = [
    "NodeStatus", "capture_status", "kafka_watermarks", "holder", "parse_nodes", "wait_until_acknowledged",
    "CaptureGroup", "Started", "child_environment", "config_environment", "run_worker", "DroppedPipeline", "drop_pipeline",
    "extend_pipeline", "repair_segment",
    "CaptureWorker", "WorkerSettings", "WorkerStats", "delete_topics", "ensure_topics", "producer_config",
    "tune_for_capture",
]
