"""Slot bootstrap and capture into Kafka, on a real sandbox, broker and workers."""

import os
import random
import signal
import threading
import time
import uuid

import orjson
import pytest

from gpcdc_toolkit import BrokerError, GpcdcError
from gpcdc_toolkit.bootstrap import BootstrapError, InitialSnapshot, Pipeline, bootstrap, create_slots_naively, drop_slots
from gpcdc_toolkit.capture import CaptureGroup, capture_status, wait_until_acknowledged
from gpcdc_toolkit.capture._processes import last_words
from gpcdc_toolkit.cluster import Session, segment_for
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.protocol import _markers as markers
from gpcdc_toolkit.protocol import _pgoutput as pg
from gpcdc_toolkit.protocol import parse
from gpcdc_toolkit.validate import check_against_truth, read_captured
from gpcdc_toolkit.workload import ACCOUNTS, EVENTS, WorkloadSpec, read_ground_truth, reset_tables, run_workload

from ._load import BackgroundLoad
from ._stream import apply_rows


@pytest.fixture
def config(work_dir, broker, source_sandbox, source):
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"t{uuid.uuid4().hex[:8]}", "source.sandbox": "source"}, environ={})
    yield config
    CaptureGroup(config).stop()
    pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
    drop_slots(source, pipeline.slot, publication=pipeline.publication)


def pipeline_of(config):
    return Pipeline(config.work_dir, config.kafka.topic_prefix)


def slot_gxids(cluster, node, pipeline):
    """The gxids whose markers a node's slot decodes (peeked, not consumed)."""
    with cluster.connect_node(node) as conn:
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
            "'publication_names', %s, 'messages', 'true')", (pipeline.slot, pipeline.publication)).fetchall()
    found = set()
    for (data,) in rows:
        message = parse(bytes(data))
        if isinstance(message, pg.Message):
            marker = markers.decode(message.prefix, message.content)
            if marker is not None:
                found.add(marker.gxid)
    return found


def keys_on(segment, count, start):
    keys, k = [], start
    while len(keys) < count:
        if segment_for([k], 3) == segment:
            keys.append(k)
        k += 1
    return keys


def test_naive_slots_split_a_distributed_transaction(source, config):
    reset_tables(source)
    run_workload(source, WorkloadSpec(threads=1, transactions=1))  # creates the tables
    pipeline = pipeline_of(config)
    split = {}

    def between(node):
        # Right after segment 0's slot exists, a transaction over segments 0 and 1
        # commits: segment 1's slot, created next, starts after it.
        if node.content == 0:
            with Session(source) as session, session.transaction() as tx:
                tx.insert(ACCOUNTS, [{"id": k, "balance": 1, "note": "split"}
                                     for k in keys_on(0, 1, 10**12) + keys_on(1, 1, 10**12)])
            split["gxid"] = tx.gxid

    create_slots_naively(source, pipeline, between=between)
    gxid = split["gxid"]
    assert gxid in slot_gxids(source, source.segments[0], pipeline)
    assert gxid not in slot_gxids(source, source.segments[1], pipeline), "the naive method should split it"


def test_peaceful_waits_for_running_transactions_and_holds_new_ones(source, config):
    reset_tables(source)
    run_workload(source, WorkloadSpec(threads=1, transactions=1))
    pipeline = pipeline_of(config)
    with Session(source) as early, Session(source) as late, source.coordinator_connection() as probe:
        running = early.transaction()
        running.insert(ACCOUNTS, [{"id": k, "balance": 1, "note": "early"} for k in keys_on(0, 1, 2 * 10**12) + keys_on(1, 1, 2 * 10**12)])
        result = {}
        thread = threading.Thread(target=lambda: result.setdefault("start", bootstrap(source, pipeline, "peaceful", timeout=30)))
        thread.start()
        # The bootstrap holds the start lock once it waits for `running`.
        while not probe.execute("SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' "
                                "AND classid = 1196454761 AND mode = 'ExclusiveLock' AND granted)").fetchone()[0]:
            assert thread.is_alive(), "bootstrap ended early"
            threading.Event().wait(0.02)  # polling the lock table
        blocked = {}

        def start_late():
            with late.transaction() as tx:
                keys = keys_on(1, 1, 3 * 10**12) + keys_on(2, 1, 3 * 10**12)
                tx.insert(ACCOUNTS, [{"id": k, "balance": 2, "note": "late"} for k in keys])
            blocked["gxid"] = tx.gxid

        late_thread = threading.Thread(target=start_late)
        late_thread.start()
        running.commit()
        thread.join(60)
        late_thread.join(60)
    start = result["start"]
    assert start.method == "peaceful" and start.lock_window_ms > 0
    assert start.snapshot.sees(running.gxid) and not start.snapshot.sees(blocked["gxid"])
    for segment in (0, 1, 2):
        gxids = slot_gxids(source, source.segments[segment], pipeline)
        assert running.gxid not in gxids
        assert (blocked["gxid"] in gxids) == (segment in (1, 2))
    snapshot = InitialSnapshot(pipeline.snapshot_dir)
    notes = {row[2] for row in snapshot.rows(f"public.{ACCOUNTS}")}
    assert "early" in notes and "late" not in notes


def test_snapshot_filter_cuts_between_slots_and_start_point(source, config):
    """A transaction committed after the slots exist but before the cut is decoded by
    every slot and dropped on every segment; one running at the cut is kept on all."""
    reset_tables(source)
    run_workload(source, WorkloadSpec(threads=1, transactions=1))
    pipeline = pipeline_of(config)

    def rows(base, note):
        return [{"id": k, "balance": 1, "note": note} for k in keys_on(0, 1, base) + keys_on(1, 1, base)]

    with Session(source) as a, Session(source) as b:
        held = {}

        def between_slots_and_cut():
            with a.transaction() as before:
                before.insert(ACCOUNTS, rows(4 * 10**12, "before-cut"))
            held["before"] = before.gxid
            running = b.transaction()
            running.insert(ACCOUNTS, rows(5 * 10**12, "across-cut"))
            held["running"] = running

        start = bootstrap(source, pipeline, "snapshot", slots_created=between_slots_and_cut)
        held["running"].commit()
    before, across = held["before"], held["running"].gxid
    assert start.snapshot.sees(before) and not start.snapshot.sees(across)
    for segment in (0, 1):
        gxids = slot_gxids(source, source.segments[segment], pipeline)
        assert before in gxids and across in gxids  # both decoded; the filter decides
    # Nothing captures yet: waiting says how far each slot stands, and that no worker holds it.
    with pytest.raises(GpcdcError, match=r"did not acknowledge nodes \[-1, 0, 1\b.* within 0.2 s \(node -1: at "
                                         r"[0-9A-F]+/[0-9A-F]+, held by no worker, [0-9A-F]+/[0-9A-F]+ wanted; node 0: "):
        wait_until_acknowledged(source, pipeline.slot, timeout=0.2)
    group = CaptureGroup(config.with_settings({"capture.heartbeat_interval": 0.3}))
    group.start()
    wait_until_acknowledged(source, pipeline.slot)
    captured = read_captured(config)
    assert before not in captured.parts and before not in captured.records
    assert captured.parts[across] == {0, 1} and captured.records[across] == (0, 1)
    notes = {row[2] for row in InitialSnapshot(pipeline.snapshot_dir).rows(f"public.{ACCOUNTS}")}
    assert "before-cut" in notes and "across-cut" not in notes


@pytest.mark.parametrize("method", ["peaceful", "snapshot"])
def test_bootstrap_under_load_captures_every_later_transaction_whole(source, config, work_dir, method):
    reset_tables(source)
    truth = work_dir / f"truth-{method}.jsonl"
    truth.unlink(missing_ok=True)
    spec = WorkloadSpec(threads=3, hot_keys=4, rate=300, move_share=0.05, abort_after_prepare_share=0.05)
    with BackgroundLoad(source, spec, ground_truth=truth) as load:
        load.wait_for_commits(30)  # the workload runs before the bootstrap starts
        start = bootstrap(source, pipeline_of(config), method, timeout=30)
        group = CaptureGroup(config.with_settings({"capture.heartbeat_interval": 0.3}))
        group.start()
        with Session(source) as session:
            session.ddl("ALTER TABLE wl_events ADD COLUMN extra text")
        load.wait_for_commits(60)  # and after it
    wait_until_acknowledged(source, pipeline_of(config).slot)
    captured = read_captured(config)
    check = check_against_truth(captured, read_ground_truth(truth), start.snapshot.sees)
    assert check.ok, check.problems[:5]
    assert check.after > 50 and check.before > 20, (check.after, check.before)
    assert any("ADD COLUMN extra" in d["statement"] for d in captured.ddl)
    # The initial snapshot plus the stream equals the source, segment by segment.
    snapshot = InitialSnapshot(pipeline_of(config).snapshot_dir)
    for table, key in ((ACCOUNTS, ["id"]), (EVENTS, ["account_id", "seq"])):
        columns = snapshot.columns(f"public.{table}")
        for segment, current in source.rows_by_segment(table).items():
            state = {}
            for row in snapshot.rows(f"public.{table}", segment):
                record = dict(zip(columns, row))
                state[tuple(record[k] for k in key)] = record
            apply_rows(state, [r for r in captured.rows
                               if r["source"]["segment"] == segment and r["source"]["table"] == table], key)
            expected = {tuple(r[:len(key)]): r[len(key):len(columns)] for r in current}
            got = {k: tuple(v[c] for c in columns[len(key):]) for k, v in state.items()}
            assert got == expected, f"{table} on segment {segment} differs"


def test_sigkill_at_random_moments_loses_nothing(source, config, work_dir):
    reset_tables(source)
    run_workload(source, WorkloadSpec(threads=1, transactions=1))
    pipeline = pipeline_of(config)
    start = bootstrap(source, pipeline, "snapshot")
    group = CaptureGroup(config.with_settings({"capture.heartbeat_interval": 0.2}))
    group.start()
    truth = work_dir / "truth-kill.jsonl"
    truth.unlink(missing_ok=True)
    spec = WorkloadSpec(threads=3, rate=250, hot_keys=3, large_transaction_rows=20_000)
    rng = random.Random(7)
    kills = 0
    pause = threading.Event()
    with BackgroundLoad(source, spec, ground_truth=truth) as load:
        goal = load.committed + 320
        while load.committed < goal or kills < 5:
            pause.wait(rng.uniform(0.2, 0.9))  # a random moment
            content = rng.choice([-1, 0, 1, 2])
            group.kill(content)
            group.start_node(content, group.log_file(content))
            kills += 1
    wait_until_acknowledged(source, pipeline.slot, timeout=90)
    captured = read_captured(config)
    check = check_against_truth(captured, read_ground_truth(truth), start.snapshot.sees)
    assert check.ok, check.problems[:5]
    assert kills >= 5 and check.after > 300
    # Duplicates are recognisable: once removed, each transaction has exactly its rows.
    counts = {}
    for row in captured.rows:
        k = (row["source"]["segment"], row["source"]["commit_lsn"])
        counts[k] = counts.get(k, 0) + 1
    assert all(counts.get(k, 0) == end["event_count"] for k, end in captured.ends.items())
    assert sum(counts.values()) == len(captured.rows)


def test_large_transaction_with_bounded_worker_memory(source, config):
    reset_tables(source)
    run_workload(source, WorkloadSpec(threads=1, transactions=1))
    pipeline = pipeline_of(config)
    bootstrap(source, pipeline, "snapshot")
    # The producer's queue is the worker's one large buffer; 16 MiB keeps the bound
    # below clear of it, however slowly the broker drains it.
    group = CaptureGroup(config.with_settings({"capture.producer_queue_kbytes": 16384}))
    group.start()
    rows = 300_000
    with Session(source) as session, session.transaction() as tx:
        for first in range(0, rows, 50_000):
            tx.execute(0, f"INSERT INTO {EVENTS} SELECT g, 0, repeat('p', 200) FROM generate_series(%s::bigint, %s::bigint) g "
                          "WHERE true", (5 * 10**12 + first, 5 * 10**12 + first + 49_999))
    wait_until_acknowledged(source, pipeline.slot, timeout=120)
    with open(f"/proc/{group.pid(0)}/status") as f:
        peak_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    captured = read_captured(config)
    large = [e for e in captured.ends.values() if e["gxid"] == tx.gxid]
    assert large and large[0]["event_count"] == rows
    payload_mb = rows * 200 / 1e6
    print(f"worker peak RSS {peak_kb / 1024:.0f} MiB for a {payload_mb:.0f} MB transaction")
    # Holding the transaction would need its 60 MB of values several times over as
    # Python objects; the worker streams it with the producer queue as its bound.
    assert peak_kb / 1024 < 200, f"worker peak RSS {peak_kb / 1024:.0f} MiB for a {payload_mb:.0f} MB transaction"


def test_idle_segments_advance_their_watermarks(source, config):
    pipeline = pipeline_of(config)
    bootstrap(source, pipeline, "snapshot")
    group = CaptureGroup(config.with_settings({"capture.heartbeat_interval": 0.2}))
    group.start()
    def advanced(captured, content):
        times = [m["resolved_ts_ms"] for m in captured.watermarks[content] if m["resolved_ts_ms"] is not None]
        return len(times) >= 3 and times[-1] > times[0]

    stop = threading.Event()
    deadline = time.monotonic() + 90
    while True:
        try:
            captured = read_captured(config)
        except BrokerError:  # the workers have not created the topics yet
            captured = None
        if captured and all(advanced(captured, c) for c in (-1, 0, 1, 2)):
            break
        assert time.monotonic() < deadline, "the watermarks of idle nodes did not advance within 90 s"
        stop.wait(0.2)  # polling Kafka for the watermarks themselves
    for content in (-1, 0, 1, 2):
        # A worker's first watermarks may carry no time yet (before its first clock probe
        # is covered); once they do, they always do, and it never goes back.
        times = [m["resolved_ts_ms"] for m in captured.watermarks[content]]
        first = next((i for i, t in enumerate(times) if t is not None), len(times))
        assert None not in times[first:], times
        assert times[first:] == sorted(times[first:])
        marks = captured.watermarks[content][first:]
        assert len(marks) >= 2 and marks[-1]["resolved_ts_ms"] > marks[0]["resolved_ts_ms"], \
            f"node {content} watermark did not advance"
        assert marks[-1]["resolved"] >= marks[0]["resolved"]
    rows = capture_status(source, group)
    assert [r.node for r in rows] == [-1, 0, 1, 2] and all(r.alive for r in rows)


def test_existing_slots_are_reused_or_refused(source, config):
    pipeline = pipeline_of(config)
    first = bootstrap(source, pipeline, "snapshot")
    reused = []
    assert bootstrap(source, pipeline, "snapshot", on_reuse=reused.append) == first and reused
    pipeline.start_point_file.unlink()
    with pytest.raises(BootstrapError, match="exists on coordinator, segment 0, segment 1, segment 2, but no start point"):
        bootstrap(source, pipeline, "peaceful")


def test_orphaned_prepared_transaction_is_reported(source, config):
    pipeline = pipeline_of(config)
    with source.connect_node(source.segments[1]) as conn:
        conn.execute("BEGIN")
        conn.execute("PREPARE TRANSACTION 'gpcdc_999999'")
        try:
            with pytest.raises(BootstrapError, match=r"orphaned prepared transactions .*'gpcdc_999999' on segment 1.*ROLLBACK PREPARED"):
                bootstrap(source, pipeline, "snapshot")
        finally:
            conn.execute("ROLLBACK PREPARED 'gpcdc_999999'")
    # A refusal leaves nothing behind, and the retry its message asks for succeeds.
    assert not any(slot_exists(source, node, pipeline.slot) for node in source.nodes)
    assert not any(publication_exists(source, node, pipeline.publication) for node in source.nodes)
    assert not pipeline.start_point_file.exists()
    try:
        bootstrap(source, pipeline, "snapshot")
        assert all(slot_exists(source, node, pipeline.slot) for node in source.nodes)
    finally:
        drop_slots(source, pipeline.slot, publication=pipeline.publication)


def publication_exists(cluster, node, name):
    with cluster.connect_node(node) as conn:
        return conn.execute("SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = %s)", (name,)).fetchone()[0]


def slot_exists(cluster, node, slot):
    with cluster.connect_node(node) as conn:
        return conn.execute("SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = %s)", (slot,)).fetchone()[0]


def test_slot_creation_that_cannot_finish_names_what_blocks_it(source, config):
    pipeline = pipeline_of(config)
    with source.connect_node(source.segments[2], autocommit=False) as blocker:
        blocker.execute("SELECT txid_current()")  # a local transaction holding an xid, left open
        pid = blocker.info.backend_pid
        with pytest.raises(BootstrapError, match=rf"segment 2 .* did not finish within 1 s.*backend {pid} holding xid"):
            bootstrap(source, pipeline, "snapshot", timeout=1)
        blocker.rollback()
    assert not any(slot_exists(source, node, pipeline.slot) for node in source.nodes)
    assert not any(publication_exists(source, node, pipeline.publication) for node in source.nodes)
    assert not pipeline.start_point_file.exists() and not pipeline.snapshot_dir.exists()
    for timeout in (-1, 0, float("nan")):
        with pytest.raises(BootstrapError, match="the timeout must be a positive number of seconds"):
            bootstrap(source, pipeline, "snapshot", timeout=timeout)


def test_capture_needs_a_start_point_and_a_broker(source, config, work_dir):
    from .test_cli import gpcdc, one_line_error

    flags = ["--source-sandbox", "source", "--kafka-topic-prefix", config.kafka.topic_prefix]
    assert "no start point" in one_line_error(gpcdc(work_dir, *flags, "--kafka-bootstrap-servers",
                                                    config.kafka.bootstrap_servers, "capture", "start"))
    assert "no Kafka broker answers at 127.0.0.1:1" in one_line_error(
        gpcdc(work_dir, *flags, "--kafka-bootstrap-servers", "127.0.0.1:1", "capture", "start"))


def test_nothing_is_acknowledged_while_kafka_is_away(source, work_dir, source_sandbox):
    from gpcdc_toolkit.broker import EmbeddedBroker
    from gpcdc_toolkit.protocol import parse_lsn

    broker = EmbeddedBroker(work_dir / f"outage-{uuid.uuid4().hex[:6]}").up()
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"o{uuid.uuid4().hex[:8]}", "source.sandbox": "source"}, environ={})
    pipeline = pipeline_of(config)
    # A worker that waited for Kafka's answer before reading on would wait 30 s at a time.
    group = CaptureGroup(config.with_settings({"capture.heartbeat_interval": 0.2, "capture.flush_timeout": 30}))
    truth = work_dir / "truth-outage.jsonl"
    truth.unlink(missing_ok=True)
    try:
        reset_tables(source)
        run_workload(source, WorkloadSpec(threads=1, transactions=1))
        start = bootstrap(source, pipeline, "snapshot")
        group.start()
        # The broker stops answering (frozen, its data kept); a broker that comes back
        # empty is another story, told by test_replay_trust.
        os.kill(broker.pid, signal.SIGSTOP)
        run_workload(source, WorkloadSpec(threads=2, transactions=100, hot_keys=2), ground_truth=truth)
        written = {}
        for node in source.segments:
            with source.connect_node(node) as conn:
                written[node.content] = parse_lsn(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
        stop = threading.Event()
        # The workers read and produce everything while Kafka is away: their watermarks
        # (in the producer's queue) pass what was written.
        deadline = time.monotonic() + 25
        while not all((group.status(c) or {}).get("resolved_lsn", 0) >= lsn for c, lsn in written.items()):
            assert time.monotonic() < deadline, [group.status(c) for c in written]
            stop.wait(0.2)  # polling the workers' own account of how far they have read
        deadline = time.monotonic() + 90
        while not all("waiting for Kafka" in (group.status(c) or {}).get("state", "")
                      or "reconnecting" in (group.status(c) or {}).get("state", "") for c in (-1, 0, 1, 2)):
            assert time.monotonic() < deadline, [group.status(c) for c in (-1, 0, 1, 2)]
            stop.wait(0.2)  # polling the workers' own account of their state
        for node in source.nodes:
            with source.connect_node(node) as conn:
                confirmed, current = conn.execute(
                    "SELECT confirmed_flush_lsn::text, pg_current_wal_flush_lsn()::text FROM pg_replication_slots "
                    "WHERE slot_name = %s", (pipeline.slot,)).fetchone()
            if node.content >= 0:
                assert parse_lsn(confirmed) < parse_lsn(current), f"{node} acknowledged while Kafka was away"
        os.kill(broker.pid, signal.SIGCONT)
        try:
            wait_until_acknowledged(source, pipeline.slot, timeout=150)
        except Exception:
            for c in (-1, 0, 1, 2):
                print(c, group.status(c), group.log_file(c).read_text()[-1500:])
            raise
        records = list(read_ground_truth(truth))
        check = check_against_truth(read_captured(config), records, start.snapshot.sees)
        committed = sum(r["outcome"] == "committed" for r in records)
        assert check.ok and check.after == committed > 50, (check.after, committed, check.problems[:5])
    finally:
        if broker.pid is not None:
            os.kill(broker.pid, signal.SIGCONT)
        group.stop()
        broker.down()
        drop_slots(source, pipeline.slot, publication=pipeline.publication)


def test_workers_that_do_not_stream_in_time_are_stopped_by_the_start_that_began_them(source, work_dir):
    from gpcdc_toolkit.broker import EmbeddedBroker

    broker = EmbeddedBroker(work_dir / f"frozen-{uuid.uuid4().hex[:6]}").up()
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"z{uuid.uuid4().hex[:8]}", "source.sandbox": "source"}, environ={})
    pipeline = pipeline_of(config)
    group = CaptureGroup(config)
    try:
        reset_tables(source)
        run_workload(source, WorkloadSpec(threads=1, transactions=1))
        bootstrap(source, pipeline, "snapshot")
        os.kill(broker.pid, signal.SIGSTOP)  # the workers cannot reach Kafka: none streams
        with pytest.raises(GpcdcError) as raised:
            group.start(timeout=3)
        message = str(raised.value)
        assert "\n" not in message and "did not start streaming within 3 s" in message, message
        assert f"the {len(source.nodes)} workers this start began are stopped" in message, message
        assert group.running() == {}
    finally:
        os.kill(broker.pid, signal.SIGCONT)
        group.stop()
        broker.down()
        drop_slots(source, pipeline.slot, publication=pipeline.publication)


def test_key_dispatcher_spreads_rows_by_key_and_frames_every_partition(source, config):
    from gpcdc_toolkit.connect import kafka_client_settings
    from gpcdc_toolkit.ingest import read_to_end
    from gpcdc_toolkit.protocol import Topics

    reset_tables(source)
    run_workload(source, WorkloadSpec(threads=1, transactions=1))
    pipeline = pipeline_of(config)
    bootstrap(source, pipeline, "snapshot")
    group = CaptureGroup(config.with_settings({"capture.dispatcher": "key", "capture.heartbeat_interval": 0.3}))
    group.start()
    run_workload(source, WorkloadSpec(threads=2, transactions=60, hot_keys=2, update_share=0.3))
    wait_until_acknowledged(source, pipeline.slot)
    messages = [(m.partition(), m.key(), orjson.loads(m.value()))
                for m in read_to_end(kafka_client_settings(config), Topics(config.kafka.topic_prefix).changes)]
    partition_of_key = {}
    ends_per_partition = {}
    for partition, key, v in messages:
        if "op" in v:
            identity = (v["source"]["table"], key)
            assert partition_of_key.setdefault(identity, partition) == partition, "a key's events in two partitions"
        elif v.get("status") == "END":
            ends_per_partition.setdefault(partition, set()).add((v["segment"], v["commit_lsn"]))
    assert len(ends_per_partition) == 3 and len({frozenset(s) for s in ends_per_partition.values()}) == 1
    rows_by_segment_partition = {(v["source"]["segment"], p) for p, _, v in messages if "op" in v}
    assert len(rows_by_segment_partition) > 3, "rows of one segment should spread over partitions"


def test_a_workers_log_says_why_it_ended_a_stop_or_a_crash(source, config):
    bootstrap(source, pipeline_of(config), "snapshot")
    group = CaptureGroup(config)
    log_file = group.log_file(0)
    group.start(nodes=[0])
    pid = group.pid(0)
    group.stop(nodes=[0])
    lines = log_file.read_text().splitlines()
    assert any(line.endswith(f"capture worker {pid} started") for line in lines), lines
    assert lines[-1].endswith(f"capture worker {pid} stopped on SIGTERM"), lines[-3:]

    group.start(nodes=[0])
    pid = group.pid(0)
    os.kill(pid, signal.SIGSEGV)  # as a crash in a client library's C code would end it
    deadline = time.monotonic() + 30
    while "Fatal Python error: Segmentation fault" not in (text := log_file.read_text()):
        assert time.monotonic() < deadline, f"the crash left no stack in the log: {text[-600:]!r}"
        threading.Event().wait(0.05)  # polling the log the dying worker writes
    assert "capture/_worker.py" in text.split("Fatal Python error")[-1]
    assert last_words(text) == "Fatal Python error: Segmentation fault"  # what a start that saw it exit says
