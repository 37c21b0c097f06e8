"""Checksum validation of a target against its source, on real sandboxes: equal tables
are equal, every injected divergence is found exactly, and the fix statements make the
next comparison equal."""

import random
import threading
import uuid
from contextlib import closing, contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from gpcdc_toolkit.cluster import Session, segment_for
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.validate._checksum import ROW_HASHES, ValidationError, compare_checksums

TABLE = ("public", "Order Items")
COLUMNS = '("id" bigint PRIMARY KEY, "select" text, "amount" numeric(20,4), "ratio" float8, "tags" int[], ' \
          '"doc" jsonb, "raw" bytea) DISTRIBUTED BY ("id")'
KEYLESS = ("public", "keyless log")
PLACED = ("public", 'Placed "Rows"')  # made by the placement test
ITEM_COLUMNS = 'id, "select", amount::text, ratio::text, tags::text, doc::text, raw'  # a row of "Order Items" as text
ITEM_VALUES = "%s, %s, %s::numeric, %s::float8, %s::int[], %s::jsonb, %s"  # and back


@pytest.fixture(scope="module")
def target_box(work_dir):
    box = Sandbox(f"vt-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2)
    try:
        yield box
    finally:
        box.down(remove=True)


@pytest.fixture(scope="module")
def clusters(source, target_box):
    """The source (3 segments) and a target with 2, each with the two tables, equal."""
    target = target_box.cluster()
    rng = random.Random(4)
    rows = [{"id": i, "select": rng.choice(["", None, "x", "it's", 'say "hi"', "ünï"]),
             "amount": f"{rng.randint(-10**6, 10**6)}.{rng.randint(0, 9999):04d}", "ratio": rng.random(),
             "tags": [rng.randint(0, 9), None], "doc": '{"a": [1, 2], "b": null}', "raw": bytes([0, i % 256])}
            for i in range(3000)]
    log = [{"event": f"e{i % 50}", "n": i % 7} for i in range(500)]  # duplicates on purpose
    for cluster in (source, target):
        with Session(cluster) as session:
            session.ddl('DROP TABLE IF EXISTS "Order Items"')
            session.ddl('DROP TABLE IF EXISTS "keyless log"')
            session.ddl(f'CREATE TABLE "Order Items" {COLUMNS}')
            session.ddl('CREATE TABLE "keyless log" ("event" text, "n" int) DISTRIBUTED BY ("event")')
            with session.transaction() as tx:
                tx.insert(TABLE, rows)
                tx.insert(KEYLESS, log)
    try:
        yield source, target
    finally:
        with Session(source) as session:
            session.ddl('DROP TABLE IF EXISTS "Order Items"')
            session.ddl('DROP TABLE IF EXISTS "keyless log"')
            session.ddl(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(*PLACED)).as_string(None))


@contextmanager
def on_both(clusters, table, columns, rows):
    """``table`` made on the source and the target (``columns``: its definition), with
    the same ``rows``; dropped from both after, whatever happened."""
    name = sql.Identifier(*table).as_string(None)
    for cluster in clusters:
        with Session(cluster) as session:
            session.ddl(f"CREATE TABLE {name} {columns}")
            with session.transaction() as tx:
                tx.insert(table, rows)
    try:
        yield
    finally:
        for cluster in clusters:
            with Session(cluster) as session:
                session.ddl(f"DROP TABLE IF EXISTS {name}")


@contextmanager
def restored(clusters, *keys):
    """Afterwards, whatever happened: the target's "Order Items" rows of ``keys`` as the
    source has them, each on its segment, and no other copy anywhere."""
    source, target = clusters
    try:
        yield
    finally:
        for segment in target.segments:
            with target.connect_node(segment) as conn:
                conn.execute('DELETE FROM "Order Items" WHERE id = ANY(%s)', (list(keys),))
        for key in keys:
            with source.connect_node(source.segments[segment_for([key], source.segment_count)]) as conn:
                row = conn.execute(f'SELECT {ITEM_COLUMNS} FROM "Order Items" WHERE id = %s', (key,)).fetchone()
            if row is not None:
                on_segment(target, TABLE, key, f"INSERT INTO {{}} VALUES ({ITEM_VALUES})", row)


def on_segment(cluster, table, key_value, statement, params=()):
    """Run a statement on the segment that holds the row with this distribution key."""
    node = cluster.segments[segment_for([key_value], cluster.segment_count)]
    with cluster.connect_node(node) as conn:
        return conn.execute(sql.SQL(statement).format(*[sql.Identifier(*table)] * statement.count("{}")),
                            params).rowcount


def apply(target, result):
    for content, statements in result.fix.items():
        with target.connect_node(target.segments[content]) as conn, conn.transaction():
            for statement in statements:
                conn.execute(statement)


def test_equal_tables_are_equal_in_one_round_with_no_row_fetched(clusters):
    source, target = clusters
    for table in (TABLE, KEYLESS):
        result = compare_checksums(source, target, table)
        assert result.equal, result.diff.line()
        assert (result.rounds, result.fetched, result.fix) == (1, 0, {})
    assert compare_checksums(source, target, TABLE).diff.expected == 3000


def test_each_divergence_is_found_exactly_and_the_fix_makes_the_tables_equal(clusters, tmp_path, compare):
    source, target = clusters
    on_segment(target, TABLE, 5, "DELETE FROM {} WHERE id = 5")
    on_segment(target, TABLE, 6, "UPDATE {} SET amount = amount + 0.0001 WHERE id = 6")
    on_segment(target, TABLE, 7, "UPDATE {} SET \"select\" = CASE WHEN \"select\" IS NULL THEN '' ELSE NULL END "
                                 "WHERE id = 7")
    on_segment(target, TABLE, 8, "UPDATE {} SET ratio = ratio * (1 + 1e-15) WHERE id = 8")
    on_segment(target, TABLE, 10**6, "INSERT INTO {} (id, \"select\") VALUES (1000000, 'extra')")
    # A row on a segment its distribution key does not name.
    home = segment_for([9], target.segment_count)
    with target.connect_node(target.segments[home]) as conn:
        row = conn.execute('DELETE FROM "Order Items" WHERE id = 9 RETURNING id, "select", amount::text, '
                           'ratio::text, tags::text, doc::text, raw').fetchone()
    with target.connect_node(target.segments[1 - home]) as conn:
        conn.execute('INSERT INTO "Order Items" VALUES (%s, %s, %s::numeric, %s::float8, %s::int[], %s::jsonb, %s)',
                     row)
    result = compare(source, target, TABLE, fetch_rows=50)
    diff = result.diff
    assert (diff.missing, diff.extra, diff.changed, diff.misplaced) == (1, 1, 3, 1), diff.examples
    # Only the differing rows' chunks left the databases: one per row missing or extra,
    # two per changed row (its source and its target version hash apart).
    assert result.fetched < 20 and result.chunks <= 8
    assert diff.expected == 3000 and diff.actual == 3000
    assert any("select" in e and "key ('7',)" in e for e in diff.examples)
    result.write_fix(tmp_path / "fix.sql", target)
    assert "-- node: segment" in (tmp_path / "fix.sql").read_text()
    apply(target, result)
    again = compare(source, target, TABLE)
    assert again.equal, again.diff.examples


def test_a_table_without_a_key_compares_as_a_multiset(clusters, compare):
    source, target = clusters
    on_segment(target, KEYLESS, "e1", "DELETE FROM {} WHERE ctid IN (SELECT ctid FROM {} WHERE event = 'e1' LIMIT 1)")
    on_segment(target, KEYLESS, "e2", "INSERT INTO {} VALUES ('e2', 2)")
    on_segment(target, KEYLESS, "e3", "INSERT INTO {} VALUES ('e3', 3)")  # a second copy of a row
    result = compare(source, target, KEYLESS)
    assert (result.diff.missing, result.diff.extra, result.diff.expected) == (1, 2, 500), result.diff.examples
    apply(target, result)
    assert compare(source, target, KEYLESS).equal


def test_tables_of_different_shape_are_refused_in_one_line(clusters):
    source, target = clusters
    with Session(target) as session:
        session.ddl('ALTER TABLE "keyless log" ADD COLUMN extra int DEFAULT 7')
    try:
        with pytest.raises(ValidationError, match="on the source and .* on the target: make the target's table match"):
            compare_checksums(source, target, KEYLESS)
    finally:
        with Session(target) as session:
            session.ddl('ALTER TABLE "keyless log" DROP COLUMN extra')


@pytest.mark.parametrize("form", ROW_HASHES)
def test_each_level_of_chunks_splits_the_one_above_it_in_the_database(clusters, form):
    """Level n + 1 digests, asked within some level n chunks, add up to theirs, from the
    whole table (level 0) down."""
    from gpcdc_toolkit.validate._checksum import _digest_rows, _digests, _row_hash, _run_all
    from gpcdc_toolkit.validate._chunks import Chunk, first_level, summed
    from gpcdc_toolkit.validate._snapshots import Snapshots

    source, _ = clusters
    info = source.table(TABLE)
    hashed = _row_hash(info, form)
    with Snapshots(source) as reading:
        def digests(level, parents):
            return summed(_digest_rows(level, rows) for rows in _run_all(_digests(reading, info, hashed, level, parents)))

        above = {Chunk(0, p): d for p, d in digests(0, ()).items()}
        assert [d.rows for d in above.values()] == [3000]
        for level in (1, 2, 3, 4):
            parents = tuple(sorted(above)[:40])
            below = {Chunk(level, p): d for p, d in digests(level, parents).items()}
            assert {c.parent() for c in below} == set(parents)
            for parent in parents:
                inside = [d for c, d in below.items() if c.parent() == parent]
                assert sum(d.rows for d in inside) == above[parent].rows
                assert sum(d.checksum for d in inside) % 2**64 == above[parent].checksum
            above = below
        # The first level in one pass (the sandbox's aggregate) is the first level grouped.
        one_pass = first_level([rows[0][0] for rows in _run_all(_digests(reading, info, hashed, 1, (), one_pass=True))],
                               [])
        assert one_pass.reply == (digests(1, ()), {}) and one_pass.chunks == len(digests(1, ()))


def test_a_sandbox_target_with_a_changed_row_has_the_first_level_measured_in_one_pass(clusters):
    from gpcdc_toolkit.validate._checksum import _row_hash, first_level_in_one_pass
    from gpcdc_toolkit.validate._snapshots import Snapshots

    source, target = clusters
    for cluster in (source, target):
        with Snapshots(cluster) as side:
            assert first_level_in_one_pass(side)
    node = target.segments[segment_for([11], target.segment_count)]
    with target.connect_node(node) as conn:
        before = conn.execute('SELECT "select" FROM "Order Items" WHERE id = 11').fetchone()[0]
        conn.execute('UPDATE "Order Items" SET "select" = \'changed\' WHERE id = 11')
    try:
        result = compare_checksums(source, target, TABLE, fetch_rows=50)
        prefixes = set()  # the first level's chunks that hold rows on either side
        for cluster in (source, target):
            query = sql.SQL('SELECT DISTINCT ({} >> 48) & 65535 FROM "Order Items"').format(
                _row_hash(cluster.table(TABLE), "stored"))
            for segment in cluster.segments:
                with cluster.connect_node(segment) as conn:
                    prefixes |= {p for (p,) in conn.execute(query)}
        assert result.diff.changed == 1 and result.rounds == 2
        # The whole table, then every chunk of the first level holding rows: the row's two
        # versions differ in one chunk, or in two.
        assert result.levels[0] == (0, 1, 1) and result.levels[1][:2] == (1, len(prefixes)), result.levels
        assert result.levels[1][2] in (1, 2), result.levels
    finally:
        with target.connect_node(node) as conn:
            conn.execute('UPDATE "Order Items" SET "select" = %s WHERE id = 11', (before,))
    assert compare_checksums(source, target, TABLE).equal


def _hashes(cluster):
    """Each row's key and the unsigned row hash validation computes for it, on every segment."""
    from gpcdc_toolkit.validate._checksum import _row_hash

    query = sql.SQL('SELECT id, {} FROM "Order Items"').format(_row_hash(cluster.table(TABLE), "stored"))
    hashes = {}
    for segment in cluster.segments:
        with cluster.connect_node(segment) as conn:
            hashes.update((key, h % 2**64) for key, h in conn.execute(query))
    return hashes


def test_a_chunk_one_row_apart_is_settled_by_its_key_and_a_crowded_one_bisected(clusters):
    source, target = clusters
    hashes = _hashes(source)
    by_chunk = {}
    for key, h in sorted(hashes.items()):
        by_chunk.setdefault(h >> 48, []).append(key)
    crowded = next(keys[:2] for keys in by_chunk.values() if len(keys) >= 2 and 11 not in keys and 12 not in keys)
    changed = [11, *crowded]
    with restored(clusters, *changed, 12, 10**6 + 1):
        for key in changed:
            on_segment(target, TABLE, key, "UPDATE {} SET \"select\" = 'changed ' || id WHERE id = %s", (key,))
        on_segment(target, TABLE, 12, "DELETE FROM {} WHERE id = 12")
        on_segment(target, TABLE, 10**6 + 1, "INSERT INTO {} (id, \"select\") VALUES (1000001, 'extra')")
        after = _hashes(target)
        versions = [h >> 48 for side in (hashes, after) for key, h in side.items()
                    if hashes.get(key) != after.get(key)]
        lone = {chunk for chunk in versions if versions.count(chunk) == 1}
        result = compare_checksums(source, target, TABLE, fetch_rows=50)
        diff = result.diff
        assert (diff.missing, diff.extra, diff.changed) == (1, 1, 3), diff.examples
        assert {row.key for row in diff.rows} == {("11",), ("12",), ("1000001",), *((str(k),) for k in crowded)}
        # Every chunk one row apart is settled by its key; the two rows sharing a source chunk are not.
        assert lone and result.settled == len(lone) and hashes[crowded[0]] >> 48 not in lone
        assert result.chunks >= 1
        apply(target, result)
        assert compare_checksums(source, target, TABLE).equal
    assert compare_checksums(source, target, TABLE).equal


def test_differences_each_alone_in_their_chunks_are_found_by_their_keys_with_no_chunk_fetched(clusters):
    source, target = clusters
    hashes = _hashes(source)
    on_segment(target, TABLE, 13, "UPDATE {} SET ratio = -ratio WHERE id = 13")
    on_segment(target, TABLE, 14, "DELETE FROM {} WHERE id = 14")
    try:
        after = _hashes(target)
        versions = [hashes[13] >> 48, after[13] >> 48, hashes[14] >> 48]
        assert len(set(versions)) == 3  # the seeded rows' three versions fall in three chunks
        result = compare_checksums(source, target, TABLE, fetch_rows=50)
        assert (result.diff.missing, result.diff.extra, result.diff.changed) == (1, 0, 1), result.diff.examples
        # Both versions of 13 and the source's 14, each once: looked up, no chunk's rows read.
        assert (result.settled, result.chunks, result.fetched) == (3, 0, 3)
        apply(target, result)
        assert compare_checksums(source, target, TABLE).equal
    finally:
        on_segment(target, TABLE, 13, "UPDATE {} SET ratio = abs(ratio) WHERE id = 13")  # the seeded ratios are >= 0
        with source.connect_node(source.segments[segment_for([14], source.segment_count)]) as conn:
            row = conn.execute('SELECT id, "select", amount::text, ratio::text, tags::text, doc::text, raw '
                               'FROM "Order Items" WHERE id = 14').fetchone()
        on_segment(target, TABLE, 14, "INSERT INTO {} VALUES (%s, %s, %s::numeric, %s::float8, %s::int[], %s::jsonb, %s) "
                                      "ON CONFLICT DO NOTHING", row)


def test_a_misplaced_row_that_is_extra_or_changed_too_is_counted_once_and_its_fix_leaves_no_stray(clusters, compare):
    """An extra row on a segment its key does not name is deleted there and nowhere
    inserted; a changed row there is deleted and the source's version goes home."""
    source, target = clusters
    stray, moved = 10**6 + 2, 15
    with restored(clusters, stray, moved):
        with target.connect_node(target.segments[1 - segment_for([stray], target.segment_count)]) as conn:
            conn.execute('INSERT INTO "Order Items" (id, "select") VALUES (%s, %s)', (stray, "stray"))
        home = segment_for([moved], target.segment_count)
        with target.connect_node(target.segments[home]) as conn:
            row = list(conn.execute(f'DELETE FROM "Order Items" WHERE id = %s RETURNING {ITEM_COLUMNS}', (moved,)).fetchone())
        row[1] = "moved and changed"
        with target.connect_node(target.segments[1 - home]) as conn:
            conn.execute(f'INSERT INTO "Order Items" VALUES ({ITEM_VALUES})', row)
        result = compare(source, target, TABLE, fetch_rows=50)
        diff = result.diff
        assert (diff.missing, diff.extra, diff.changed, diff.misplaced) == (0, 1, 1, 0), diff.examples
        assert {(r.kind, r.key) for r in diff.rows} == {("extra", (str(stray),)), ("changed", (str(moved),))}
        apply(target, result)
        again = compare(source, target, TABLE)
        assert again.equal, again.diff.examples


def test_a_key_held_twice_on_a_segment_is_an_extra_copy_not_merged_into_one_row(clusters, compare):
    """A segment whose table lost its key's unique index holds a row twice: the copy is
    extra (its chunk one row apart, but the key names two rows there: never settled; in
    Spark both copies join the source's row alike), and a lone change beside it is
    settled by its key (a smallint key, negative). A row whose key is NULL there (the
    column's NOT NULL lost too) is extra, and its fix finds it."""
    source, target = clusters
    table = ("public", "Twice Keyed")
    rows = [{"k": k, "v": f"v{k}"} for k in range(-300, 300)]
    with on_both(clusters, table, '("k" smallint PRIMARY KEY, "v" text) DISTRIBUTED BY ("k")', rows):
        for key, value in ((-7, "v-7"), (None, "ghost")):  # each on the segment its key names
            with target.connect_node(target.segments[segment_for([key], target.segment_count)]) as conn:
                _without_key_index(conn, table)
                conn.execute('ALTER TABLE "Twice Keyed" ALTER COLUMN "k" DROP NOT NULL')
                conn.execute('INSERT INTO "Twice Keyed" VALUES (%s, %s)', (key, value))
        on_segment(target, table, -8, "UPDATE {} SET v = 'changed' WHERE k = -8")
        result = compare(source, target, table, fetch_rows=50)
        assert not result.equal and (result.diff.missing, result.diff.extra, result.diff.changed) == (0, 2, 1)
        assert {(row.kind, row.key, row.target) for row in result.diff.rows} == {
            ("changed", ("-8",), ("-8", "changed")), ("extra", ("-7",), ("-7", "v-7")), ("extra", (None,), (None, "ghost"))}
        assert result.settled >= 1 or compare is not compare_checksums
        apply(target, result)
        again = compare(source, target, table)
        assert again.equal and again.diff.actual == 600, again.diff.line()


def _without_key_index(conn, table):
    """The table on one node stripped of its primary key's unique index."""
    name = sql.Identifier(*table)
    if held := conn.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'",
                            (name.as_string(conn),)).fetchone():
        conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(name, sql.Identifier(held[0])))


def test_a_key_held_twice_with_its_other_copy_in_an_equal_chunk_loses_only_the_extra_copy(clusters, compare):
    """A composite key, not an integer: no chunk is settled, each differing one is
    fetched. The extra copy's chunk differs; the copy equal to the source's row sits in
    a chunk that does not. Both are found under their key, and the fix deletes the extra
    one alone (a delete by key would take both)."""
    source, target = clusters
    table = ("public", "Region Keyed")
    rows = [{"Region Code": code, "n": n, "v": f"{code}/{n}"} for code in ("it's", "Nord Ost", '"q"') for n in range(200)]
    with on_both(clusters, table, '("Region Code" text, "n" int, "v" text, PRIMARY KEY ("Region Code", "n")) '
                                  'DISTRIBUTED BY ("Region Code")', rows):
        with target.connect_node(target.segments[segment_for(["it's"], target.segment_count)]) as conn:
            _without_key_index(conn, table)
            conn.execute('INSERT INTO "Region Keyed" VALUES (%s, %s, %s)', ("it's", 7, "other"))
        result = compare(source, target, table, fetch_rows=50)
        diff = result.diff
        assert (diff.missing, diff.extra, diff.changed, diff.misplaced) == (0, 1, 0, 0), diff.examples
        assert [(row.kind, row.key, row.target) for row in diff.rows] == [("extra", ("it's", "7"), ("it's", "7", "other"))]
        apply(target, result)
        again = compare(source, target, table)
        assert again.equal and again.diff.actual == 600, again.diff.line()


def test_a_copy_of_a_keyed_row_on_another_segment_is_moved_home_after_the_changed_row_there_is_deleted(clusters, compare):
    """The key's home segment holds a changed version, another segment the source's
    version: the one at home is extra, the other misplaced. The fix deletes before it
    inserts, so the move home meets no copy under the home's unique index."""
    source, target = clusters
    key = 21
    home = segment_for([key], target.segment_count)
    with source.connect_node(source.segments[segment_for([key], source.segment_count)]) as conn:
        row = conn.execute(f'SELECT {ITEM_COLUMNS} FROM "Order Items" WHERE id = %s', (key,)).fetchone()
    with restored(clusters, key):
        with target.connect_node(target.segments[1 - home]) as conn:
            conn.execute(f'INSERT INTO "Order Items" VALUES ({ITEM_VALUES})', row)
        on_segment(target, TABLE, key, "UPDATE {} SET \"select\" = 'at home, changed' WHERE id = %s", (key,))
        result = compare(source, target, TABLE, fetch_rows=50)
        diff = result.diff
        assert (diff.missing, diff.extra, diff.changed, diff.misplaced) == (0, 1, 0, 1), diff.examples
        assert {(r.kind, r.target_segment, r.target[1]) for r in diff.rows} == {
            ("extra", home, "at home, changed"), ("misplaced", 1 - home, row[1])}
        apply(target, result)
        again = compare(source, target, TABLE)
        assert again.equal, again.diff.examples


def test_the_fix_finds_a_row_by_its_text_whatever_the_session_it_is_run_in(clusters, compare):
    """An extra copy among rows alike is deleted by the row's text, which the session's
    time zone and date style print: each section of the fix sets the session that
    printed it, whatever the one it runs in."""
    source, target = clusters
    table = ("public", "Stamped Log")
    rows = [{"at": f"2026-11-{1 + i % 28:02d} {i % 24:02d}:30:00+00", "note": f"n{i % 7}", "day": f"2026-10-{1 + i % 28:02d}"}
            for i in range(60)]
    with on_both(clusters, table, '("at" timestamptz, "note" text, "day" date) DISTRIBUTED BY ("note")', rows):
        on_segment(target, table, "n3", "INSERT INTO {} VALUES ('2026-11-04 03:30:00+00', 'n3', '2026-10-04')")  # a copy
        result = compare(source, target, table)
        assert (result.diff.missing, result.diff.extra) == (0, 1), result.diff.examples
        for content, statements in result.fix.items():
            with target.connect_node(target.segments[content]) as conn, conn.transaction():
                conn.execute("SET TimeZone = 'Asia/Kolkata'")
                conn.execute("SET DateStyle = 'SQL, DMY'")
                for statement in statements:
                    conn.execute(statement)
        again = compare(source, target, table)
        assert again.equal and again.diff.actual == 60, again.diff.line()


def test_a_row_whose_generated_column_alone_differs_is_changed_with_no_statement(clusters):
    """The generation expressions differ: no UPDATE can set a generated column, so the
    row is changed and its fix says nothing of it (an empty SET is no statement)."""
    source, target = clusters
    table = ("public", "Generated Twice")
    for cluster, times in ((source, 2), (target, 3)):
        with Session(cluster) as session:
            session.ddl(f'CREATE TABLE "Generated Twice" ("k" int PRIMARY KEY, "n" int, '
                        f'"g" int GENERATED ALWAYS AS ("n" * {times}) STORED) DISTRIBUTED BY ("k")')
            with session.transaction() as tx:
                tx.insert(table, [{"k": k, "n": k % 3} for k in range(30)])
    try:
        result = compare_checksums(source, target, table)
        assert result.diff.changed == 20 and {row.columns for row in result.diff.rows} == {("g",)}
        assert not any("UPDATE" in statement for statements in result.fix.values() for statement in statements)
    finally:
        for cluster in (source, target):
            with Session(cluster) as session:
                session.ddl('DROP TABLE IF EXISTS "Generated Twice"')


def test_a_target_suite_naming_no_table_compared_is_said_not_run_with_why(clusters, tmp_path):
    import json

    from gpcdc_toolkit.config import load_config
    from gpcdc_toolkit.validate import validate

    source, target = clusters
    suites = tmp_path / "suites"
    suites.mkdir()
    for name, table in (("on items", 'public."Order Items"'), ("on the log", 'public."keyless log"'),
                        ("on a typo", '"Order Items"')):
        (suites / f"{name}.json").write_text(json.dumps({"name": name, "meta": {"gpcdc": {"frame": "target", "table": table}},
                                                         "expectations": [{"type": "expect_table_row_count_to_be_between",
                                                                           "kwargs": {"min_value": 1}}]}))
    config = load_config({"work_dir": str(tmp_path), "validate.expectations_dir": str(suites)}, environ={})
    run = validate(config, tables=[TABLE], syncpoint=False, source=source, target=target)
    assert run.verified and {o.suite for o in run.expectations} >= {"on items"}
    assert run.suites_not_run == (
        "expectation suite 'on a typo' not run: \"Order Items\" is no distributed table of the source (name it as "
        'PostgreSQL prints it, e.g. public."Order Items")',
        "expectation suite 'on the log' not run: public.\"keyless log\" is not among the tables compared")
    assert set(run.suites_not_run) <= set(run.lines())
    assert json.loads((run.output / "summary.json").read_text())["suites_not_run"] == list(run.suites_not_run)


def test_a_column_default_that_differs_is_a_difference_with_its_fix(clusters):
    source, target = clusters
    with Session(source) as session:
        session.ddl("""ALTER TABLE "Order Items" ALTER COLUMN "select" SET DEFAULT 'it''s'""")
    with Session(target) as session:
        session.ddl('ALTER TABLE "Order Items" ALTER COLUMN "ratio" SET DEFAULT 0.5')
    try:
        result = compare_checksums(source, target, TABLE)
        assert result.diff.equal and not result.equal
        assert len(result.schema) == 2
        assert any("'select'" in s and "NULL on the target" in s for s in result.schema), result.schema
        assert any("'ratio'" in s and "NULL on the source" in s for s in result.schema), result.schema
        # The coordinator's DDL runs in the session the defaults were printed in.
        settings, statements = result.fix[-1][:-2], result.fix[-1][-2:]
        assert all(s.startswith("SET LOCAL ") for s in settings) and "SET LOCAL lc_monetary = 'C'" in settings
        assert statements == ['ALTER TABLE "public"."Order Items" ALTER COLUMN "select" SET DEFAULT \'it\'\'s\'::text',
                              'ALTER TABLE "public"."Order Items" ALTER COLUMN "ratio" DROP DEFAULT']
        with Session(target) as session:
            for statement in statements:
                session.ddl(statement)
        assert compare_checksums(source, target, TABLE).equal
    finally:
        for cluster in (source, target):
            with Session(cluster) as session:
                session.ddl('ALTER TABLE "Order Items" ALTER COLUMN "select" DROP DEFAULT')
                session.ddl('ALTER TABLE "Order Items" ALTER COLUMN "ratio" DROP DEFAULT')


def test_differences_the_types_own_hashes_would_miss_are_found(clusters, compare):
    """Values swapped between rows (a linear row hash sums them alike), an array's bounds
    and a jsonb number's scale (their types' hashes ignore both)."""
    source, target = clusters
    with source.connect_node(source.segments[0]) as conn:
        (a, b), = conn.execute('SELECT min(id), max(id) FROM "Order Items"').fetchall()
    with Session(target) as session, session.transaction() as tx:
        values = {k: tx.execute(segment_for([k], target.segment_count),
                                'SELECT amount::text, tags::text, doc::text FROM "Order Items" WHERE id = %s', (k,))[0]
                  for k in (a, b, 20, 21)}
        assert values[a][0] != values[b][0]
        tx.update(TABLE, {"id": a}, {"amount": values[b][0]})
        tx.update(TABLE, {"id": b}, {"amount": values[a][0]})
    on_segment(target, TABLE, 20, "UPDATE {} SET tags = ('[0:1]=' || tags::text)::int[] WHERE id = 20")
    on_segment(target, TABLE, 21, """UPDATE {} SET doc = '{{"a": [1.0, 2], "b": null}}' WHERE id = 21""")
    result = compare(source, target, TABLE)
    assert (result.diff.changed, result.diff.missing, result.diff.extra) == (4, 0, 0), result.diff.examples
    apply(target, result)
    assert compare(source, target, TABLE).equal


@given(rows=st.lists(st.tuples(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=6), st.integers(-5, 5),
                               st.booleans()),
                     max_size=30, unique_by=lambda r: (r[0], r[1])))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_placement_is_counted_in_the_first_round_and_exactly_the_misplaced_rows_are_found(clusters, rows):
    """Rows moved to a segment their (two-column) key does not name are found, each once,
    whichever segment they sit on; with none moved, no segment is searched for them and
    the comparison is one round."""
    source, target = clusters
    for cluster in (source, target):
        with Session(cluster) as session:
            session.ddl(sql.SQL('CREATE TABLE IF NOT EXISTS {} ("Key" text, "n" int, PRIMARY KEY ("Key", "n")) '
                                'DISTRIBUTED BY ("Key", "n")').format(sql.Identifier(*PLACED)).as_string(None))
            session.ddl(sql.SQL("TRUNCATE {}").format(sql.Identifier(*PLACED)).as_string(None))
            with session.transaction() as tx:
                tx.insert(PLACED, [{"Key": key, "n": n} for key, n, _moved in rows])
    moved = {(key, str(n)) for key, n, is_moved in rows if is_moved}
    for key, n in moved:
        home = segment_for([key, int(n)], target.segment_count)
        for content, statement in ((home, "DELETE FROM {} WHERE \"Key\" = %s AND n = %s"),
                                   (1 - home, "INSERT INTO {} VALUES (%s, %s)")):
            with target.connect_node(target.segments[content]) as conn:
                conn.execute(sql.SQL(statement).format(sql.Identifier(*PLACED)), (key, int(n)))
    result = compare_checksums(source, target, PLACED)
    assert result.diff.misplaced == len(moved) and {r.key for r in result.diff.rows} == moved, result.diff.examples
    assert result.equal == (not moved) and (result.rounds == 1 or moved)
    assert compare_checksums(source, target, PLACED, placement=False).equal  # the sums cannot see where a row is


TYPED = ("public", "Typed Keys")
TYPED_KEY = ("id", "flag", "addr", "code")


def test_keys_whose_cast_to_text_is_not_their_printed_text_are_placed_checked_and_moved_alike(clusters):
    """A boolean, an inet and a character(n) in the distribution key: their casts to text
    ('true', '10.0.0.1/32', 'ab') are not the text they print and are routed by ('t',
    '10.0.0.1', 'ab  ', as the WAL gives them and Python values are given). Rows written by the toolkit, one moved by a key update, are
    where the placement check looks for them; a row put elsewhere is found and the fix
    puts it home."""
    source, target = clusters
    rows = [{"id": i, "flag": i % 2 == 0, "addr": f"10.0.{i}.1", "code": "ab  " if i % 3 else "abcd", "v": i}
            for i in range(40)]
    table = sql.Identifier(*TYPED).as_string(None)
    try:
        for cluster in (source, target):
            with Session(cluster) as session:
                session.ddl(f"DROP TABLE IF EXISTS {table}")
                session.ddl(f"CREATE TABLE {table} (id int, flag boolean, addr inet, code character(4), v int, "
                            f"PRIMARY KEY (id, flag, addr, code)) DISTRIBUTED BY (id, flag, addr, code)")
                with session.transaction() as tx:
                    tx.insert(TYPED, rows)
                    # A new id moves the row: written back from its text on the segment it leaves.
                    key = {c: rows[0][c] for c in TYPED_KEY}
                    tx.update(TYPED, key, {"id": 100})
        result = compare_checksums(source, target, TYPED)
        assert result.equal and result.diff.misplaced == 0, result.diff.examples
        # One row put on a segment its key does not name.
        row = rows[5]
        values = [row[c] for c in (*TYPED_KEY, "v")]
        home = segment_for([row[c] for c in TYPED_KEY], target.segment_count)
        with target.connect_node(target.segments[home]) as conn:
            assert conn.execute(f"DELETE FROM {table} WHERE id = %s", (row["id"],)).rowcount == 1
        with target.connect_node(target.segments[1 - home]) as conn:
            conn.execute(f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s)", values)
        result = compare_checksums(source, target, TYPED)
        assert result.diff.misplaced == 1 and not result.equal, result.diff.examples
        apply(target, result)
        with target.connect_node(target.segments[home]) as conn:
            assert conn.execute(f"SELECT count(*) FROM {table} WHERE id = %s", (row["id"],)).fetchone()[0] == 1
        assert compare_checksums(source, target, TYPED).equal
    finally:
        for cluster in (source, target):
            with Session(cluster) as session:
                session.ddl(f"DROP TABLE IF EXISTS {table}")


ARRAY_KEYED = ("public", "Array Keyed")


def test_rows_under_a_key_with_an_array_column_are_found_and_fixed(clusters):
    """A primary key with an array in it (its text, '{1,2}', is no element of an array of
    arrays): the rows under differing keys are looked up and the fix makes the tables equal."""
    source, target = clusters
    table = sql.Identifier(*ARRAY_KEYED).as_string(None)
    rows = [{"id": i, "tags": [i, None, i + 1] if i % 2 else [], "v": f"v{i}"} for i in range(30)]
    try:
        for cluster in (source, target):
            with Session(cluster) as session:
                session.ddl(f"DROP TABLE IF EXISTS {table}")
                session.ddl(f"CREATE TABLE {table} (id int, tags int[], v text, PRIMARY KEY (id, tags)) "
                            "DISTRIBUTED BY (id)")
                with session.transaction() as tx:
                    tx.insert(ARRAY_KEYED, rows)
        on_segment(target, ARRAY_KEYED, 3, "UPDATE {} SET v = 'changed' WHERE id = 3")
        on_segment(target, ARRAY_KEYED, 4, "DELETE FROM {} WHERE id = 4")
        result = compare_checksums(source, target, ARRAY_KEYED)
        assert (result.diff.changed, result.diff.missing, result.diff.extra) == (1, 1, 0), result.diff.examples
        apply(target, result)
        assert compare_checksums(source, target, ARRAY_KEYED).equal
    finally:
        for cluster in (source, target):
            with Session(cluster) as session:
                session.ddl(f"DROP TABLE IF EXISTS {table}")


@pytest.mark.parametrize("mode", ["checksum", "spark"])
def test_a_table_the_target_lacks_is_named_with_the_way_to_get_it(clusters, tmp_path, mode):
    from gpcdc_toolkit.config import load_config
    from gpcdc_toolkit.validate import ValidationError, validate

    source, target = clusters
    table = f'"Only On The Source {mode}"'
    with Session(source) as session:
        session.ddl(f"CREATE TABLE {table} (id int PRIMARY KEY) DISTRIBUTED BY (id)")
    try:
        config = load_config({"work_dir": str(tmp_path), "validate.mode": mode}, environ={})
        with pytest.raises(ValidationError) as refused:
            validate(config, tables=[table], syncpoint=False, source=source, target=target)
        assert str(refused.value).startswith(f'the target has no table "public".{table}, which the source has: '
                                             "replay creates it"), refused.value
    finally:
        with Session(source) as session:
            session.ddl(f"DROP TABLE {table}")


def test_a_target_server_lost_during_the_comparison_fails_the_run_and_the_next_run_verifies(clusters, target_box,
                                                                                            tmp_path):
    """A target segment's server crashes and comes back while a validation waits on it:
    the run ends with an error that names what was lost (never a verdict), and the
    next run finds the tables equal."""
    from gpcdc_toolkit.config import load_config
    from gpcdc_toolkit.errors import GpcdcError
    from gpcdc_toolkit.validate import validate

    from .test_validate_expectations import waiting_for

    source, target = clusters
    config = load_config({"work_dir": str(tmp_path)}, environ={})
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(validate(config, tables=[TABLE], syncpoint=False, source=source, target=target))
        except Exception as e:  # the test looks at what it was
            outcome.append(e)

    with closing(target.connect_node(target.segments[0])) as locker, \
            closing(target.connect_node(target.segments[0])) as watcher:
        locker.execute("BEGIN")
        locker.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(*TABLE)))
        (locker_pid,) = locker.execute("SELECT pg_backend_pid()").fetchone()
        validating = threading.Thread(target=run)
        validating.start()
        try:
            assert waiting_for(watcher, locker_pid, seconds=60), "the validation never read the locked table"
        finally:
            target_box.restart(0, "immediate")  # as a crash: every session there ends, the lock with them
            validating.join(120)
    assert not validating.is_alive(), "the validation still waits on a server that came back"
    (error,) = outcome
    assert isinstance(error, GpcdcError) and str(error).startswith(
        f"the comparison lost its connection to the target's {target.segments[0]} and gives no verdict ("), error
    again = validate(config, tables=[TABLE], syncpoint=False, source=source, target=target)
    assert again.verified, again.lines()
