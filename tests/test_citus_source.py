"""Citus as a source, against real Citus (coordinator + 2 workers): bootstrap at a
consistent cut while writers run, checked by an independent test_decoding oracle on
every worker; capture; replay into a target equal to the source; a part rolled back
after PREPARE dropped and counted; a worker's part removed from a copy of the topics
proven missing."""

from __future__ import annotations

import random
import re
import subprocess
import threading
import time
import uuid

import psycopg
import pytest

from gpcdc_toolkit.bootstrap import BootstrapError, InitialSnapshot, Pipeline, bootstrap, drop_slots
from gpcdc_toolkit.capture import CaptureGroup, wait_until_acknowledged
from gpcdc_toolkit.citus import gxid_of_gid
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.connect import kafka_client_settings
from gpcdc_toolkit.errors import GpcdcError
from gpcdc_toolkit.ingest import end_offsets
from gpcdc_toolkit.protocol import StartPoint, Topics
from gpcdc_toolkit.replay import APPLIED, MissingPartError, Replayer, ReplaySettings
from gpcdc_toolkit.report import read_runs, run_notebook
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.validate import read_captured, table_rows, validate

from ._kafka import lose_tail
from .test_replay_faults import ENV, applied_count, copy_dropping, gxid_of, replay_command, wait_for_first_commit

pytestmark = pytest.mark.citus


@pytest.fixture(scope="module")
def citus_source(work_dir):
    sandbox = Sandbox("citus-src", work_dir).up(segments=2, flavour="citus")
    try:
        yield sandbox
    finally:
        sandbox.down()


@pytest.fixture
def pipeline_on(citus_source, broker, work_dir, table_name):
    """A distributed table and a fresh pipeline of the Citus source; (cluster, config,
    pipeline, group not yet started, table). All dropped and stopped afterwards."""
    cluster = citus_source.cluster()
    with psycopg.connect(citus_source.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY, v int NOT NULL, note text)")
        conn.execute("SELECT create_distributed_table(%s, 'id')", (table_name,))
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"c{uuid.uuid4().hex[:8]}", "source.sandbox": citus_source.name},
                         environ={})
    pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
    group = CaptureGroup(config.with_settings({"capture.heartbeat_interval": 0.3}))
    try:
        yield cluster, config, pipeline, group, table_name
    finally:
        group.stop()
        drop_slots(cluster, pipeline.slot, publication=pipeline.publication)
        with psycopg.connect(citus_source.dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table_name}")


def capture_into(pipeline_on, replay_target):
    """Bootstrap the pipeline and start its capture, to replay into ``replay_target``:
    (source cluster, config naming the target, pipeline, the table, the target sandbox)."""
    cluster, config, pipeline, group, table = pipeline_on
    target = replay_target[0]
    bootstrap(cluster, pipeline, "snapshot")
    group.start()
    return cluster, config.with_settings({"target.sandbox": target.name}), pipeline, table, target


class Writers:
    """Threads writing through the coordinator until stopped: multi-shard inserts (two
    phases over both workers, several connections each), single-shard inserts (one
    phase), and, unless ``inserts_only``, updates and deletes across shards, some of them
    changing nothing on some workers. Every id is written by one thread only, so the
    final table is the writers' alone."""

    def __init__(self, dsn: str, table: str, threads: int = 3, *, inserts_only: bool = False) -> None:
        self.dsn, self.table, self.inserts_only = dsn, table, inserts_only
        self.stop_event = threading.Event()
        self.commits = [0] * threads
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]

    def _run(self, index: int) -> None:
        rng = random.Random(index)
        next_id, mine = 1_000_000 * (index + 1), []
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop_event.is_set():
                    choice = rng.random()
                    if choice < 0.4 or self.inserts_only and choice < 0.7:
                        ids = list(range(next_id, next_id + rng.randint(2, 12)))
                        conn.execute(f"INSERT INTO {self.table} (id, v) SELECT g, 0 FROM unnest(%s::int[]) g", (ids,))
                    elif choice < 0.7 or self.inserts_only:
                        ids = [next_id]
                        conn.execute(f"INSERT INTO {self.table} (id, v, note) VALUES (%s, 1, 'one')", (next_id,))
                    elif choice < 0.75:
                        # Multi-shard, matching rows on some shards or none: the parts that
                        # change nothing are never decoded, though the decision lists them.
                        ids = []
                        conn.execute(f"UPDATE {self.table} SET v = v + 1 WHERE id = ANY(%s) AND v < 0", (mine[-5:],))
                    elif not mine:
                        continue
                    elif choice < 0.9:
                        ids, some = [], rng.sample(mine, min(len(mine), 6))
                        with conn.transaction():
                            conn.execute(f"UPDATE {self.table} SET v = v + 1 WHERE id = ANY(%s)", (some,))
                            conn.execute(f"UPDATE {self.table} SET note = 'u' WHERE id = %s", some[:1])
                    else:
                        ids, gone = [], rng.sample(mine, min(len(mine), 3))
                        conn.execute(f"DELETE FROM {self.table} WHERE id = ANY(%s)", (gone,))
                        mine = [i for i in mine if i not in gone]
                    next_id += len(ids)
                    mine += ids
                    self.commits[index] += 1
        except BaseException as e:  # seen by the test through stop()
            self.errors.append(e)

    def __enter__(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_for_commits(self, count: int, timeout: float = 120.0) -> None:
        goal = sum(self.commits) + count
        deadline = time.monotonic() + timeout
        while sum(self.commits) < goal:
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, f"{sum(self.commits)} of {goal} commits after {timeout:g} s"
            self.stop_event.wait(0.02)  # polling the writers' own count

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=60)
        assert not self.errors, self.errors


def acknowledged_or_explained(cluster, slot, group, timeout):
    """Wait until capture has acknowledged everything written so far; if it does not,
    fail with what every worker and every node's slot says."""
    try:
        wait_until_acknowledged(cluster, slot, timeout=timeout)
    except GpcdcError as e:
        lines = [str(e)]
        for node in cluster.nodes:
            with cluster.connect_node(node) as conn:
                slot_row = conn.execute("SELECT active, active_pid, confirmed_flush_lsn, pg_current_wal_flush_lsn() "
                                        "FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
                prepared = conn.execute("SELECT gid, prepared FROM pg_prepared_xacts").fetchall()
            lines.append(f"node {node.content}: slot (active, pid, acknowledged, flushed) {slot_row}, prepared {prepared}")
            lines.append(f"worker status {group.status(node.content)}")
            lines.append(group.log_file(node.content).read_text()[-3000:])
        pytest.fail("\n".join(lines))


def settled(cluster, slot, group, config, timeout=240):
    """Wait until a replay can apply everything committed so far: capture has it in
    Kafka, and every worker has sent a watermark whose prepared list was read a clock
    skew after now. Citus prepares every connection a transaction used, and decoding
    sends nothing for one that wrote nothing: such a part is proven empty only by a
    watermark read that long after its record."""
    acknowledged_or_explained(cluster, slot, group, timeout)
    since_ms = time.time() * 1000 + ReplaySettings().clock_skew_ms
    deadline = time.monotonic() + 60
    while True:
        watermarks = read_captured(config).watermarks
        late = [n.content for n in cluster.segments
                if not any(w.get("prepared_ts_ms", -1) >= since_ms for w in watermarks[n.content])]
        if not late:
            return
        assert time.monotonic() < deadline, f"no watermark of workers {late} read after {since_ms:.0f} ms"
        threading.Event().wait(0.2)  # polling Kafka for the workers' next watermarks


def oracle_slots(cluster, name):
    """An independent test_decoding slot (two-phase) on every worker, made before anything else."""
    for node in cluster.segments:
        with cluster.connect_node(node) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding', false, true)", (name,))


def oracle_transactions(cluster, name, table):
    """Per worker, every transaction its oracle slot decoded, committed: (xid, gid or
    None, ids inserted into ``table``'s shards). Prepared parts show their rows at
    PREPARE; those rolled back are left out."""
    out = {}
    for node in cluster.segments:
        with cluster.connect_node(node) as conn:
            lines = [r[0] for r in conn.execute(
                "SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL, 'include-xids', '1', "
                "'skip-empty-xacts', '1')", (name,))]
            conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
        open_rows, prepared, committed = [], {}, []
        for line in lines:
            if re.fullmatch(r"BEGIN \d+", line):
                open_rows = []
            elif m := re.match(rf"table public\.{table}_\d+: INSERT: id\[integer\]:(\d+)", line):
                open_rows.append(int(m[1]))
            elif m := re.fullmatch(r"PREPARE TRANSACTION '(.*)', txid (\d+)", line):
                prepared[m[1]] = (int(m[2]), open_rows)
            elif m := re.fullmatch(r"COMMIT PREPARED '(.*)', txid (\d+)", line):
                part_xid, rows = prepared.pop(m[1])
                committed.append((part_xid, m[1], rows))
            elif m := re.fullmatch(r"COMMIT (\d+)", line):
                committed.append((int(m[1]), None, open_rows))
        out[node.content] = committed
    return out


def test_bootstrap_while_writers_run_splits_no_distributed_transaction(pipeline_on, citus_source):
    cluster, config, pipeline, group, table = pipeline_on
    oracle = f"oracle_{uuid.uuid4().hex[:6]}"
    oracle_slots(cluster, oracle)
    with pytest.raises(BootstrapError, match="no gate that holds distributed transactions at their start"):
        bootstrap(cluster, pipeline, "peaceful")
    with Writers(citus_source.dsn, table, threads=3, inserts_only=True) as writers:
        writers.wait_for_commits(30)
        start = bootstrap(cluster, pipeline, "snapshot")
        group.start()
        writers.wait_for_commits(150)
    wait_until_acknowledged(cluster, pipeline.slot)
    transactions = oracle_transactions(cluster, oracle, table)
    snapshot = InitialSnapshot(pipeline.snapshot_dir)
    in_snapshot = {row[0] for row in snapshot.rows(f"public.{table}")}
    captured = read_captured(config)
    in_kafka = [r["after"]["id"] for r in captured.rows if r["op"] == "c"]
    assert len(in_kafka) == len(set(in_kafka)), "a row captured twice"
    in_kafka_ids = set(in_kafka)
    sides: dict[int, set[bool]] = {}
    before = after = 0
    for content, committed in transactions.items():
        for xid, gid, ids in committed:
            if not ids:
                continue
            # Independent of the start point: each transaction wholly in the snapshot, or wholly in Kafka.
            whole_before = set(ids) <= in_snapshot and not set(ids) & in_kafka_ids
            whole_after = set(ids) <= in_kafka_ids and not set(ids) & in_snapshot
            assert whole_before or whole_after, (content, xid, gid, ids)
            before += whole_before
            after += whole_after
            assert start.captures(content, 0, None, xid) == whole_after  # and the start point says so
            if gid is not None:
                sides.setdefault(gxid_of_gid(gid), set()).add(whole_after)
    split = {g: s for g, s in sides.items() if len(s) > 1}
    assert not split, f"distributed transactions split by the start point: {split}"
    assert before and after and len([g for g in sides]) > 10
    with psycopg.connect(citus_source.dsn) as conn:
        source_ids = {r[0] for r in conn.execute(f"SELECT id FROM {table}")}
    assert in_snapshot | in_kafka_ids == source_ids
    # Each captured part of a distributed transaction holds all its parts' rows on that worker.
    for content, committed in transactions.items():
        for gxid in {gxid_of_gid(g) for _x, g, ids in committed if g and ids and set(ids) <= in_kafka_ids}:
            rows = sorted(i for _x, g, ids in committed if g and gxid_of_gid(g) == gxid for i in ids)
            got = sorted(r["after"]["id"] for r in captured.rows if r["source"]["gxid"] == gxid
                         and r["source"]["segment"] == content)
            assert got == rows
    assert StartPoint.from_json(start.to_json()) == start


@pytest.mark.parametrize("replay_target", ["postgres"], indirect=True)
def test_replay_of_a_citus_source_reproduces_it_and_drops_rolled_back_parts(pipeline_on, citus_source, replay_target):
    cluster, config, pipeline, group, table = pipeline_on
    target, target_config, _pipeline, _group = replay_target
    config = config.with_settings({"target.sandbox": target.name})
    with psycopg.connect(citus_source.dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {table} (id, v) SELECT g, g FROM generate_series(1, 50) g")
    bootstrap(cluster, pipeline, "snapshot")
    group.start()
    with Writers(citus_source.dsn, table, threads=3) as writers:
        writers.wait_for_commits(200)
    # A part rolled back after its PREPARE, as Citus rolls back a transaction whose
    # PREPARE failed elsewhere: decoded, then dropped.
    worker = cluster.segments[0]
    shard = cluster.fetch_on(worker, "SELECT shard_name(logicalrelid, shardid) FROM pg_dist_shard JOIN pg_dist_placement "
                                     "USING (shardid) WHERE logicalrelid = %s::regclass AND groupid = %s LIMIT 1",
                             (table, cluster.group_of(worker)))[0][0]
    with cluster.connect_node(worker) as conn:
        conn.execute(f"BEGIN; INSERT INTO {shard} (id, v) VALUES (-7, -7); PREPARE TRANSACTION 'citus_0_99_77_1'")
        conn.execute("ROLLBACK PREPARED 'citus_0_99_77_1'")
    settled(cluster, pipeline.slot, group, config)
    deadline = time.monotonic() + 30
    while sum((group.status(n.content) or {}).get("rolled_back_parts", 0) for n in cluster.nodes) != 1:
        assert time.monotonic() < deadline, [group.status(n.content) for n in cluster.nodes]
        threading.Event().wait(0.1)  # polling the workers' status, written every heartbeat
    with Replayer(config) as replayer:
        done = replayer.run()
    assert done.pending == 0
    target_cluster = target.cluster()
    assert table_rows(target_cluster, table) == table_rows(cluster, table)
    # Nothing applied twice: a second run applies nothing.
    with Replayer(config) as replayer:
        assert replayer.run().transactions == 0
    applied = table_rows(target_cluster, APPLIED)
    assert len(applied) == len({row[1] for row in applied})


def test_a_workers_missing_part_stops_the_replay_before_it(pipeline_on, citus_source, replay_target):
    cluster, config, pipeline, table, target = capture_into(pipeline_on, replay_target)
    with Writers(citus_source.dsn, table, threads=2, inserts_only=True) as writers:
        writers.wait_for_commits(80)
    wait_until_acknowledged(cluster, pipeline.slot)
    captured = read_captured(config)
    two_phase = [g for g, segments in captured.records.items() if segments and len(segments) == 2]
    victim = two_phase[len(two_phase) // 2]
    dropped_segment = captured.records[victim][1]
    record_ts = max(r["source"]["ts_ms"] for r in captured.rows if r["source"]["gxid"] == victim)
    deadline = time.monotonic() + 90
    while not any(w.get("prepared_ts_ms", -1) > record_ts + 1000 for w in read_captured(config).watermarks[dropped_segment]):
        assert time.monotonic() < deadline, "no watermark past the record"
        threading.Event().wait(0.2)  # polling Kafka for the worker's next watermark
    broken, dropped = copy_dropping(config, lambda p, v: p == dropped_segment and gxid_of(v) == victim)
    assert dropped >= 2
    with Replayer(broken, settings=ReplaySettings(clock_skew_ms=0)) as replayer, \
            pytest.raises(MissingPartError) as raised:
        replayer.run()
    assert (raised.value.missing.gxid, raised.value.missing.segment) == (victim, dropped_segment)
    assert victim not in {row[1] for row in table_rows(target.cluster(), APPLIED)}


@pytest.mark.parametrize("replay_target", ["postgres"], indirect=True)
def test_capture_killed_and_replay_resumed_while_writers_run_apply_everything_once(pipeline_on, citus_source, replay_target):
    cluster, config, pipeline, group, table = pipeline_on
    target, _config, _pipeline, _group = replay_target
    config = config.with_settings({"target.sandbox": target.name, "replay.batch_transactions": 5})
    bootstrap(cluster, pipeline, "snapshot")
    group.start()
    rng = random.Random(3)
    target_cluster = None
    with Writers(citus_source.dsn, table, threads=3) as writers:
        for _round in range(4):
            writers.wait_for_commits(40)
            # A worker of any node killed mid-stream: it resumes from the partition's tail,
            # numbering on, and what it decodes again is not handed out twice.
            node = rng.choice([-1, 0, 1])
            group.kill(node)
            group.start_node(node, group.log_file(node))
            with Replayer(config) as replayer:  # a replayer stopped partway (its batches are its checkpoints)
                replayer.run()
    settled(cluster, pipeline.slot, group, config)
    with Replayer(config) as replayer:
        done = replayer.run()
    assert done.pending == 0
    target_cluster = target.cluster()
    assert table_rows(target_cluster, table) == table_rows(cluster, table)
    captured = read_captured(config)
    for segment in range(len(cluster.segments)):
        numbers = [e["number"] for e in captured.ends.values() if e["segment"] == segment]
        assert sorted(numbers) == list(range(1, len(numbers) + 1)), f"segment {segment}'s numbers have a gap"
    applied = [row[1] for row in table_rows(target_cluster, APPLIED)]
    assert len(applied) == len(set(applied))


@pytest.mark.parametrize("replay_target", ["postgres"], indirect=True)
def test_validation_at_sync_points_while_writers_run_is_verified_and_finds_divergences(pipeline_on, citus_source,
                                                                                       replay_target):
    cluster, config, pipeline, group, table = pipeline_on
    target, _config, _pipeline, _group = replay_target
    config = config.with_settings({"target.sandbox": target.name})
    with psycopg.connect(citus_source.dsn, autocommit=True) as conn:  # rows the writers leave alone
        conn.execute(f"INSERT INTO {table} (id, v) SELECT g, g FROM generate_series(1, 200) g")
    bootstrap(cluster, pipeline, "snapshot")
    group.start()
    target_cluster = target.cluster()
    stop_replay, failures = threading.Event(), []

    def replay():
        try:
            with Replayer(config) as replayer:
                replayer.run(follow=True, should_stop=stop_replay.is_set)
        except BaseException as e:  # reported by the test
            failures.append(e)

    follower = threading.Thread(target=replay)
    follower.start()
    tables = [("public", table)]
    try:
        with Writers(citus_source.dsn, table, threads=2) as writers:
            runs = []
            for _ in range(2):
                writers.wait_for_commits(30)
                runs.append(validate(config, tables=tables, source=cluster, target=target_cluster))
        for run in runs:
            assert run.equal and run.verified, run.lines()
            assert run.syncpoint["stall_ms"] > 0 and run.syncpoint["replay_hold_ms"] is not None
            assert run.results[0].diff.expected > 200
        assert runs[1].syncpoint["syncpoint"] > runs[0].syncpoint["syncpoint"]
        # Divergences made by hand at the target, in rows the writers left alone.
        with target_cluster.coordinator_connection() as conn:
            conn.execute(f"DELETE FROM {table} WHERE id = 5")
            conn.execute(f"UPDATE {table} SET v = v + 1 WHERE id IN (6, 7)")
        found = validate(config, tables=tables, source=cluster, target=target_cluster)
        (result,) = found.results
        assert not found.equal and (result.diff.missing, result.diff.extra, result.diff.changed) == (1, 0, 2)
    finally:
        stop_replay.set()
        follower.join(60)
    assert not follower.is_alive() and not failures, failures


@pytest.mark.parametrize("replay_target", ["postgres"], indirect=True)
def test_a_part_held_prepared_past_its_decision_is_late_not_missing(pipeline_on, citus_source, replay_target):
    cluster, config, pipeline, table, target = capture_into(pipeline_on, replay_target)
    worker = cluster.segments[0]
    shard = cluster.fetch_on(worker, "SELECT shard_name(logicalrelid, shardid) FROM pg_dist_shard JOIN pg_dist_placement "
                                     "USING (shardid) WHERE logicalrelid = %s::regclass AND groupid = %s LIMIT 1",
                             (table, cluster.group_of(worker)))[0][0]
    gid = "citus_0_77777_4242_1"  # as Citus names a part, of a transaction no backend of its runs
    with psycopg.connect(citus_source.dsn, autocommit=True) as coordinator:
        # Citus's recovery would commit the part (its decision is there): not during this test.
        coordinator.execute("ALTER SYSTEM SET citus.recover_2pc_interval = -1")
        coordinator.execute("SELECT pg_reload_conf()")
        try:
            with cluster.connect_node(worker) as conn:  # the part, prepared before its decision, as Citus does
                conn.execute("SET citus.enable_manual_changes_to_shards TO on")
                conn.execute(f"BEGIN; INSERT INTO {shard} (id, v) VALUES (-1, -1); PREPARE TRANSACTION '{gid}'")
            coordinator.execute("INSERT INTO pg_dist_transaction (groupid, gid) VALUES (%s, %s)",
                                (cluster.group_of(worker), gid))  # the decision, committed
            decided = time.time() * 1000
            # A watermark of the worker whose prepared list, read well after the decision, still holds it.
            deadline = time.monotonic() + 60
            while not any(w.get("prepared_ts_ms", -1) > decided + 1500 for w in read_captured(config).watermarks[0]):
                assert time.monotonic() < deadline, "no watermark past the decision"
                threading.Event().wait(0.2)  # polling Kafka for the worker's next watermark
            with Replayer(config, settings=ReplaySettings(clock_skew_ms=0)) as replayer:
                # Read to the end: a part proven missing would raise; this one waits, late.
                assert replayer.run().pending == 1
            assert (-1, -1, None) not in table_rows(target.cluster(), table)
            with cluster.connect_node(worker) as conn:
                conn.execute(f"COMMIT PREPARED '{gid}'")  # its COMMIT PREPARED comes, late
        finally:
            coordinator.execute("ALTER SYSTEM RESET citus.recover_2pc_interval")
            coordinator.execute("SELECT pg_reload_conf()")
    wait_until_acknowledged(cluster, pipeline.slot)
    with Replayer(config) as replayer:
        assert replayer.run().pending == 0
    assert (-1, -1, None) in table_rows(target.cluster(), table)


@pytest.mark.parametrize("replay_target", ["postgres"], indirect=True)
def test_replayer_and_capture_killed_at_random_moments_apply_everything_once(pipeline_on, citus_source,
                                                                             replay_target, work_dir):
    cluster, config, pipeline, table, target = capture_into(pipeline_on, replay_target)
    # The fixture's group, its workers restarted with a short backoff: a worker killed
    # mid-session may find its slot still held for a moment by the server.
    group = CaptureGroup(config.with_settings({"capture.heartbeat_interval": 0.3, "capture.max_backoff": 2.0}))
    target_cluster = target.cluster()
    command = [*replay_command(work_dir, target, config, "--replay-batch-transactions", "7")]
    command[command.index("--source-sandbox") + 1] = citus_source.name
    rng = random.Random(5)
    kills, replayer = 0, None
    with Writers(citus_source.dsn, table, threads=3) as writers:
        try:
            while kills < 5:
                writers.wait_for_commits(20)  # something new for each replayer to commit
                replayer = subprocess.Popen(command, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.PIPE, text=True)
                wait_for_first_commit(target_cluster, replayer, applied_count(target_cluster))
                threading.Event().wait(rng.uniform(0.0, 0.5))  # a random moment while it applies
                replayer.kill()
                replayer.wait()
                kills += 1
                node = rng.choice([-1, 0, 1])  # and a capture worker, so that the stream holds resends
                group.kill(node)
                group.start_node(node, group.log_file(node))
        finally:
            if replayer is not None and replayer.poll() is None:
                replayer.kill()
                replayer.wait()
    settled(cluster, pipeline.slot, group, config)
    with Replayer(config) as last:
        assert last.run().pending == 0
    assert table_rows(target_cluster, table) == table_rows(cluster, table)
    captured = read_captured(config)
    committed = {end["gxid"] for end in captured.ends.values() if end["gxid"] is not None} | set(captured.records)
    applied = [row[1] for row in table_rows(target_cluster, APPLIED)]
    assert len(applied) == len(set(applied)), "a transaction applied twice"
    assert sorted(applied) == sorted(committed)


@pytest.mark.parametrize("replay_target", ["postgres"], indirect=True)
def test_the_jobs_run_as_notebooks_into_reports_on_a_citus_source(pipeline_on, citus_source, replay_target, tmp_path):
    cluster, config, pipeline, _group, table = pipeline_on
    target = replay_target[0]
    config = config.with_settings({"target.sandbox": target.name, "capture.heartbeat_interval": 0.3})
    reports = tmp_path / "reports"
    runs = {}

    def job(notebook, **parameters):
        runs[notebook] = done = run_notebook(config, notebook, parameters, reports=reports)
        assert done.status == "ok", done.line()

    stop_replay, failures = threading.Event(), []

    def follow():
        try:
            with Replayer(config) as replayer:
                replayer.run(follow=True, should_stop=stop_replay.is_set)
        except BaseException as e:  # reported by the test
            failures.append(e)

    with Writers(citus_source.dsn, table, threads=2) as writers:
        writers.wait_for_commits(20)
        job("bootstrap")  # while the writers run
        job("capture")
        writers.wait_for_commits(40)
        job("replay")
        follower = threading.Thread(target=follow)
        follower.start()
        try:
            job("validate", tables=table)  # at a sync point taken while they write, the replayer following
        finally:
            stop_replay.set()
            follower.join(60)
        assert not follower.is_alive() and not failures, failures
    wait_until_acknowledged(cluster, pipeline.slot)
    job("audit", fail_on="warning")
    job("explore")
    assert runs["validate"].headline.figures["tables equal"] == 1
    assert runs["audit"].headline.figures["messages read"] > 100
    assert runs["bootstrap"].headline.figures["nodes with a slot"] == 3
    listed = {run["job"]: run for run in read_runs(reports)}
    assert sorted(listed) == sorted(runs) and {r["status"] for r in listed.values()} == {"ok"}
    for done in runs.values():
        assert done.report.is_file()


def test_a_tail_kafka_lost_after_acknowledging_it_stops_the_workers_capture_for_good(pipeline_on, citus_source):
    """Single-shard inserts (a worker's one-phase parts, which no decision names),
    acknowledged to the worker's slot, then lost by Kafka: capture, started again, finds
    the partition ending before the last event Kafka had confirmed to it and stops the
    worker's capture for good, rather than number on from what is left; a Citus source's
    worker cannot be captured again on its own, so the fix is a new bootstrap."""
    cluster, config, pipeline, group, table = pipeline_on
    kafka = kafka_client_settings(config)
    topic = Topics(config.kafka.topic_prefix).changes
    bootstrap(cluster, pipeline, "snapshot")
    group.start()
    wait_until_acknowledged(cluster, pipeline.slot)
    keep = end_offsets(kafka, topic, [0])[0]
    with psycopg.connect(citus_source.dsn, autocommit=True) as conn:
        for i in range(20):
            conn.execute(f"INSERT INTO {table} (id, v) VALUES (%s, 1)", (i,))
    wait_until_acknowledged(cluster, pipeline.slot)
    assert end_offsets(kafka, topic, [0])[0] > keep + 20, "worker 0 took some of the inserts"
    group.stop()
    lose_tail(kafka, topic, 0, keep)
    with pytest.raises(GpcdcError, match="Kafka lost events it had acknowledged"):
        group.start()
    state = (group.status(0) or {}).get("state", "")
    assert f"{topic} partition 0 ends before offset" in state and "bootstrap the pipeline again" in state, state
