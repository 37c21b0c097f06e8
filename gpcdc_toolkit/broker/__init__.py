"""The embedded broker, Apache Kafka in KRaft mode, for the demo and the tests; and a
cluster of such nodes, replicated as production Kafka is."""

from ._cluster import EmbeddedCluster
from ._embedded import KAFKA_VERSION, BrokerStatus, EmbeddedBroker, check_reachable, kafka_classpath

__all__ = ["KAFKA_VERSION", "BrokerStatus", "EmbeddedBroker", "EmbeddedCluster", "check_reachable", "kafka_classpath"]
