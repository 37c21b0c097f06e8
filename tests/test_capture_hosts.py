"""One pipeline's capture workers spread over several hosts (two work directories stand
for two hosts): each starts its share with ``--nodes``, neither starts what the other
runs, and either's status is the whole pipeline's, from the slots and Kafka."""

import shutil
import time
import uuid

import psycopg2
import psycopg2.extras
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpcdc_toolkit import ConfigError, GpcdcError
from gpcdc_toolkit.bootstrap import Pipeline, bootstrap, drop_slots
from gpcdc_toolkit.capture import CaptureGroup, capture_status, holder, kafka_watermarks, parse_nodes, wait_until_acknowledged
from gpcdc_toolkit.capture._hosts import _listed, check_nodes, latest_watermarks, worker_application
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.connect import kafka_client_settings, open_cluster
from gpcdc_toolkit.protocol import Topics
from gpcdc_toolkit.validate import check_against_truth, read_captured
from gpcdc_toolkit.workload import WorkloadSpec, read_ground_truth, reset_tables, run_workload

from .test_cli import gpcdc

# -- pure ------------------------------------------------------------------------------


@given(st.sets(st.integers(-1, 300)))
def test_a_node_list_reads_back_as_it_is_shown(contents):
    shown = _listed(sorted(contents))
    assert (parse_nodes(shown.replace(" ", "")) if contents else frozenset()) == contents


@pytest.mark.parametrize(("text", "wanted"), [
    ("0-31", set(range(32))), ("coordinator,0-3", {-1, 0, 1, 2, 3}), ("-1,5,7-8", {-1, 5, 7, 8}), ("3", {3}),
])
def test_node_lists(text, wanted):
    assert parse_nodes(text) == wanted


@pytest.mark.parametrize(("text", "said"), [
    ("31-0", "ends before it starts"), ("0-", "neither a content id"), ("", "neither a content id"),
    ("a-b", "neither a content id"), ("1,,2", "neither a content id"), ("-2", "neither a content id"),
    ("0-3; DROP TABLE t", "neither a content id"), ("0-999999999999", "neither a content id"),
    ("0-65536", "beyond content id 65535"), ("\u0663", "neither a content id"),
    ("1" * 5000, "neither a content id"),
])
def test_bad_node_lists_are_refused_in_a_line(text, said):
    with pytest.raises(ConfigError, match=said) as caught:
        parse_nodes(text)
    assert "\n" not in str(caught.value)


def test_nodes_the_pipeline_does_not_capture_are_refused():
    with pytest.raises(ConfigError, match=r"names 3-4, which the pipeline does not capture \(it captures "
                                          r"coordinator, 0-2\)"):
        check_nodes({0, 3, 4}, [-1, 0, 1, 2])


@given(st.text(max_size=100), st.integers(1, 2**22))
def test_a_worker_names_itself_so_that_any_host_reads_it_back(host, pid):
    name = worker_application(host, pid)
    assert len(name.encode()) <= 63 and name.isascii() and name.isprintable()  # as PostgreSQL keeps it
    found = holder(name)
    assert found is not None and found[1] == pid
    if host and host.isascii() and host.isprintable() and len(host) <= 30:
        assert found[0] == host


@pytest.mark.parametrize("name", [None, "", "pg_recvlogical", "gpcdc capture", "gpcdc capture host pid x",
                                  "gpcdc capturehost pid 3", "psql gpcdc capture h pid 3"])
def test_other_clients_are_not_taken_for_workers(name):
    assert holder(name) is None


@given(st.lists(st.one_of(
    st.fixed_dictionaries({"resolved": st.integers(0, 2**40), "segment": st.integers(-1, 5),
                           "resolved_ts_ms": st.one_of(st.none(), st.integers(0, 2**42))}),
    st.dictionaries(st.sampled_from(["resolved", "segment", "resolved_ts_ms", "op"]),
                    st.one_of(st.none(), st.booleans(), st.text(max_size=3), st.integers(), st.floats())),
    st.integers(), st.text(max_size=5), st.none())))
def test_the_furthest_watermark_of_each_node_is_found_among_anything(values):
    latest = latest_watermarks(values)
    good = [v for v in values if isinstance(v, dict) and {type(v.get("resolved")), type(v.get("segment"))} == {int}
            and type(v.get("resolved_ts_ms")) in (int, type(None))]
    assert set(latest) == {v["segment"] for v in good}
    for node, (lsn, _ts) in latest.items():
        assert lsn == max(v["resolved"] for v in good if v["segment"] == node)


# -- on real servers -------------------------------------------------------------------


@pytest.fixture
def hosts(tmp_path, broker, source):
    """Two configurations of one pipeline, each with a work directory of its own."""
    prefix = f"h{uuid.uuid4().hex[:8]}"
    configs = [load_config({"work_dir": str(tmp_path / name), "kafka.bootstrap_servers": broker.bootstrap_servers,
                            "kafka.topic_prefix": prefix, "source.dsn": source.coordinator_dsn,
                            "capture.heartbeat_interval": 0.3}, environ={}) for name in ("host-a", "host-b")]
    yield configs
    for config in configs:
        CaptureGroup(config).stop()
    pipeline = Pipeline(configs[0].work_dir, prefix)
    drop_slots(source, pipeline.slot, publication=pipeline.publication)


def test_two_hosts_share_the_nodes_and_either_sees_the_whole_pipeline(source, hosts, tmp_path):
    a, b = hosts
    reset_tables(source)
    run_workload(source, WorkloadSpec(threads=1, transactions=5))  # the tables
    start = bootstrap(source, Pipeline(a.work_dir, a.kafka.topic_prefix), "snapshot")
    # Each host has the pipeline's start point (a copy, as a deployment would give it).
    shutil.copytree(Pipeline(a.work_dir, a.kafka.topic_prefix).directory, Pipeline(b.work_dir, b.kafka.topic_prefix).directory)
    here, there = CaptureGroup(a), CaptureGroup(b)
    on_a = here.start(nodes=parse_nodes("coordinator,0"))
    on_b = there.start(nodes=parse_nodes("1-2"))
    assert set(on_a.pids) == {-1, 0} and set(on_b.pids) == {1, 2}
    # Neither host starts a worker for a node the other captures, and each says which.
    again_here, again_there = here.start(), there.start()
    assert again_here.pids == {} and again_there.pids == {}
    assert again_here.elsewhere == {1: worker_application_of(b, 1), 2: worker_application_of(b, 2)}
    assert again_there.elsewhere == {-1: worker_application_of(a, -1), 0: worker_application_of(a, 0)}
    assert here.held_elsewhere([-1, 0, 1, 2]) == {1: worker_application_of(b, 1), 2: worker_application_of(b, 2)}

    truth = tmp_path / "truth.jsonl"
    run_workload(source, WorkloadSpec(threads=2, transactions=200, hot_keys=3), ground_truth=truth)
    wait_until_acknowledged(source, Pipeline(a.work_dir, a.kafka.topic_prefix).slot)
    check = check_against_truth(read_captured(a), read_ground_truth(truth), start.snapshot.sees)
    assert check.ok and check.after >= 150, (check.problems[:5], check.after)

    # Host A's status names host B's workers by their pids, from the slots, and how far
    # Kafka has every node, from its watermarks there.
    deadline = time.monotonic() + 60
    while True:  # each worker sends a watermark every heartbeat
        rows = {r.node: r for r in capture_status(source, here, watermarks_of(a))}
        if all(r.resolved_in_kafka != "-" for r in rows.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # polling the status itself
    assert {n: r.worker for n, r in rows.items()} == {
        -1: f"pid {on_a.pids[-1]}", 0: f"pid {on_a.pids[0]}",
        1: f"pid {on_b.pids[1]} on {holder(worker_application_of(b, 1))[0]}",
        2: f"pid {on_b.pids[2]} on {holder(worker_application_of(b, 2))[0]}"}
    assert all(r.alive and r.resolved_in_kafka != "-" and r.held_by is None for r in rows.values())
    shown = gpcdc(a.work_dir, "--kafka-bootstrap-servers", a.kafka.bootstrap_servers, "--kafka-topic-prefix",
                  a.kafka.topic_prefix, "--source-dsn", source.coordinator_dsn, "status")
    assert shown.returncode == 0, shown.stderr
    # Kafka out of reach: the nodes are still shown, and the exit status says not all is well.
    blind = gpcdc(a.work_dir, "--kafka-bootstrap-servers", "127.0.0.1:1", "--kafka-topic-prefix",
                  a.kafka.topic_prefix, "--source-dsn", source.coordinator_dsn, "status")
    assert blind.returncode == 3 and "nothing is said of what Kafka holds" in blind.stderr, blind.stderr
    assert f"pid {on_a.pids[0]}" in blind.stdout, blind.stdout
    # A node the pipeline does not capture is refused, and nothing is stopped.
    refused = gpcdc(a.work_dir, "--kafka-topic-prefix", a.kafka.topic_prefix, "capture", "stop", "--nodes", "0,7")
    assert refused.returncode == 2 and "--nodes names 7, which the pipeline does not capture" in refused.stderr, \
        refused.stderr
    assert CaptureGroup(a).running() == on_a.pids
    # Host A's `capture start` starts nothing, and says who captures the other nodes.
    started = gpcdc(a.work_dir, "--kafka-bootstrap-servers", a.kafka.bootstrap_servers, "--kafka-topic-prefix",
                    a.kafka.topic_prefix, "--source-dsn", source.coordinator_dsn, "capture", "start")
    assert started.returncode == 0 and "started 0 capture workers" in started.stdout, started.stderr
    for content in (1, 2):
        by = f"pid {on_b.pids[content]} on {holder(worker_application_of(b, content))[0]}"
        assert f"node {content}: captured already by {by}" in started.stdout, started.stdout

    # Host B's workers stopped: host A says which nodes nobody captures now.
    assert there.stop(nodes=parse_nodes("2")) == [2]
    deadline = time.monotonic() + 60
    while True:  # until the node has seen the worker's connection go
        shown = gpcdc(a.work_dir, "--kafka-bootstrap-servers", a.kafka.bootstrap_servers, "--kafka-topic-prefix",
                      a.kafka.topic_prefix, "--source-dsn", source.coordinator_dsn, "status")
        if shown.returncode != 0 or time.monotonic() > deadline:
            break
    assert shown.returncode == 3 and "capture workers are not running for nodes 2 " in shown.stderr, shown.stderr
    assert there.running() == {1: on_b.pids[1]}


def worker_application_of(config, content):
    """What a host's worker of ``content`` calls itself, read back from its node."""
    group = CaptureGroup(config)
    source = open_cluster(config, "source")
    node = next(n for n in source.nodes if n.content == content)
    with source.connect_node(node) as conn:
        row = conn.execute("SELECT application_name FROM pg_stat_replication WHERE pid = (SELECT active_pid FROM "
                           "pg_replication_slots WHERE slot_name = %s)", (group.pipeline.slot,)).fetchone()
    return row[0]


def test_a_slot_held_by_another_client_is_said_and_not_fought_over(source, hosts):
    a, _ = hosts
    run_workload(source, WorkloadSpec(threads=1, transactions=2))
    pipeline = Pipeline(a.work_dir, a.kafka.topic_prefix)
    bootstrap(source, pipeline, "snapshot")
    node = source.segments[1]
    other = psycopg2.connect(source.dsn(node, application_name="pg_recvlogical"),
                             connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        other.cursor().start_replication(slot_name=pipeline.slot, decode=False,
                                         options={**source.decoding_options(), "publication_names": pipeline.publication})
        with pytest.raises(GpcdcError, match=r"slot on node 1 is held by another client \('pg_recvlogical'\)"):
            CaptureGroup(a).start()
        assert CaptureGroup(a).running() == {}  # nothing started
        rows = {r.node: r for r in capture_status(source, CaptureGroup(a))}
        assert rows[1].held_by == "pg_recvlogical" and not rows[1].alive
        assert all(r.held_by is None for n, r in rows.items() if n != 1)
    finally:
        other.close()


def watermarks_of(config):
    return kafka_watermarks(kafka_client_settings(config), Topics(config.kafka.topic_prefix))
