"""From a configuration to live endpoints: clusters and Kafka client settings."""

from __future__ import annotations

import logging
import re
import time

from .broker import EmbeddedBroker
from .cluster import Cluster, connect_source, connect_target
from .config import Config
from .errors import ConfigError
from .sandbox import Sandbox


def open_cluster(config: Config, role: str) -> Cluster:
    """The source or target cluster, by DSN or by sandbox name. A target may also be
    reached through a front door (``target.kind``); a source may be a Citus cluster."""
    ref = config.cluster(role)
    kind = config.target.kind if role == "target" else "auto"
    if ref.dsn:
        return connect_target(ref.dsn, kind) if role == "target" else connect_source(ref.dsn)
    assert ref.sandbox is not None
    cluster = Sandbox(ref.sandbox, config.work_dir).cluster()
    if kind != "auto" and (kind == "sandbox") != (cluster.kind == "sandbox"):
        raise ConfigError(f"{role} is sandbox {ref.sandbox!r}, a {cluster.kind} cluster, but {role}.kind is {kind}",
                          fix=f"set target.kind to auto, or name a {kind} sandbox")
    if role == "source" and cluster.kind == "postgres":
        raise ConfigError(f"source is sandbox {ref.sandbox!r}, one plain PostgreSQL server: capture reads a "
                          "Greenplum-style or Citus cluster", fix="name a greenplum or citus sandbox as the source")
    return cluster


def kafka_client_settings(config: Config) -> dict[str, str]:
    """librdkafka settings: the configured servers, else the embedded broker's."""
    servers = config.kafka.bootstrap_servers or EmbeddedBroker(config.work_dir).bootstrap_servers
    return {**config.kafka.client, "bootstrap.servers": servers}


class _OncePerWindow(logging.Filter):
    """Lets a message through once per ``window`` seconds: while a broker is away,
    librdkafka logs every refused reconnection, many times a second."""

    def __init__(self, window: float = 60.0) -> None:
        super().__init__()
        self.window = window
        self.last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        # The text after librdkafka's "[thrd:...]: " prefix, which names the thread, with
        # its numbers (durations, counts of suppressed repeats) left out.
        text = re.sub(r"\d+", "#", record.getMessage().split("]: ", 1)[-1])
        now = time.monotonic()
        if now - self.last.get(text, -self.window) < self.window:
            return False
        if len(self.last) > 1000:  # a long-lived client: forget what is long past
            self.last = {t: at for t, at in self.last.items() if now - at < self.window}
        self.last[text] = now
        return True


_KAFKA_LOG = logging.getLogger("gpcdc.kafka")
_KAFKA_LOG.addFilter(_OncePerWindow())


def kafka_logger() -> logging.Logger:
    """The logger a long-running client (capture's producer, the replayer's consumer)
    gives librdkafka (its ``logger`` setting): each message at most once a minute."""
    return _KAFKA_LOG


# A partition whose leader a metadata answer once gave as none (a KRaft broker fenced
# for a moment, as a paused or starved controller does) is left out of librdkafka's
# metadata until a full refresh, every 5 minutes by default (librdkafka issue #5430):
# a producer's events to it, or a consumer's fetches from it, wait that long.
# Refreshed every 10 s, such a stall ends within seconds. Long-running clients put it
# before the user's settings: [kafka.client] may choose another interval.
METADATA_REFRESH = {"topic.metadata.refresh.interval.ms": 10_000}
