"""Validation at sync points on real servers: source, broker, capture, a replayer
following the stream, and writers that keep committing one- and two-phase
transactions on the same keys while the sync points are cut."""

import json
import os
import random
import subprocess
import sys
import threading
import traceback

import psycopg
import pytest

from gpcdc_toolkit.bootstrap import bootstrap
from gpcdc_toolkit.cluster import Session, resolve_in_doubt, segment_for
from gpcdc_toolkit.replay import Replayer
from gpcdc_toolkit.validate import SyncPointError, take_syncpoint, validate
from gpcdc_toolkit.validate._syncpoint import held_file

from ._spark import nothing_cached
from .test_cli import gpcdc

HOT = ("public", "sp hot")
STATIC = ("public", "sp Static")


def _tables(source):
    with Session(source) as session:
        session.ddl('DROP TABLE IF EXISTS "sp hot"')
        session.ddl('DROP TABLE IF EXISTS "sp Static"')
        session.ddl('CREATE TABLE "sp hot" (id int PRIMARY KEY, n bigint, note text) DISTRIBUTED BY (id)')
        session.ddl('CREATE TABLE "sp Static" (id int PRIMARY KEY, "select" text, x float8) DISTRIBUTED BY (id)')
        with session.transaction() as tx:
            tx.insert(HOT, [{"id": i, "n": 0, "note": ""} for i in range(24)])
            tx.insert(STATIC, [{"id": i, "select": ["", None, "a'b"][i % 3], "x": i / 7} for i in range(300)])


def _writer(source, seed, stop, counts):
    """Update 1 to 3 hot keys per transaction (one-phase when they share a segment), in
    key order: segments detect no deadlock that spans two of them."""
    rng = random.Random(seed)
    with Session(source) as session:
        while not stop.is_set():
            with session.transaction() as tx:
                for key in sorted(rng.sample(range(24), rng.choice((1, 1, 2, 3)))):
                    tx.update(HOT, {"id": key}, {"n": rng.randint(0, 10**9), "note": f"w{seed}"})
            counts[seed] += 1


def _flags(config, target_box):
    return ["--source-sandbox", "source", "--target-sandbox", target_box.name,
            "--kafka-bootstrap-servers", config.kafka.bootstrap_servers, "--kafka-topic-prefix", config.kafka.topic_prefix]


def _validate_at_a_held_syncpoint(config, work_dir, target_box, source, target, spark):
    """`gpcdc syncpoint --hold` in a process of its own; a validation reads at its sync
    point; once it is stopped, the sync point can no longer be read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPCDC_")}
    holder = subprocess.Popen([sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(work_dir),
                               *_flags(config, target_box), "syncpoint", "--hold", "300"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              stdin=subprocess.DEVNULL)
    try:
        taken, recorded, readable = (holder.stdout.readline() for _ in range(3))  # each printed when done
        assert taken.startswith("sync point ") and "readable for 300 s" in readable, (taken, readable)
        assert "tables digested as of the cut" in recorded, recorded
        gxid = int(taken.split()[2].rstrip(":"))
        path = held_file(work_dir, config.kafka.topic_prefix, gxid)
        assert path.is_file()
        run = validate(config, tables=[HOT, STATIC], syncpoint=gxid, source=source, target=target, spark=spark)
        assert run.syncpoint["syncpoint"] == gxid
    finally:
        holder.terminate()  # by its process id
        holder.wait(60)
    assert holder.returncode == 0, holder.stderr.read()
    assert not path.exists()
    gone = gpcdc(work_dir, *_flags(config, target_box), "validate", "--at-syncpoint", str(gxid))
    assert gone.returncode == 2
    (line,) = gone.stderr.splitlines()
    assert f"sync point {gxid} is not held" in line and "gpcdc syncpoint --hold" in line
    return run


def _stacks(threads):
    frames = sys._current_frames()
    return "".join(f"{t.name}:\n" + "".join(traceback.format_stack(frames[t.ident]))
                   for t in threads if t.is_alive() and t.ident in frames)


def test_sync_points_while_writers_run_then_divergences_found_exactly_and_fixed(source, replay_target, work_dir,
                                                                                 spark):
    target_box, config, pipeline, group = replay_target
    _tables(source)
    bootstrap(source, pipeline, "snapshot")
    group.start()
    target = target_box.cluster()
    stop_writers, stop_replay = threading.Event(), threading.Event()
    counts = {1: 0, 2: 0}
    failures = []

    def guarded(fn, *args):
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            failures.append(e)

    def replay():
        with Replayer(config) as replayer:
            replayer.run(follow=True, should_stop=stop_replay.is_set)

    threads = [threading.Thread(target=guarded, args=(_writer, source, s, stop_writers, counts)) for s in counts]
    threads.append(threading.Thread(target=guarded, args=(replay,)))
    for t in threads:
        t.start()
    try:
        first = validate(config, tables=[HOT, STATIC], source=source, target=target)
        second = validate(config, tables=[HOT, STATIC], source=source, target=target)
        held = _validate_at_a_held_syncpoint(config, work_dir, target_box, source, target, spark)
        spark.catalog.clearCache()
        by_spark = validate(config.with_settings({"validate.mode": "spark"}), tables=[HOT, STATIC], source=source,
                            target=target, spark=spark)
        assert by_spark.mode == "spark" and nothing_cached(spark)
        for run in (first, second, held, by_spark):
            assert run.equal and run.verified, run.lines()
            # Per table: its row count as the source's, its key unique and not null.
            assert len(run.expectations) == 6 and all(o.success for o in run.expectations), run.expectations
            assert [r.table for r in run.results] == ['public."sp hot"', 'public."sp Static"']
            assert run.syncpoint["stall_ms"] > 0 and run.syncpoint["replay_hold_ms"] is not None
            assert {r.diff.expected for r in run.results if r.table.endswith('"sp hot"')} == {24}
            summary = json.loads((run.output / "summary.json").read_text())
            assert summary["equal"] and summary["syncpoint"]["syncpoint"] == run.syncpoint["syncpoint"]
            assert not (run.output / "fix.sql").exists()
        assert by_spark.syncpoint["syncpoint"] > second.syncpoint["syncpoint"] > first.syncpoint["syncpoint"]

        # Divergences on the target, in rows the writers leave alone.
        on = {k: target.segments[segment_for([k], target.segment_count)] for k in (4, 5, 6)}
        with target.connect_node(on[5]) as conn:
            conn.execute('DELETE FROM "sp Static" WHERE id = 5')
        with target.connect_node(on[4]) as conn:
            conn.execute('UPDATE "sp Static" SET "select" = %s WHERE id = 4', [""])  # NULL on the source
        with target.connect_node(on[6]) as conn:
            conn.execute('UPDATE "sp Static" SET x = x + 1e-12 WHERE id = 6')
        suites = work_dir / f"suites-{config.kafka.topic_prefix}"
        suites.mkdir()
        (suites / "static.json").write_text(json.dumps({
            "name": "static select", "meta": {"gpcdc": {"frame": "target", "table": 'public."sp Static"'}},
            "expectations": [{"type": "expect_column_values_to_be_in_set",
                              "kwargs": {"column": "select", "value_set": ["a'b"]}}]}))
        cli = gpcdc(work_dir, *_flags(config, target_box), "validate", "--tables", '"sp Static"',
                    "--validate-expectations-dir", str(suites))
        assert cli.returncode == 1, cli.stderr
        assert 'public."sp Static": 299 rows where 300 were expected; 1 missing, 2 changed' in cli.stdout, cli.stdout
        assert not cli.stderr  # nothing but the summary, on stdout
        assert "great-expectations: 4 expectations on the target, 2 failed" in cli.stdout, cli.stdout
        assert "expect_table_row_count_to_equal(): observed 299" in cli.stdout
        assert "static select: expect_column_values_to_be_in_set(select): 101 of 299 values unexpected" in cli.stdout
        # An expectation the target's two segments cannot compute apart: refused before any cut.
        (suites / "mean.json").write_text(json.dumps({
            "name": "static mean", "meta": {"gpcdc": {"frame": "target", "table": 'public."sp Static"'}},
            "expectations": [{"type": "expect_column_mean_to_be_between", "kwargs": {"column": "x", "min_value": 0}}]}))
        refused = gpcdc(work_dir, *_flags(config, target_box), "validate", "--tables", '"sp Static"',
                        "--validate-expectations-dir", str(suites))
        assert refused.returncode == 2 and not refused.stdout, refused
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert 'static mean: expect_column_mean_to_be_between(x) needs all of public."sp Static"' in refused.stderr
        (suites / "mean.json").unlink()
        fix = next(line for line in cli.stdout.splitlines() if line.startswith("results in ")).split(" ", 2)[2]
        script = (work_dir / fix / "fix.sql").read_text()
        assert script.count("INSERT INTO") == 1 and script.count("UPDATE") == 2
        found = validate(config, tables=[STATIC], source=source, target=target)
        (result,) = found.results
        assert (result.diff.missing, result.diff.extra, result.diff.changed) == (1, 0, 2)
        for content, statements in result.fix.items():
            with target.connect_node(target.segments[content]) as conn, conn.transaction():
                for statement in statements:
                    conn.execute(statement)
        assert validate(config, tables=[HOT, STATIC], source=source, target=target).equal
    finally:
        stop_writers.set()
        stop_replay.set()
        for t in threads:
            t.join(60)
    assert not [t for t in threads if t.is_alive()], _stacks(threads)
    assert not failures, failures
    assert all(counts.values())


def test_without_a_replayer_a_sync_point_gives_up_in_one_line_and_leaves_no_lock(source, replay_target, work_dir):
    target_box, config, pipeline, group = replay_target
    _tables(source)
    run = gpcdc(work_dir, *_flags(config, target_box), "validate", "--validate-replay-timeout", "0.5")
    assert run.returncode == 2
    (line,) = run.stderr.splitlines()
    assert line.startswith("gpcdc: validate could not run: the replayer did not reach sync point ")
    assert "run `gpcdc replay` (it follows" in line and "validate.replay_timeout" in line
    target = target_box.cluster()
    with target.coordinator_connection() as conn:
        assert conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()[0] == 0
    # The source's commit lock is free again: a distributed transaction commits.
    with Session(source) as session, session.transaction() as tx:
        tx.update(HOT, {"id": 1}, {"n": 1})
    with take_syncpoint(source) as point:
        assert point.stall_ms > 0 and set(point.lsns) == {-1, *range(source.segment_count)}


def test_a_held_sync_point_keeps_its_tables_from_being_truncated(source):
    """A snapshot does not survive TRUNCATE: the tables read at a sync point are locked."""
    _tables(source)
    with take_syncpoint(source, tables=[source.table(STATIC)]) as point:
        assert point.stall_ms > 0
        node = source.segments[0]
        with source.connect_node(node) as conn:
            conn.execute("SET lock_timeout = '200ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                conn.execute('TRUNCATE "sp Static"')
    with source.connect_node(source.segments[0]) as conn, conn.transaction():
        conn.execute("SET LOCAL lock_timeout = '10s'")
        conn.execute('LOCK TABLE "sp Static" IN ACCESS EXCLUSIVE MODE')  # granted once the sync point is closed


def test_a_sync_point_that_fails_midway_leaves_nothing_prepared(source, monkeypatch):
    from gpcdc_toolkit.cluster import _dtx
    from gpcdc_toolkit.protocol import _markers as markers

    _tables(source)
    real = markers.encode

    def failing(marker):
        if isinstance(marker, markers.CommitRecord):
            raise RuntimeError("the coordinator went away")
        return real(marker)

    monkeypatch.setattr(_dtx.markers, "encode", failing)
    with pytest.raises(RuntimeError, match="went away"):
        take_syncpoint(source, tables=[source.table(STATIC)])
    monkeypatch.undo()
    assert not [p for p in source.prepared_transactions() if p[1].startswith("gpcdc_")]
    with Session(source) as session, session.transaction() as tx:  # the commit lock is free
        tx.update(HOT, {"id": 2}, {"n": 2})


def test_no_sync_point_is_taken_while_a_committed_transaction_is_still_prepared(source):
    _tables(source)
    gxid = 2_000_000_000 + random.randrange(10**6)  # not running, and no other transaction's
    with source.connect_node(source.segments[1]) as conn:
        conn.execute("BEGIN")
        conn.execute("SELECT pg_logical_emit_message(true, 'gpcdc.gxid', %s)", (str(gxid),))
        conn.execute(f"PREPARE TRANSACTION 'gpcdc_{gxid}'")
    with source.coordinator_connection() as conn:
        conn.execute("INSERT INTO gp_dist.committed_gxids VALUES (%s)", (gxid,))
    try:
        with pytest.raises(SyncPointError, match=rf"distributed transactions \[{gxid}\] are committed but still "
                                                 r"prepared on a segment \(in doubt\)"):
            take_syncpoint(source, tables=[source.table(STATIC)])
    finally:
        committed, _ = resolve_in_doubt(source)
    assert committed == [f"gpcdc_{gxid} on segment 1"]
    with take_syncpoint(source, tables=[source.table(STATIC)]) as point:
        assert point.gxid > 0
