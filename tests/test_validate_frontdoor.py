"""Validation of targets reached through a front door, on real servers: a plain
PostgreSQL server read in one snapshot, and a Citus cluster read per shard placement on
its workers, with placement checked against Citus's shard ranges."""

import random
import threading
import uuid

import psycopg
import pytest
from psycopg import sql

from gpcdc_toolkit._expect import Suite
from gpcdc_toolkit.bootstrap import bootstrap
from gpcdc_toolkit.cluster import COORDINATOR, CitusCluster, Session
from gpcdc_toolkit.errors import ConfigError
from gpcdc_toolkit.replay import Replayer
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.validate import validate
from gpcdc_toolkit.validate._checksum import compare_checksums
from gpcdc_toolkit.validate._expectations import TargetSuites
from gpcdc_toolkit.validate._snapshots import Snapshots

from .test_cli import gpcdc

TABLE = ("public", "Door Items")
COLUMNS = '("Id" bigint PRIMARY KEY, "select" text, amount numeric(20,4), ratio float8, doc jsonb) DISTRIBUTED BY ("Id")'
KEYLESS = ("public", "door log")
DOORS = ["postgres", pytest.param("citus", marks=pytest.mark.citus)]


def _create(cluster, rows, log):
    with cluster.session() as session:
        session.ddl('DROP TABLE IF EXISTS "Door Items"')
        session.ddl('DROP TABLE IF EXISTS "door log"')
        session.ddl(f'CREATE TABLE "Door Items" {COLUMNS}')
        session.ddl('CREATE TABLE "door log" (event text, n int) DISTRIBUTED BY (event)')
        with session.transaction() as tx:
            tx.insert(TABLE, rows)
            tx.insert(KEYLESS, log)


@pytest.fixture(scope="module", params=DOORS)
def door(request, source, work_dir):
    """(source, front-door target): both with the same two tables, equal."""
    box = Sandbox(f"door-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2, flavour=request.param)
    target = box.cluster()
    rng = random.Random(7)
    rows = [{"Id": i, "select": rng.choice(["", None, "x", "it's", 'say "hi"']),
             "amount": f"{rng.randint(-10**6, 10**6)}.{rng.randint(0, 9999):04d}", "ratio": rng.random(),
             "doc": '{"a": [1, 2], "b": null}'} for i in range(2000)]
    log = [{"event": f"e{i % 40}", "n": i % 5} for i in range(400)]  # twins on purpose
    for cluster in (source, target):
        _create(cluster, rows, log)
    try:
        yield source, target
    finally:
        with Session(source) as session:
            session.ddl('DROP TABLE IF EXISTS "Door Items"')
            session.ddl('DROP TABLE IF EXISTS "door log"')
        box.down(remove=True)


def at_the_door(target, statement, params=()):
    with target.coordinator_connection() as conn:
        return conn.execute(sql.SQL(statement).format(sql.Identifier(*TABLE)), params).rowcount


def apply(target, result):
    """The fix, each section on the node it names (the door, or a Citus worker)."""
    for content, statements in result.fix.items():
        node = target.coordinator if content == COORDINATOR else target.segments[content]
        with target.connect_node(node) as conn, conn.transaction():
            for statement in statements:
                conn.execute(statement)


def test_a_front_door_target_is_read_where_its_rows_are_stored(door):
    source, target = door
    kind = "citus" if isinstance(target, CitusCluster) else "postgres"
    assert target.kind == kind
    # Plain PostgreSQL stores every row itself; Citus on its 2 workers, in shards (its
    # coordinator, group 0, is a store of its own only where it holds placements).
    assert len(target.segments) == (2 if kind == "citus" else 1)
    assert target.describe().endswith(", 2 workers") == (kind == "citus")
    for table in (TABLE, KEYLESS):
        result = compare_checksums(source, target, table)
        assert result.equal, result.diff.line()
        assert (result.rounds, result.fetched, result.fix) == (1, 0, {})
    assert compare_checksums(source, target, TABLE).diff.expected == 2000
    if kind == "citus":
        with Snapshots(target) as side:
            counts = [conn.execute(sql.SQL("SELECT count(*) FROM {} t").format(
                target.relation(node, target.table(TABLE)))).fetchone()[0] for node, conn in side.segments()]
        assert sum(counts) == 2000 and all(counts), counts  # each worker some, none all


def test_each_divergence_is_found_exactly_and_the_fix_at_the_door_makes_the_tables_equal(door, tmp_path, compare):
    source, target = door
    at_the_door(target, 'DELETE FROM {} WHERE "Id" = 5')
    at_the_door(target, 'UPDATE {} SET amount = amount + 0.0001 WHERE "Id" = 6')
    at_the_door(target, "UPDATE {} SET \"select\" = CASE WHEN \"select\" IS NULL THEN '' ELSE NULL END "
                        'WHERE "Id" = 7')
    at_the_door(target, 'UPDATE {} SET ratio = ratio * (1 + 1e-15) WHERE "Id" = 8')
    at_the_door(target, "INSERT INTO {} (\"Id\", \"select\") VALUES (1000000, 'extra')")
    result = compare(source, target, TABLE, fetch_rows=50)
    diff = result.diff
    assert (diff.missing, diff.extra, diff.changed, diff.misplaced) == (1, 1, 3, 0), diff.examples
    assert diff.expected == 2000 and diff.actual == 2000
    assert set(result.fix) == {COORDINATOR}, "every fix statement goes through the door"
    result.write_fix(tmp_path / "fix.sql", target)
    door_name = "server" if target.kind == "postgres" else "coordinator"  # a plain server is no coordinator
    assert f"-- node: {door_name} ({target.coordinator.host}:{target.coordinator.port})" in (tmp_path / "fix.sql").read_text()
    apply(target, result)
    again = compare(source, target, TABLE)
    assert again.equal, again.diff.examples


def _hashes(cluster):
    """Each row's key and its unsigned row hash as a comparison with a front door
    computes it (``record``: the form both sides have), wherever the row is stored."""
    from gpcdc_toolkit.validate._checksum import _row_hash

    info = cluster.table(TABLE)
    hashes = {}
    with Snapshots(cluster) as side:
        for node, conn in side.segments():
            query = sql.SQL('SELECT "Id", {} FROM {} t').format(_row_hash(info, "record"), side.relation(node, info))
            hashes.update((key, h % 2**64) for key, h in conn.execute(query))
    return hashes


def test_a_chunk_one_row_apart_is_settled_by_its_key_at_the_door(door):
    """Grouped by prefix (a front door has no one-pass aggregate), the first level's
    digests carry the XOR of the keys (a key named with a capital) all the same."""
    source, target = door
    hashes = _hashes(source)
    by_chunk = {}
    for key, h in sorted(hashes.items()):
        by_chunk.setdefault(h >> 48, []).append(key)
    crowded = next(keys[:2] for keys in by_chunk.values() if len(keys) >= 2 and not {11, 12} & set(keys))
    for key in (11, *crowded):
        at_the_door(target, 'UPDATE {} SET "select" = \'changed \' || "Id" WHERE "Id" = %s', (key,))
    at_the_door(target, 'DELETE FROM {} WHERE "Id" = 12')
    at_the_door(target, "INSERT INTO {} (\"Id\", \"select\") VALUES (1000001, 'extra')")
    after = _hashes(target)
    versions = [h >> 48 for side in (hashes, after) for key, h in side.items() if hashes.get(key) != after.get(key)]
    lone = {chunk for chunk in versions if versions.count(chunk) == 1}
    result = compare_checksums(source, target, TABLE, fetch_rows=50)
    diff = result.diff
    assert (diff.missing, diff.extra, diff.changed) == (1, 1, 3), diff.examples
    assert {row.key for row in diff.rows} == {("11",), ("12",), ("1000001",), *((str(k),) for k in crowded)}
    assert lone and result.settled == len(lone) and hashes[crowded[0]] >> 48 not in lone and result.chunks >= 1
    apply(target, result)
    assert compare_checksums(source, target, TABLE).equal


def test_a_table_without_a_key_compares_as_a_multiset_at_the_door(door, compare):
    source, target = door
    with target.coordinator_connection() as conn:
        conn.execute("DELETE FROM \"door log\" WHERE event = 'e1' AND ctid IN "
                     "(SELECT ctid FROM \"door log\" WHERE event = 'e1' LIMIT 1)")
        conn.execute("INSERT INTO \"door log\" VALUES ('e2', 2), ('e3', 3)")
    result = compare(source, target, KEYLESS)
    assert (result.diff.missing, result.diff.extra, result.diff.expected) == (1, 2, 400), result.diff.examples
    apply(target, result)
    assert compare(source, target, KEYLESS).equal


@pytest.mark.parametrize("door", ["postgres"], indirect=True)
def test_an_extra_copy_in_one_partition_is_deleted_there_and_no_row_of_another_partition(door, compare):
    """A ctid names a row in each partition: the fix's delete names the partition too.
    Both partitions' first rows sit at ctid (0,1), and the row copied is the first of
    its partition, in the same region as the other's first."""
    source, target = door
    table = ("public", "Parted Log")
    rows = [(region, n) for region in ("a", "b") for n in range(3)]
    with source.session() as session:
        session.ddl('CREATE TABLE "Parted Log" (region text, n int) DISTRIBUTED BY (region)')
        with session.transaction() as tx:
            tx.insert(table, [{"region": r, "n": n} for r, n in rows])
    with target.coordinator_connection() as conn:
        conn.execute('CREATE TABLE "Parted Log" (region text, n int) PARTITION BY LIST (n)')
        conn.execute('CREATE TABLE "Parted Log 0" PARTITION OF "Parted Log" FOR VALUES IN (0)')
        conn.execute('CREATE TABLE "Parted Log 1" PARTITION OF "Parted Log" FOR VALUES IN (1, 2)')
        with conn.cursor() as cursor:
            cursor.executemany('INSERT INTO "Parted Log" VALUES (%s, %s)', [*rows, ("a", 1)])
    try:
        result = compare(source, target, table)
        assert (result.diff.missing, result.diff.extra, result.diff.expected) == (0, 1, 6), result.diff.examples
        apply(target, result)
        again = compare(source, target, table)
        assert again.equal and again.diff.actual == 6, again.diff.line()
    finally:
        for cluster in (source, target):
            with cluster.session() as session:
                session.ddl('DROP TABLE IF EXISTS "Parted Log"')


def test_target_suites_are_computed_by_each_store_inside_the_snapshot(door):
    source, target = door
    stores = len(target.segments)
    info = target.table(TABLE)
    with target.coordinator_connection() as conn:  # the door: every row, as the source has them
        (outside,) = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE \"select\" NOT IN ('', 'x')").format(
            sql.Identifier(*TABLE))).fetchone()
    values = Suite("door values", "target", False, {"name": "door values", "expectations": [
        {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "select", "value_set": ["", "x"]}},
        {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "amount", "regex": "^-?[0-9]+[.][0-9]{4}$"}}]},
        info.name)
    mostly = Suite("door mostly", "target", False, {"name": "door mostly", "expectations": [
        {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "select", "value_set": ["", "x"],
                                                                 "mostly": 0.5}}]}, info.name)
    with Snapshots(target) as side:
        side.pin()
        at_the_door(target, "INSERT INTO {} (\"Id\", \"select\") SELECT g, 'late' FROM generate_series(3000000, 3000099) g")
        try:
            outcomes = TargetSuites(target, [info], [values, mostly], placement_checked=True).check(side, [(info, 2000, 2000)])
        finally:
            at_the_door(target, 'DELETE FROM {} WHERE "Id" >= 3000000')
    by_name = {(o.suite, o.expectation): o for o in outcomes}
    count = by_name[(f"target {info.name}", "expect_table_row_count_to_equal()")]
    assert count.success and count.evidence == "observed 2000", count  # as the comparison counted
    unique = by_name[(f"target {info.name}", "expect_column_values_to_be_unique(Id)")]
    # A plain server keeps its key by its index, and a Citus worker by its shards' own.
    assert unique.success and unique.evidence == (f"enforced on each of {stores} store{'s' if stores > 1 else ''} "
                                                  'by its unique index ("Door Items_pkey") on NOT NULL columns'), unique
    in_set = by_name[("door values", "expect_column_values_to_be_in_set(select)")]
    regex = by_name[("door values", "expect_column_values_to_match_regex(amount)")]
    most = by_name[("door mostly", "expect_column_values_to_be_in_set(select)")]
    # The 100 rows committed after the snapshot are not seen: 2000 values, not 2100.
    assert not in_set.success and in_set.evidence.startswith(f"{outside} of 2000 values unexpected, e.g. ["), in_set
    assert regex.success and regex.evidence.startswith("0 of 2000 values unexpected"), regex
    # Among the values not missing, as great-expectations counts for "mostly".
    with target.coordinator_connection() as conn:
        (present,) = conn.execute(sql.SQL('SELECT count("select") FROM {}').format(sql.Identifier(*TABLE))).fetchone()
    assert most.success == (present - outside >= 0.5 * present), (most, present, outside)

    whole = Suite("door mean", "target", False, {"name": "door mean", "expectations": [
        {"type": "expect_column_unique_value_count_to_be_between", "kwargs": {"column": "select", "min_value": 1}}]},
        info.name)
    if stores == 1:  # one store holds the whole table: any expectation runs there
        with Snapshots(target) as side:
            assert TargetSuites(target, [info], [whole], placement_checked=True).check(side, [(info, 2000, 2000)])[-1].success
    else:  # refused before any snapshot is taken
        with pytest.raises(ConfigError, match=r'needs all of public\."Door Items" in one place'):
            TargetSuites(target, [info], [whole], placement_checked=True)


@pytest.mark.parametrize("door", ["postgres"], indirect=True)
def test_without_placement_checked_no_index_stands_for_the_key(door):
    _, target = door
    info = target.table(TABLE)
    with Snapshots(target) as side:
        side.pin()
        outcomes = TargetSuites(target, [info], [], placement_checked=False).check(side, [(info, 2000, 2000)])
    found = {o.expectation: o for o in outcomes}
    assert found["expect_column_values_to_be_unique(Id)"].evidence == "0 of 2000 values unexpected", found


@pytest.mark.parametrize("door", [pytest.param("citus", marks=pytest.mark.citus)], indirect=True)
def test_a_shard_without_its_key_index_has_its_key_counted(door):
    _, target = door
    info = target.table(TABLE)
    content, shard, _low, _high = target._placements(info)[0]
    with target.connect_node(target.segments[content]) as conn:
        (index,) = conn.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'",
                                (shard.text,)).fetchone()
        conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(shard, sql.Identifier(index)))
    try:
        with Snapshots(target) as side:
            side.pin()
            outcomes = TargetSuites(target, [info], [], placement_checked=True).check(side, [(info, 2000, 2000)])
    finally:
        with target.connect_node(target.segments[content]) as conn:
            conn.execute(sql.SQL('ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY ("Id")').format(shard, sql.Identifier(index)))
    found = {o.expectation: o for o in outcomes}
    assert found["expect_column_values_to_be_unique(Id)"].evidence == "0 of 2000 values unexpected", found


@pytest.mark.parametrize("door", ["postgres"], indirect=True)
def test_target_suites_run_on_names_with_quotes_case_and_percent_signs(door):
    _, target = door
    with target.coordinator_connection() as conn:
        conn.execute('CREATE TABLE "We""ird %s T" ("Id" bigint PRIMARY KEY, "co""l %s" text, "COL" text, col text)')
        conn.execute('INSERT INTO "We""ird %%s T" VALUES (1, %s, %s, %s), (2, %s, NULL, %s)',
                     ['{"type": "pipeline"}', "x", "%s", "%%", "'"])
    try:
        info = target.table('"We""ird %s T"')
        suite = Suite("hostile", "target", False, {"name": "hostile", "expectations": [
            {"type": "expect_column_values_to_be_in_set",
             "kwargs": {"column": 'co"l %s', "value_set": ['{"type": "pipeline"}', "%%"]}},
            {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "COL"}},
            {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "col", "regex": "^(%s|')$"}}]},
            info.name)
        with Snapshots(target) as side:
            side.pin()
            outcomes = TargetSuites(target, [info], [suite], placement_checked=True).check(side, [(info, 2, 2)])
    finally:
        with target.coordinator_connection() as conn:
            conn.execute('DROP TABLE "We""ird %s T"')
    found = {o.expectation: (o.success, o.evidence) for o in outcomes}
    assert found["expect_table_row_count_to_equal()"] == (True, "observed 2")
    assert found['expect_column_values_to_be_in_set(co"l %s)'] == (True, "0 of 2 values unexpected")
    assert found["expect_column_values_to_not_be_null(COL)"][0] is False  # "COL", not col: one is NULL
    assert found["expect_column_values_to_match_regex(col)"] == (True, "0 of 2 values unexpected")


def _moved_to_another_shard(target, key, select=None):
    """The row of ``key`` taken out of its Citus shard and put into a shard on the other
    worker (with ``select`` its new value there, if given): that worker's content."""
    info = target.table(TABLE)
    placements = target._placements(info)
    with target.coordinator_connection() as conn:
        shard = conn.execute("SELECT shardid FROM pg_dist_shard WHERE logicalrelid = %s::regclass AND "
                             "worker_hash(%s::bigint) BETWEEN shardminvalue::int AND shardmaxvalue::int",
                             (info.name, key)).fetchone()[0]
    home = next(p for p in placements if p[1].as_string(None).endswith(f'_{shard}"'))
    wrong = next(p for p in placements if p[0] != home[0])
    with target.connect_node(target.segments[home[0]]) as conn:
        row = conn.execute(sql.SQL('DELETE FROM {} WHERE "Id" = %s RETURNING *').format(home[1]), (key,)).fetchone()
    with target.connect_node(target.segments[wrong[0]]) as conn:
        conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s)").format(wrong[1]),
                     [row[0], row[1] if select is None else select, *row[2:4], psycopg.types.json.Jsonb(row[4])])
    return wrong[0]


@pytest.mark.parametrize("door", [pytest.param("citus", marks=pytest.mark.citus)], indirect=True)
def test_a_row_in_a_shard_its_hash_does_not_name_is_found_by_the_worker_and_moved(door, compare):
    source, target = door
    wrong = _moved_to_another_shard(target, 11)
    result = compare(source, target, TABLE)
    assert (result.diff.missing, result.diff.extra, result.diff.changed, result.diff.misplaced) == (0, 0, 0, 1)
    assert any("which its distribution key does not name" in e for e in result.diff.examples)
    assert set(result.fix) == {wrong, COORDINATOR}  # deleted on that worker, inserted at the door
    apply(target, result)
    assert compare(source, target, TABLE).equal


@pytest.mark.parametrize("door", [pytest.param("citus", marks=pytest.mark.citus)], indirect=True)
def test_a_changed_row_in_a_shard_its_hash_does_not_name_is_counted_once_and_its_fix_leaves_no_stray(door, compare):
    """The worker deletes it from the wrong shard; the source's version goes in at the door."""
    source, target = door
    _moved_to_another_shard(target, 13, select="moved and changed")
    result = compare(source, target, TABLE)
    assert (result.diff.missing, result.diff.extra, result.diff.changed, result.diff.misplaced) == (0, 0, 1, 0)
    apply(target, result)
    assert compare(source, target, TABLE).equal


@pytest.mark.parametrize("door", [pytest.param("citus", marks=pytest.mark.citus)], indirect=True)
def test_a_keyless_row_copied_into_a_shard_its_hash_does_not_name_is_one_extra_row_deleted_there(door, compare):
    """The copy in the wrong shard is the extra one: deleted by its worker, and the door's
    own delete (which reaches the row's home shard) is not also sent."""
    source, target = door
    info = target.table(KEYLESS)
    with target.coordinator_connection() as conn:
        home = conn.execute("SELECT get_shard_id_for_distribution_column(%s, 'e5')", (info.name,)).fetchone()[0]
    wrong = next(p for p in target._placements(info) if not p[1].as_string(None).endswith(f'_{home}"'))
    with target.connect_node(target.segments[wrong[0]]) as conn:
        conn.execute(sql.SQL("INSERT INTO {} VALUES ('e5', 0)").format(wrong[1]))
    result = compare(source, target, KEYLESS)
    diff = result.diff
    assert (diff.missing, diff.extra, diff.misplaced) == (0, 1, 0), diff.examples
    assert [(row.kind, row.target_segment) for row in diff.rows] == [("extra", wrong[0])]
    assert set(result.fix) == {wrong[0]}  # by the worker, in that shard
    apply(target, result)
    again = compare(source, target, KEYLESS)
    assert again.equal and again.diff.actual == 400, again.diff.line()


@pytest.mark.parametrize("replay_target", ["postgres", pytest.param("citus", marks=pytest.mark.citus)],
                         indirect=True)
def test_a_sync_point_taken_while_writers_run_verifies_a_front_door_target(source, replay_target, work_dir):
    """The replayer pauses at the sync point at any target's door; the target read there
    equals the source's cut; a row changed at the door afterwards is found, exit 1."""
    box, config, pipeline, group = replay_target
    table = f"sp door {uuid.uuid4().hex[:4]}"
    with Session(source) as session:
        session.ddl(f'CREATE TABLE "{table}" (id int PRIMARY KEY, n bigint) DISTRIBUTED BY (id)')
        with session.transaction() as tx:
            tx.insert(("public", table), [{"id": i, "n": 0} for i in [*range(30), *range(100, 110)]])
    bootstrap(source, pipeline, "snapshot")
    group.start()
    target = box.cluster()
    stop, failures, commits = threading.Event(), [], [0]

    def write():
        rng = random.Random(3)
        with Session(source) as session:
            while not stop.is_set():
                with session.transaction() as tx:  # one- and two-phase, on the same keys
                    for key in sorted(rng.sample(range(30), rng.choice((1, 2, 3)))):
                        tx.update(("public", table), {"id": key}, {"n": rng.randint(0, 10**9)})
                commits[0] += 1

    def replay():
        with Replayer(config) as replayer:
            replayer.run(follow=True, should_stop=stop.is_set)

    def guarded(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            failures.append(e)

    threads = [threading.Thread(target=guarded, args=(fn,)) for fn in (write, replay)]
    for t in threads:
        t.start()
    settings = config.with_settings({"validate.expectations": False})
    try:
        runs = [validate(settings, tables=[("public", table)], source=source, target=target) for _ in range(2)]
        for run in runs:
            assert run.equal and run.verified, run.lines()
            assert run.syncpoint["replay_hold_ms"] is not None and run.results[0].diff.expected == 40
        assert runs[1].syncpoint["syncpoint"] > runs[0].syncpoint["syncpoint"]
        with target.coordinator_connection() as conn:  # a key the writers leave alone
            conn.execute(sql.SQL("UPDATE {} SET n = -1 WHERE id = 104").format(sql.Identifier("public", table)))
        cli = gpcdc(work_dir, "--source-sandbox", "source", "--target-sandbox", box.name,
                    "--kafka-bootstrap-servers", config.kafka.bootstrap_servers,
                    "--kafka-topic-prefix", config.kafka.topic_prefix, "validate", "--tables", f'"{table}"',
                    "--no-validate-expectations")
        assert cli.returncode == 1, (cli.stdout, cli.stderr)
        assert "1 changed" in cli.stdout, cli.stdout
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not failures, failures
    assert commits[0] > 0


@pytest.mark.citus
def test_a_fix_at_a_citus_door_finds_rows_by_their_text_as_read_whatever_the_workers_print(source, work_dir):
    """The workers run in another time zone and print floats otherwise: the fix's
    settings, given at the door, must hold on the workers too, where a copy's text is
    matched (Citus sends no SET LOCAL on by default)."""
    table = f'"tz log {uuid.uuid4().hex[:6]}"'
    rows = [{"k": k % 3, "at": f"2026-01-0{1 + k % 2} 12:00:00+00", "f": 0.1 * k} for k in range(9)]
    box = Sandbox(f"tz-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2, flavour="citus")
    try:
        for node in box.nodes[1:]:
            with psycopg.connect(node.dsn, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET TimeZone = 'Asia/Tokyo'")
                conn.execute("ALTER SYSTEM SET extra_float_digits = -3")
                conn.execute("SELECT pg_reload_conf()")
        target = box.cluster()
        for cluster in (source, target):
            with cluster.session() as session:
                session.ddl(f"CREATE TABLE {table} (k int, at timestamptz, f float8) DISTRIBUTED BY (k)")
                with session.transaction() as tx:
                    tx.insert(table, rows)
        with target.coordinator_connection() as conn:  # a twin of a row: one copy extra
            conn.execute(f"INSERT INTO {table} SELECT * FROM {table} WHERE k = 1 AND f > 0.35 AND f < 0.45")
        result = compare_checksums(source, target, table)
        assert (result.diff.extra, result.diff.missing, result.diff.changed) == (1, 0, 0), result.diff.examples
        apply(target, result)
        again = compare_checksums(source, target, table)
        assert again.equal and again.diff.actual == len(rows), again.diff.line()
    finally:
        with Session(source) as session:
            session.ddl(f"DROP TABLE IF EXISTS {table}")
        box.down(remove=True)
