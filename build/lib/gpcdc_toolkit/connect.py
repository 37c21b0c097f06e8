"""From a configuration to live endpoints: clusters and Kafka client settings."""

from __future__ import annotations

from .broker import EmbeddedBroker
from .cluster import Cluster
from .config import Config
from .sandbox import Sandbox


def open_cluster(config: Config, role: str) -> Cluster:
    """The source or target cluster, by DSN or by sandbox name."""
    ref = config.cluster(role)
    if ref.dsn:
        return Cluster.connect(ref.dsn)
    assert ref.sandbox is not None
    return Sandbox(ref.sandbox, config.work_dir).cluster()


def kafka_client_settings(config: Config) -> dict[str, str]:
    """librdkafka settings: the configured servers, else the embedded broker's."""
    servers = config.kafka.bootstrap_servers or EmbeddedBroker(config.work_dir).bootstrap_servers
    return {**config.kafka.client, "bootstrap.servers": servers}
