"""The sandbox's row hash (``gp_dist.row_hash``, in C) against the text PostgreSQL prints:
two values hash alike exactly when they print alike, whatever their type, input form or
storage, on two different servers; and validation by it finds what the other row hashes
find, on tables of any width."""

import json
import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql

from gpcdc_toolkit.cluster import Session, segment_for
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.sandbox._functions import ROW_HASH_SYMBOL
from gpcdc_toolkit.validate._checksum import ROW_HASHES, ValidationError, compare_checksums
from gpcdc_toolkit.validate._snapshots import SESSION

WIDE = ("public", "Wide")
_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
_json = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.sampled_from([1.0, 1.5, -0.0, 1e20])
                     | _text, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
                     max_leaves=6)


def _float(width):
    return st.one_of(st.floats(width=width).map(repr).map(lambda r: {"nan": "NaN", "inf": "Infinity",
                                                                      "-inf": "-Infinity"}.get(r, r)),
                     st.sampled_from(["0", "-0", "1e-320" if width == 64 else "1e-40", "1", "1.0"]))


# (type, its values as input text): forms that denote the same value, and forms that print apart.
TYPES = [
    ("bigint", st.integers(-(2**63), 2**63 - 1).map(str) | st.sampled_from(["007", " 7", "-0"])),
    ("smallint", st.integers(-(2**15), 2**15 - 1).map(str)),
    ("boolean", st.sampled_from(["t", "f", "true", "no", "1", "0"])),
    ("real", _float(32)),
    ("double precision", _float(64)),
    ("numeric", st.decimals(-10**15, 10**15, allow_nan=False, places=4).map(str)
     | st.sampled_from(["1.0", "1.00", "1", "-0", "0.000", "NaN", "Infinity", "-Infinity", "1e3", "1000"])),
    ("numeric(10,3)", st.sampled_from(["1.5", "1.50", "1.5004", "1.4996", "-0.0001", "0"])),
    ("text", _text | st.sampled_from(["", " ", "NULL", "\\N", "a\x1fb"])),
    ("character(4)", st.sampled_from(["a", "a ", "a   ", "ab", "", " "])),
    ("bytea", st.binary(max_size=8).map(lambda b: "\\x" + b.hex())),
    ("date", st.dates().map(str) | st.sampled_from(["2024-02-29", "20240229", "Feb 29 2024"])),
    ("timestamptz", st.sampled_from(["2024-01-01 00:00:00+00", "2024-01-01 01:00:00+01", "2024-01-01 00:00:00.5+00",
                                     "infinity", "2024-01-01 00:00:00-00:30"])),
    ("time", st.sampled_from(["00:00", "00:00:00.000", "23:59:59.999999", "12:00"])),
    ("uuid", st.uuids().map(str) | st.sampled_from(["A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
                                                    "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"])),
    ("jsonb", _json.map(json.dumps) | st.sampled_from(['{"a":1,"b":2}', '{ "b" : 2, "a" : 1 }', '{"a":1.0}', "1",
                                                       "1.0", '{"a":1,"a":2}', '{"a":2}'])),
    ("json", st.sampled_from(['{"a":1}', '{ "a":1}', "[1,2]", "[1, 2]"])),
    ("int[]", st.lists(st.none() | st.integers(-9, 9), max_size=4).map(
        lambda xs: "{" + ",".join("NULL" if x is None else str(x) for x in xs) + "}")
     | st.sampled_from(["{1,2}", "[0:1]={1,2}", "{{1,2},{3,4}}", "{1,2,3,4}", "{}"])),
    ("text[]", st.lists(_text, max_size=3).map(lambda xs: "{" + ",".join(json.dumps(x) for x in xs) + "}")),
    ("numeric[]", st.sampled_from(["{1.0,2}", "{1.00,2}", "{1,2}", "{NULL}"])),
    ("interval", st.sampled_from(["1 day", "24 hours", "1 day 00:00:00", "P1D", "1 mon", "30 days"])),
    ("mood", st.sampled_from(["sad", "ok", "happy"])),
    ("pair", st.sampled_from(['(1,"x")', "(1,x)", "(2,)", '(2,"")'])),
    ("positive", st.sampled_from(["1", "01", "2"])),
    ("positive[]", st.sampled_from(["{1,2}", "{01,2}", "{2}"])),
]
_typed_pairs = st.sampled_from(TYPES).flatmap(
    lambda t: st.tuples(st.just(t[0]), t[1], t[1]) | st.tuples(st.just(t[0]), t[1]).map(lambda p: (p[0], p[1], p[1])))


@pytest.fixture(scope="module")
def servers(source):
    """Two segments of the source (two servers), with an enum, a composite type and a
    domain whose OIDs differ between them."""
    with Session(source) as session:
        for statement in ("DROP TYPE IF EXISTS mood", "DROP TYPE IF EXISTS pair", "DROP DOMAIN IF EXISTS positive"):
            session.ddl(statement)
    with source.connect_node(source.segments[1]) as conn:  # OIDs used up on one server only
        conn.execute("CREATE TEMP TABLE spent AS SELECT 1 AS x")
        conn.execute("CREATE TYPE pg_temp.spent_mood AS ENUM ('a', 'b', 'c', 'd')")
    with Session(source) as session:
        session.ddl("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
        session.ddl("CREATE TYPE pair AS (a int, b text)")
        session.ddl("CREATE DOMAIN positive AS int CHECK (VALUE > 0)")
    conns = [source.connect_node(source.segments[i]) for i in (0, 1)]
    try:
        for conn in conns:
            conn.execute(SESSION)
        enum_oids = [conn.execute("SELECT oid FROM pg_enum WHERE enumlabel = 'ok'").fetchone()[0] for conn in conns]
        assert enum_oids[0] != enum_oids[1], "the test needs the servers to store the enum's labels apart"
        yield conns
    finally:
        for conn in conns:
            conn.close()
        with Session(source) as session:
            for statement in ("DROP TYPE mood", "DROP TYPE pair", "DROP DOMAIN positive"):
                session.ddl(statement)


def hash_and_text(conn, type_name, value):
    query = sql.SQL("SELECT gp_dist.row_hash(v), v::text FROM (SELECT {}::{} AS v) s").format(
        sql.Literal(value), sql.SQL(type_name))
    return conn.execute(query).fetchone()


@given(pair=_typed_pairs)
@settings(max_examples=200, deadline=None)
def test_two_values_hash_alike_on_two_servers_exactly_when_they_print_alike(servers, pair):
    type_name, a, b = pair
    (hash_a, text_a), (hash_b, text_b) = hash_and_text(servers[0], type_name, a), hash_and_text(servers[1], type_name, b)
    assert (hash_a == hash_b) == (text_a == text_b), (type_name, a, b, text_a, text_b)


# Types whose name as the catalog prints it carries a modifier, before an array's
# brackets; with input forms that print alike and apart.
MODIFIED = {
    "character varying(8)": ["a", "a ", "ab", "", "NULL"],
    "character varying(8)[]": ["{a,b}", "[0:1]={a,b}", "{{a,b}}", "{a}", "[2:2]={a}", "{}", '{"a b",c}', "{NULL}"],
    "numeric(6,2)[]": ["{1.5,2}", "[0:1]={1.5,2}", "{{1.5,2}}", "{1.50,2.00}"],
    "timestamp(3) with time zone[]": ["{2024-01-01 00:00:00+00}", "[5:5]={2024-01-01 00:00:00+00}",
                                      "{2024-01-01 01:00:00+01}"],
}


@pytest.fixture(scope="module")
def printed_names(servers):
    """Each type's name as the catalog prints it (``format_type``), as validation reads it."""
    names = {}
    for declared in [t for t, _values in TYPES] + list(MODIFIED):
        servers[0].execute(sql.SQL("CREATE TEMP TABLE probe (v {})").format(sql.SQL(declared)))
        names[declared] = servers[0].execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                                             "WHERE attrelid = 'probe'::regclass AND attname = 'v'").fetchone()[0]
        servers[0].execute("DROP TABLE probe")
    return names


def hashed_alike(servers, printed_names, declared, form, a, b):
    """Whether a column of the type, as validation hashes it by ``form``, hashes ``a`` on
    one server as ``b`` on the other; and whether they print alike."""
    from gpcdc_toolkit.cluster._cluster import Table
    from gpcdc_toolkit.validate._checksum import _row_hash

    info = Table("t", ("v",), (printed_names[declared],), (), ())
    query = sql.SQL("SELECT {}, v::text FROM (SELECT %s::{} AS v) t").format(_row_hash(info, form), sql.SQL(declared))
    (hash_a, text_a), (hash_b, text_b) = (conn.execute(query, (v,)).fetchone() for conn, v in zip(servers, (a, b)))
    return hash_a == hash_b, text_a == text_b


@pytest.mark.parametrize("form", ROW_HASHES)
def test_every_row_hash_tells_apart_values_of_a_modified_type_exactly_when_they_print_apart(servers, printed_names,
                                                                                           form):
    """Every pair of each type's values: an array's bounds and nesting, a number's scale
    count wherever they print, whatever modifier the element type carries."""
    for declared, values in MODIFIED.items():
        for a in values:
            for b in values:
                alike, printed_alike = hashed_alike(servers, printed_names, declared, form, a, b)
                assert alike == printed_alike, (declared, form, a, b)


@given(pair=_typed_pairs, form=st.sampled_from(ROW_HASHES))
@settings(max_examples=200, deadline=None)
def test_every_row_hash_of_two_values_is_alike_exactly_when_they_print_alike(servers, printed_names, pair, form):
    type_name, a, b = pair
    alike, printed_alike = hashed_alike(servers, printed_names, type_name, form, a, b)
    assert alike == printed_alike, (type_name, form, a, b)


_cell = st.none() | st.sampled_from(["", "a", "ab", "b", "NULL"])


@given(rows=st.tuples(st.lists(_cell, min_size=1, max_size=4), st.lists(_cell, min_size=1, max_size=4)))
@settings(max_examples=100, deadline=None)
def test_rows_hash_alike_exactly_when_every_column_is_alike(servers, rows):
    """NULL and '' apart, a value split differently between columns apart, columns in order."""
    hashes = []
    for conn, row in zip(servers, rows):
        query = sql.SQL("SELECT gp_dist.row_hash({})").format(sql.SQL(", ").join(
            sql.SQL("{}::text").format(sql.Literal(v)) for v in row))
        hashes.append(conn.execute(query).fetchone()[0])
    assert (hashes[0] == hashes[1]) == (rows[0] == rows[1])


def test_a_stored_value_hashes_as_the_same_value_given_inline_however_it_is_stored(servers):
    """Compressed, out of line, or with a short header: the value's bytes, not the storage's."""
    conn = servers[0]
    conn.execute("CREATE TEMP TABLE stored (plain text, compressed text, outside text, doc jsonb)")
    conn.execute("ALTER TABLE stored ALTER COLUMN plain SET STORAGE PLAIN, ALTER COLUMN outside SET STORAGE EXTERNAL")
    long_text = "abc" * 700 + "xyz" * 10  # compressible, 2 kB
    doc = json.dumps({"k": ["v" * 50] * 200})  # 10 kB
    conn.execute("INSERT INTO stored VALUES (%s, %s, %s, %s)", ("short", long_text * 4, long_text * 4, doc))
    stored = conn.execute("SELECT gp_dist.row_hash(plain), gp_dist.row_hash(compressed), gp_dist.row_hash(outside), "
                          "gp_dist.row_hash(doc), pg_column_compression(compressed), "
                          "pg_column_size(compressed) < octet_length(compressed) FROM stored").fetchone()
    inline = conn.execute("SELECT gp_dist.row_hash('short'::text), gp_dist.row_hash(%s::text), "
                          "gp_dist.row_hash(%s::text), gp_dist.row_hash(%s::jsonb)",
                          (long_text * 4, long_text * 4, doc)).fetchone()
    assert stored[4] is not None and stored[5], "the test's value was not compressed"
    assert stored[:4] == inline
    conn.execute("DROP TABLE stored")


def test_a_call_with_an_array_after_variadic_is_refused_in_one_line(servers):
    import psycopg

    with pytest.raises(psycopg.errors.InvalidParameterValue, match="columns as its arguments, not an array"):
        servers[0].execute("SELECT gp_dist.row_hash(VARIADIC ARRAY[1, 2])")
    servers[0].rollback()


@pytest.fixture(scope="module")
def wide(source, work_dir):
    """A table of 150 columns of several types (more than a function takes arguments)
    on the source and on a target of 2 segments, equal, with values stored out of line."""
    target_box = Sandbox(f"rh-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2)
    target = target_box.cluster()
    kinds = ["bigint", "text", "numeric", "double precision", "jsonb", "int[]", "interval", "bytea"]
    columns = [f'"c {i}{"Q" if i % 2 else "q"}"' for i in range(1, 150)]
    types = [kinds[i % len(kinds)] for i in range(1, 150)]
    definition = ", ".join(f"{c} {t}" for c, t in zip(columns, types))
    for cluster in (source, target):
        with Session(cluster) as session:
            session.ddl('DROP TABLE IF EXISTS "Wide"')
            session.ddl(f'CREATE TABLE "Wide" (id int PRIMARY KEY, {definition}) DISTRIBUTED BY (id)')
    for cluster, storage in ((source, "EXTERNAL"), (target, "MAIN")):
        for node in cluster.segments:
            with cluster.connect_node(node) as conn:
                conn.execute(f'ALTER TABLE "Wide" ALTER COLUMN {columns[0]} SET STORAGE {storage}')
    samples = {"bigint": "7", "text": "x" * 3000, "numeric": "1.50", "double precision": "-0", "jsonb": '{"a": [1.0]}',
               "int[]": "[2:3]={1,NULL}", "interval": "1 day", "bytea": "\\x00ff"}
    for cluster in (source, target):
        for key in range(40):
            node = cluster.segments[segment_for([key], cluster.segment_count)]
            values = [key] + [samples[t] if (key + i) % 5 else None for i, t in enumerate(types)]
            with cluster.connect_node(node) as conn:
                conn.execute(sql.SQL('INSERT INTO "Wide" VALUES ({})').format(
                    sql.SQL(", ").join(sql.Placeholder() for _ in values)), values)
    try:
        yield source, target, columns, types, samples
    finally:
        with Session(source) as session:
            session.ddl('DROP TABLE IF EXISTS "Wide"')
        target_box.down(remove=True)


@pytest.mark.parametrize("form", ROW_HASHES)
def test_every_row_hash_finds_the_same_change_in_a_wide_table(wide, form):
    source, target, columns, types, samples = wide
    assert compare_checksums(source, target, WIDE, row_hash=form).equal
    changed = 9
    node = target.segments[segment_for([changed], target.segment_count)]
    with target.connect_node(node) as conn:  # a column beyond the first hundred, from NULL to a value
        before = conn.execute(sql.SQL('SELECT {}::text FROM "Wide" WHERE id = %s').format(sql.SQL(columns[140])),
                              (changed,)).fetchone()[0]
        conn.execute(sql.SQL('UPDATE "Wide" SET {} = CASE WHEN {} IS NULL THEN %s::{} END WHERE id = %s').format(
            sql.SQL(columns[140]), sql.SQL(columns[140]), sql.SQL(types[140])), (samples[types[140]], changed))
    try:
        result = compare_checksums(source, target, WIDE, row_hash=form)
        assert (result.diff.changed, result.diff.missing, result.diff.extra) == (1, 0, 0), result.diff.examples
        assert result.diff.rows[0].columns == (columns[140].strip('"'),)
    finally:
        with target.connect_node(node) as conn:
            conn.execute(sql.SQL('UPDATE "Wide" SET {} = %s WHERE id = %s').format(sql.SQL(columns[140])),
                         (before, changed))


def test_the_fastest_hash_both_sides_compute_is_used_and_another_is_refused_in_one_line(wide):
    from gpcdc_toolkit.validate._checksum import row_hashes
    from gpcdc_toolkit.validate._snapshots import Snapshots

    source, target, *_ = wide
    with pytest.raises(ValidationError) as raised:
        compare_checksums(source, target, WIDE, row_hash="md5")
    assert "\n" not in str(raised.value) and "not one of stored, record, text" in str(raised.value)
    with Snapshots(target) as side:
        assert row_hashes(side) == ("stored", "record", "text")
    node = target.segments[1]
    with target.connect_node(node) as conn:  # one server of the target without the sandbox's hash
        library = conn.execute("SELECT probin FROM pg_proc WHERE proname = 'row_hash'").fetchone()[0]
        conn.execute('DROP FUNCTION gp_dist.row_hash(VARIADIC "any")')
    try:
        with Snapshots(target) as side:
            assert row_hashes(side) == ("record", "text")
        assert compare_checksums(source, target, WIDE).equal
        with pytest.raises(ValidationError) as raised:
            compare_checksums(source, target, WIDE, row_hash="stored")
        assert "\n" not in str(raised.value) and "not computed by both sides (both compute record, text)" in str(
            raised.value)
    finally:
        with target.connect_node(node) as conn:
            conn.execute(sql.SQL('CREATE FUNCTION gp_dist.row_hash(VARIADIC "any") RETURNS bigint AS {}, '
                                 "{} LANGUAGE C IMMUTABLE PARALLEL SAFE").format(sql.Literal(library),
                                                                                  sql.Literal(ROW_HASH_SYMBOL)))


def test_the_rounds_that_name_the_hash_once_let_each_parallel_worker_add_its_share(wide):
    """The first round (with the placement test) and level 1 in one pass are planned as
    partial aggregates on each segment: kept whole as a subquery, their rows would all be
    added by one process while the segment's workers only read them."""
    from gpcdc_toolkit.validate._checksum import _digests, _row_hash
    from gpcdc_toolkit.validate._snapshots import Snapshots

    _source, target, *_ = wide
    info = target.table(WIDE)
    tests = {node.content: target.misplaced_test(node, info) for node in target.segments}
    assert all(test is not None for test in tests.values())
    with Snapshots(target) as side:
        for level, one_pass, misplaced in ((0, False, tests), (1, True, None)):
            for conn, query in _digests(side, info, _row_hash(info, "stored"), level, (), misplaced, one_pass=one_pass):
                for setting in ("parallel_setup_cost = 0", "parallel_tuple_cost = 0",
                                "min_parallel_table_scan_size = 0", "max_parallel_workers_per_gather = 2"):
                    conn.execute(f"SET LOCAL {setting}")
                plan = "\n".join(r[0] for r in conn.execute(sql.SQL("EXPLAIN (COSTS OFF) {}").format(query)))
                assert "Partial Aggregate" in plan and "Parallel Seq Scan" in plan, (level, plan)


def _chunk_digests_in_python(hashes, keys=None):
    chunks = {}
    for h, k in zip(hashes, keys or [0] * len(hashes)):
        unsigned = h % 2**64
        rows, total, xor = chunks.get(unsigned >> 48, (0, 0, 0))
        chunks[unsigned >> 48] = (rows + 1, (total + unsigned) % 2**64, xor ^ (k % 2**64))
    return b"".join(struct.pack(">HqQQ", p, *digest) for p, digest in sorted(chunks.items()))


_bigint = st.integers(-(2**63), 2**63 - 1) | st.sampled_from([-(2**63), 2**63 - 1, 0, -1, 1 << 48, -(1 << 48)])


@given(rows=st.lists(st.tuples(_bigint, _bigint), max_size=60))
@settings(max_examples=60, deadline=None)
def test_chunk_digests_count_sum_and_xor_each_chunk_modulo_two_to_the_64(servers, rows):
    hashes, keys = [h for h, _ in rows], [k for _, k in rows]
    query = "SELECT gp_dist.chunk_digests(h, k) FROM unnest(%s::bigint[], %s::bigint[]) r(h, k)"
    assert servers[0].execute(query, (hashes, keys)).fetchone()[0] == _chunk_digests_in_python(hashes, keys)


def test_chunk_digests_add_partial_states_of_parallel_workers(servers):
    """A parallel plan: each worker's state serialized, sent and added to the others'."""
    conn = servers[0]
    table = sql.Identifier(f"hashes {uuid.uuid4().hex[:6]}")  # not temporary: workers cannot read those
    conn.execute(sql.SQL("CREATE TABLE {} WITH (parallel_workers = 2) AS "
                         "SELECT (random() * 2^64 - 2^63)::bigint AS h, (random() * 2^64 - 2^63)::bigint AS k "
                         "FROM generate_series(1, 200000)").format(table))
    try:
        with conn.transaction():
            for setting in ("force_parallel_mode = on", "parallel_setup_cost = 0", "parallel_tuple_cost = 0",
                            "min_parallel_table_scan_size = 0", "max_parallel_workers_per_gather = 2"):
                conn.execute(f"SET LOCAL {setting}")
            query = sql.SQL("SELECT gp_dist.chunk_digests(h, k) FROM {}").format(table)
            plan = "\n".join(r[0] for r in conn.execute(sql.SQL("EXPLAIN (ANALYZE, COSTS OFF) {}").format(query)))
            assert "Partial Aggregate" in plan and "Workers Launched: 2" in plan, plan
            parallel = conn.execute(query).fetchone()[0]
            hashes, keys = zip(*conn.execute(sql.SQL("SELECT h, k FROM {}").format(table)))
            assert len(hashes) == 200000 and parallel == _chunk_digests_in_python(list(hashes), list(keys))
            assert conn.execute(sql.SQL("{} WHERE false").format(query)).fetchone()[0] == b""
    finally:
        conn.execute(sql.SQL("DROP TABLE {}").format(table))


def test_chunk_digests_refuse_a_null_hash_or_key_in_one_line(servers):
    import psycopg

    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="NULL row hash: a row hash is never NULL"):
        servers[0].execute("SELECT gp_dist.chunk_digests(h, 0) FROM (VALUES (1::bigint), (NULL)) v(h)")
    servers[0].rollback()
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="NULL key: give the key column, or 0 for a table"):
        servers[0].execute("SELECT gp_dist.chunk_digests(1, k) FROM (VALUES (1::bigint), (NULL)) v(k)")
    servers[0].rollback()



def _folded_alike(value):
    """Another 64-bit value, from 0 to 2**61, that ``hashint8extended`` folds to the same
    32 bits as ``value`` (the low half XOR the high half, or its complement below zero)."""
    low, high = value & 0xFFFFFFFF, (value >> 32) & 0xFFFFFFFF
    folded = low ^ (high if value >= 0 else ~high & 0xFFFFFFFF)
    other_high = (high + 1) & 0x1FFFFFFF
    return (other_high << 32) | (folded ^ other_high)


# A 64-bit type, and its value given as microseconds or as the integer itself.
_SIXTY_FOUR_BITS = {
    "bigint": "%s::bigint",
    "timestamp with time zone": "'2000-01-01 00:00:00+00'::timestamptz + (%s || ' microseconds')::interval",
    "timestamp without time zone": "'2000-01-01 00:00:00'::timestamp + (%s || ' microseconds')::interval",
}


@given(kind=st.sampled_from(sorted(_SIXTY_FOUR_BITS)), value=st.integers(-(2**63), 2**63 - 1))
@settings(max_examples=60, deadline=None)
def test_the_record_hash_tells_apart_64_bit_values_that_their_own_hashes_fold_alike(servers, kind, value):
    from gpcdc_toolkit.cluster._cluster import Table
    from gpcdc_toolkit.validate._checksum import RECORD_32, _row_hash

    if kind != "bigint":
        value %= 2**61  # within a timestamp's range
    other = _folded_alike(value)
    info = Table("t", ("v",), (kind,), (), ())

    def hashed(form, v):
        query = sql.SQL("SELECT {} FROM (SELECT " + _SIXTY_FOUR_BITS[kind] + " AS v) t").format(_row_hash(info, form))
        return servers[0].execute(query, (str(v),)).fetchone()[0]

    assert value != other
    assert hashed(RECORD_32, value) == hashed(RECORD_32, other)  # what the form of before could not tell apart
    assert hashed("record", value) != hashed("record", other), (kind, value, other)


def test_a_sync_point_record_names_its_row_hash_and_a_record_of_before_is_checked_by_the_form_of_then():
    from gpcdc_toolkit.errors import GpcdcError
    from gpcdc_toolkit.validate._checksum import RECORD_32
    from gpcdc_toolkit.validate._recorded import SyncPointRecord, TableDigest

    table = TableDigest('"T x"', ("public", "T x"), ("id",), ("bigint",), ("id",), 3, 2**64 - 1)
    for form, name in (("record", "record-2"), ("text", "text"), (RECORD_32, "record")):
        data = SyncPointRecord(7, "2026-11-28T00:00:00+00:00", form, (table,)).to_json()
        assert data["hash"] == name
        assert SyncPointRecord.from_json(data).row_hash == form
    with pytest.raises(GpcdcError) as raised:
        SyncPointRecord.from_json({**data, "hash": "md5"})
    assert "\n" not in str(raised.value) and "'md5', which this version does not know" in str(raised.value)


def test_the_record_hash_of_300000_rows_keeps_64_bits_where_the_form_of_before_kept_32(servers):
    """Each row's hash is hashed again before it is summed: at 64 bits, 300,000 distinct
    rows have 300,000 distinct hashes; folded to 32 bits, some ten pairs would collide."""
    from gpcdc_toolkit.cluster._cluster import Table
    from gpcdc_toolkit.validate._checksum import RECORD_32, _row_hash

    info = Table("t", ("v",), ("integer",), (), ())

    def distinct(form):
        query = sql.SQL("SELECT count(DISTINCT {}) FROM generate_series(1, 300000) AS t(v)").format(_row_hash(info, form))
        return servers[0].execute(query).fetchone()[0]

    assert distinct(RECORD_32) < 300000  # what the test would miss if the rehash still folded
    assert distinct("record") == 300000


def _record_hash_of_before(columns, types):
    """The record form as the toolkit computed it before sync points' records said
    "record-2" (they said "record"), written out as it was: a change to ``RECORD_32``
    that would check such records by another hash shows here."""
    as_is = ("smallint", "integer", "bigint", "boolean", "date", "uuid", "bytea", "timestamp without time zone",
             "timestamp with time zone")

    def column(name, type_name):
        base = type_name.split("(")[0]
        if base in as_is:
            return sql.Identifier(name)
        if base in ("text", "character varying"):
            return sql.SQL('{} COLLATE "C"').format(sql.Identifier(name))
        return sql.SQL("{}::text").format(sql.Identifier(name))

    return sql.SQL("hashint8extended(hash_record_extended(ROW({}), 0), 0)").format(
        sql.SQL(", ").join(column(c, t) for c, t in zip(columns, types)))


# Columns of the types the form of before hashed each way, named as the catalog names them.
_ROW_OF_BEFORE = [
    ("bigint", TYPES[0][1]),
    ("smallint", dict(TYPES)["smallint"]),
    ("integer", st.integers(-(2**31), 2**31 - 1).map(str)),
    ("date", dict(TYPES)["date"]),
    ("bytea", dict(TYPES)["bytea"]),
    ("timestamp with time zone", dict(TYPES)["timestamptz"]),
    ("timestamp without time zone", st.sampled_from(["2024-01-01 00:00:00", "2024-01-01 00:00:00.5", "infinity"])),
    ("timestamp(3) with time zone", dict(TYPES)["timestamptz"]),
    ("text", dict(TYPES)["text"]),
    ("character varying(12)", _text),
    ("numeric", dict(TYPES)["numeric"]),
    ("uuid", dict(TYPES)["uuid"]),
    ("jsonb", dict(TYPES)["jsonb"]),
    ("boolean", dict(TYPES)["boolean"]),
    ("integer[]", dict(TYPES)["int[]"]),
]


@given(values=st.tuples(*(st.none() | values for _type, values in _ROW_OF_BEFORE)))
@settings(max_examples=60, deadline=None)
def test_records_of_before_are_checked_by_the_hash_they_were_written_with(servers, values):
    from gpcdc_toolkit.cluster._cluster import Table
    from gpcdc_toolkit.validate._checksum import RECORD_32, _row_hash

    types = tuple(t for t, _values in _ROW_OF_BEFORE)
    columns = tuple(f'c "{i}" {t}' for i, t in enumerate(types))  # names to be quoted
    info = Table("t", columns, types, (), ())
    row = sql.SQL(", ").join(sql.SQL("{}::{} AS {}").format(sql.Literal(v), sql.SQL(t), sql.Identifier(c))
                             for v, t, c in zip(values, types, columns))
    query = sql.SQL("SELECT {}, {} FROM (SELECT {}) t").format(
        _row_hash(info, RECORD_32), _record_hash_of_before(columns, types), row)
    now, then = servers[0].execute(query).fetchone()
    assert now == then
