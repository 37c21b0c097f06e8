"""The embedded broker: a real Kafka-protocol server in its own process."""

import socket
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from gpcdc_toolkit import BrokerError
from gpcdc_toolkit._runtime import pid_alive
from gpcdc_toolkit.broker import EmbeddedBroker, check_reachable


def test_produce_and_consume(broker):
    servers = broker.bootstrap_servers
    topic = f"t-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": servers})
    for future in admin.create_topics([NewTopic(topic, 2, 1)]).values():
        future.result(10)
    producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True})
    delivered = []
    for i in range(500):
        producer.produce(topic, value=f"m{i}".encode(), partition=i % 2,
                         on_delivery=lambda err, msg: delivered.append(err is None))
    assert producer.flush(10) == 0
    assert len(delivered) == 500 and all(delivered)
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "g", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
    got = set()
    while len(got) < 500:
        message = consumer.poll(10)
        assert message is not None, f"only {len(got)} of 500 messages came back"
        assert message.error() is None
        got.add(message.value().decode())
    consumer.close()
    assert got == {f"m{i}" for i in range(500)}


def test_up_is_idempotent(work_dir, broker):
    assert EmbeddedBroker(work_dir).up().bootstrap_servers == broker.bootstrap_servers


def test_down_stops_the_process_and_status_says_so(tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("broker")
    broker = EmbeddedBroker(work_dir).up()
    pid, servers = broker.pid, broker.bootstrap_servers
    try:
        check_reachable(servers)
    finally:
        broker.down()
    assert not pid_alive(pid)
    with pytest.raises(BrokerError, match="not running.*gpcdc broker up"):
        _ = broker.bootstrap_servers
    with pytest.raises(BrokerError, match=f"no Kafka broker answers at {servers}"):
        check_reachable(servers, timeout=1.0)


def test_port_taken(tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(BrokerError, match=f"port {port} is taken"):
            EmbeddedBroker(tmp_path_factory.mktemp("taken")).up(port=port)
