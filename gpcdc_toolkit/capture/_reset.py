"""Dropping a pipeline: its workers, slots, state and (on request) topics."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from ..bootstrap import Pipeline, drop_slots
from ..cluster import Cluster
from ..config import Config
from ..connect import kafka_client_settings
from ..protocol import Topics
from ._processes import CaptureGroup
from ._worker import delete_topics as delete_pipeline_topics


@dataclass(frozen=True)
class DroppedPipeline:
    workers: list[int]  # nodes whose capture worker was stopped
    slots: list[int]  # nodes whose slot was dropped
    directory: str | None  # the state directory removed, if there was one
    topics: list[str] | None  # topics deleted; None when not asked to


def drop_pipeline(config: Config, cluster: Cluster, *, delete_topics: bool = False) -> DroppedPipeline:
    """Stop the pipeline's capture workers, drop its slots and publications everywhere,
    remove its start point and snapshot, and (``delete_topics``) its Kafka topics."""
    pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
    workers = CaptureGroup(config).stop()
    dropped = drop_slots(cluster, pipeline.slot, publication=pipeline.publication)
    existed = pipeline.directory.exists()
    shutil.rmtree(pipeline.directory, ignore_errors=True)
    topics = delete_pipeline_topics(kafka_client_settings(config), Topics(pipeline.prefix)) if delete_topics else None
    return DroppedPipeline(workers, dropped, str(pipeline.directory) if existed else None, topics)
