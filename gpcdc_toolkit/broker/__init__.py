"""The embedded broker, Apache Kafka in KRaft mode, for the demo and the tests."""

from ._embedded import KAFKA_VERSION, BrokerStatus, EmbeddedBroker, check_reachable, kafka_classpath

__all__ = ["KAFKA_VERSION", "BrokerStatus", "EmbeddedBroker", "check_reachable", "kafka_classpath"]
