"""The embedded broker: Apache Kafka in its own process, started and stopped by its pid."""

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


def test_a_restart_keeps_the_port_and_the_data_even_after_a_crash(tmp_path_factory):
    broker = EmbeddedBroker(tmp_path_factory.mktemp("restart")).up()
    try:
        servers = broker.bootstrap_servers
        topic = f"t-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": servers})  # kept: its futures die with it
        for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
            future.result(10)
        producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True})
        for i in range(100):
            producer.produce(topic, value=b"m%d" % i)
        assert producer.flush(10) == 0
        broker.down()
        assert broker.up().bootstrap_servers == servers
        broker.kill()
        assert broker.status().running is False
        assert broker.up().bootstrap_servers == servers
        assert broker.status().answers
        from gpcdc_toolkit.ingest import read_to_end

        assert [m.value() for m in read_to_end({"bootstrap.servers": servers}, topic)] == [b"m%d" % i for i in range(100)]
    finally:
        broker.remove()
    assert not broker.path.exists()


def test_a_failed_start_says_the_brokers_own_reason(tmp_path_factory):
    broker = EmbeddedBroker(tmp_path_factory.mktemp("fails")).up()
    try:
        broker.down()
        meta = broker.data / "meta.properties"
        meta.write_text(meta.read_text().replace("node.id=1", "node.id=7"))
        with pytest.raises(BrokerError) as caught:
            broker.up()
        message = str(caught.value)
        assert "\n" not in message
        assert "exited with status 1: Stored node id 7 doesn't match previous node id 1" in message
        assert str(broker.log_file) in message
        assert broker.pid is None
    finally:
        broker.remove()


def test_status_says_where_it_listens_and_whether_it_answers(tmp_path_factory):
    from .test_cli import gpcdc

    work_dir = tmp_path_factory.mktemp("status")
    assert "is not running; start it" in gpcdc(work_dir, "broker", "status").stderr
    up = gpcdc(work_dir, "broker", "up")
    try:
        assert up.returncode == 0, up.stderr
        servers = EmbeddedBroker(work_dir).bootstrap_servers
        shown = gpcdc(work_dir, "broker", "status")
        assert shown.returncode == 0 and f"answers at {servers}" in shown.stdout
    finally:
        assert gpcdc(work_dir, "broker", "down").returncode == 0
    shown = gpcdc(work_dir, "broker", "status")
    assert shown.returncode == 3 and f"it listened at {servers}" in shown.stderr
    assert gpcdc(work_dir, "broker", "down", "--remove").returncode == 0


def test_topics_keep_their_history_whatever_the_timestamps(broker):
    # Time-based retention would delete, at its next check, messages stamped long ago.
    from confluent_kafka.admin import ConfigResource

    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    topic = f"t-{uuid.uuid4().hex[:8]}"
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(10)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    config = admin.describe_configs([resource])[resource].result(10)
    assert config["retention.ms"].value == "-1" and config["retention.bytes"].value == "-1"


def test_starts_at_the_same_moment_take_turns(tmp_path_factory):
    from concurrent.futures import ThreadPoolExecutor

    broker = EmbeddedBroker(tmp_path_factory.mktemp("race"))
    try:
        with ThreadPoolExecutor(3) as pool:
            started = list(pool.map(lambda _: EmbeddedBroker(broker.path.parent).up(), range(3)))
        assert len({b.pid for b in started}) == 1 and broker.pid == started[0].pid
        check_reachable(broker.bootstrap_servers)
    finally:
        broker.remove()


def test_a_node_of_a_cluster_of_three_replicates_three_times_and_needs_two_in_sync(tmp_path_factory):
    from gpcdc_toolkit.broker._embedded import Quorum, _server_properties

    def properties(quorum):
        text = _server_properties(9092, 9093, tmp_path_factory.mktemp("data"), quorum)
        return dict(line.split("=", 1) for line in text.splitlines())

    one = properties(None)
    assert (one["node.id"], one["default.replication.factor"], one["min.insync.replicas"]) == ("1", "1", "1")
    three = properties(Quorum(2, "1@127.0.0.1:1,2@127.0.0.1:2,3@127.0.0.1:3", 3))
    assert (three["node.id"], three["controller.quorum.voters"]) == ("2", "1@127.0.0.1:1,2@127.0.0.1:2,3@127.0.0.1:3")
    for key in ("default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor"):
        assert three[key] == "3", key
    assert three["min.insync.replicas"] == three["transaction.state.log.min.isr"] == "2"
    # More nodes keep three replicas: a fourth copy buys nothing two in sync do not.
    assert properties(Quorum(1, "…", 5))["default.replication.factor"] == "3"


def test_a_cluster_names_its_nodes_by_kafkas_ids(tmp_path_factory):
    import pytest

    from gpcdc_toolkit.broker import EmbeddedCluster
    from gpcdc_toolkit.errors import BrokerError

    cluster = EmbeddedCluster(tmp_path_factory.mktemp("cluster"), nodes=3)
    assert [node.path.name for node in cluster.nodes] == ["node-1", "node-2", "node-3"]
    assert cluster.node(3) is cluster.nodes[2]
    with pytest.raises(BrokerError, match="nodes 1 to 3, not 4"):
        cluster.node(4)
    with pytest.raises(ValueError, match="at least one node, not 0"):
        EmbeddedCluster(tmp_path_factory.mktemp("none"), nodes=0)


def test_topics_kafka_refuses_for_good_are_a_configuration_error_naming_the_fix(broker):
    """Capture retries what may pass (a broker away), not what Kafka will refuse again:
    more replicas than brokers stops the worker, saying how many brokers there are."""
    from gpcdc_toolkit.capture import ensure_topics
    from gpcdc_toolkit.errors import ConfigError
    from gpcdc_toolkit.protocol import Topics

    kafka = {"bootstrap.servers": broker.bootstrap_servers}
    topics = Topics(f"r{uuid.uuid4().hex[:8]}")
    with pytest.raises(ConfigError) as refused:
        ensure_topics(kafka, topics, 2, replicas=3)
    assert refused.value.message.startswith(f"Kafka refused to create topic {topics.changes}: ")
    assert refused.value.fix == "set kafka.replication_factor to at most the brokers' count (1)"
    ensure_topics(kafka, topics, 2, replicas=1)
    listed = AdminClient(kafka).list_topics(timeout=10).topics
    assert len(listed[topics.changes].partitions) == 2 and len(listed[topics.dtx].partitions) == 1
