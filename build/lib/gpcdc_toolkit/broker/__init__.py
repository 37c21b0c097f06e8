"""The embedded Kafka-compatible broker for demos and tests."""

from ._embedded import EmbeddedBroker, broker_binary, check_reachable

__all__ = ["EmbeddedBroker", "broker_binary", "check_reachable"]
