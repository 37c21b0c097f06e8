import datetime as dt
import decimal
from collections import Counter

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpcdc_toolkit.cluster import jump_consistent_hash, key_hash, segment_for


def test_python_values_and_their_decoded_text_route_alike():
    # Decoded WAL gives text; the workload gives Python values. Both must agree.
    assert segment_for([42], 7) == segment_for(["42"], 7)
    assert segment_for([decimal.Decimal("1.50")], 5) == segment_for(["1.50"], 5)
    assert segment_for([dt.date(2024, 1, 2)], 5) == segment_for(["2024-01-02"], 5)
    assert segment_for([True], 5) == segment_for(["t"], 5)


def test_composite_keys_are_not_concatenations():
    assert key_hash(["1", "23"]) != key_hash(["12", "3"])
    assert key_hash([None]) != key_hash([""])


def test_segments_are_balanced():
    counts = Counter(segment_for([k], 4) for k in range(40_000))
    assert set(counts) == {0, 1, 2, 3}
    assert max(counts.values()) / min(counts.values()) < 1.1


def test_growing_the_cluster_moves_keys_only_to_the_new_segment():
    moved = 0
    for k in range(20_000):
        h = key_hash([k])
        before, after = jump_consistent_hash(h, 3), jump_consistent_hash(h, 4)
        if before != after:
            assert after == 3
            moved += 1
    assert 0.2 < moved / 20_000 < 0.3  # about a quarter, as consistent hashing promises


def test_bad_input():
    with pytest.raises(ValueError, match="at least 1 segment"):
        jump_consistent_hash(1, 0)
    with pytest.raises(TypeError, match="unsupported distribution-key type float"):
        segment_for([1.5], 3)



# The servers' routing (gp_dist.segment_of, in C) against segment_for, on the same keys:
# any text PostgreSQL holds (quotes, separators, the unit separator itself, non-ASCII),
# NULLs, composite keys, and every cluster size a sandbox has.
_value = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(st.characters(codec="utf-8", exclude_characters="\x00")),
                   st.sampled_from(["", "\x1f", "a\x1fb", "'", '"', "\\", "NULL", " "]))


@given(keys=st.lists(st.lists(_value, min_size=1, max_size=3), min_size=1, max_size=30),
       segments=st.integers(1, 256))
@settings(max_examples=60, deadline=None)
def test_the_servers_route_every_key_as_segment_for_does(source, keys, segments):
    texts = [[None if v is None else str(v) for v in key] for key in keys]
    with source.connect_node(source.segments[0]) as conn:
        routed = [conn.execute("SELECT gp_dist.segment_of(%s, VARIADIC %s::text[])", (segments, key)).fetchone()[0]
                  for key in texts]
    assert routed == [segment_for(key, segments) for key in keys]


# (type as declared, values as input text): types whose cast to text prints otherwise too.
TYPED_VALUES = [
    ("integer", ["7", "-0", "007"]), ("bigint", ["9223372036854775807"]), ("numeric", ["1.50", "NaN"]),
    ("text", ["", " a ", "NULL"]), ("character varying(5)", ["ab ", ""]), ("character(4)", ["ab", "", "abcd"]),
    ("boolean", ["true", "no", "1"]), ("inet", ["10.0.0.1", "10.0.0.1/32", "10.0.0.0/8", "::1"]),
    ("cidr", ["10.0.0.0/8"]), ("uuid", ["A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"]), ("date", ["2024-02-29"]),
    ("timestamp with time zone", ["2024-01-01 01:00:00+01"]), ("flag", ["true", "f"]),
    ("character varying(5)[]", ["{ab,NULL}", "[0:0]={x}"]), ("interval", ["P1D"]), ("float8", ["-0", "1e300"]),
]


@pytest.fixture(scope="module")
def flag_domain(source):
    with source.connect_node(source.segments[0]) as conn:
        conn.execute("DROP DOMAIN IF EXISTS flag")
        conn.execute("CREATE DOMAIN flag AS boolean")
    yield
    with source.connect_node(source.segments[0]) as conn:
        conn.execute("DROP DOMAIN flag")


@pytest.mark.parametrize(("declared", "values"), TYPED_VALUES)
def test_a_keys_text_in_sql_is_its_printed_text_as_python_routes_it(source, flag_domain, declared, values):
    """What the servers route a key by (``output_text``) is the text its type prints,
    whatever the cast to text gives; NULL stays NULL."""
    from psycopg import sql

    from gpcdc_toolkit.cluster._routing import output_text

    with source.connect_node(source.segments[0]) as conn:
        conn.execute(sql.SQL("CREATE TEMP TABLE probe (v {})").format(sql.SQL(declared)))
        printed = conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                               "WHERE attrelid = 'probe'::regclass AND attname = 'v'").fetchone()[0]
        for value in [*values, None]:
            conn.execute("TRUNCATE probe")
            conn.execute("INSERT INTO probe VALUES (%s)", (value,))
            text, output = conn.execute(sql.SQL("SELECT {}, format('%s', v) FROM probe").format(
                output_text(sql.Identifier("v"), printed))).fetchone()
            assert text == (None if value is None else output), (declared, value, text, output)


def test_the_servers_refuse_a_cluster_without_segments(source):
    with source.connect_node(source.segments[0]) as conn, pytest.raises(psycopg.errors.InvalidParameterValue,
                                                                        match="at least 1 segment, got 0"):
        conn.execute("SELECT gp_dist.segment_of(0, 'a')")


def test_a_sandbox_without_the_servers_routing_is_named_with_the_fix(source):
    """A sandbox made before the servers had the routing: its placement check stops
    in one line instead of failing on an unknown function."""
    from psycopg import sql

    from gpcdc_toolkit.cluster import Session
    from gpcdc_toolkit.errors import ClusterError

    with Session(source) as session:
        session.ddl("DROP TABLE IF EXISTS routed")
        session.ddl("CREATE TABLE routed (id int PRIMARY KEY) DISTRIBUTED BY (id)")
    info = source.table("routed")
    node = source.segments[0]
    with source.connect_node(node, autocommit=False) as conn:
        conn.execute("DROP FUNCTION gp_dist.segment_of(int, text[])")  # rolled back when the connection closes
        with pytest.raises(ClusterError) as raised:
            source.misplaced_rows(node, conn, info, sql.SQL("t.ctid"))
    message = str(raised.value)
    assert "\n" not in message and "has no gp_dist.segment_of" in message and "gpcdc sandbox down --remove" in message


@given(rows=st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), st.text(st.characters(codec="utf-8", exclude_characters="\x00"),
                                                                        max_size=8), st.integers(0, 2)),
                     max_size=25, unique_by=lambda r: (r[0], r[1])))
@settings(max_examples=15, deadline=None)
def test_each_segment_names_exactly_its_rows_that_belong_elsewhere(source, rows):
    """Rows written straight to segments, some where their composite key belongs and
    some not: each segment's own query finds exactly the others."""
    from psycopg import sql

    from gpcdc_toolkit.cluster import Session

    with Session(source) as session:
        session.ddl("DROP TABLE IF EXISTS placed")
        session.ddl('CREATE TABLE placed (id int, "Name ""x""" text, PRIMARY KEY (id, "Name ""x""")) '
                    'DISTRIBUTED BY (id, "Name ""x""")')
    info = source.table("placed")
    for node in source.segments:
        with source.connect_node(node) as conn:
            for key, name, on in rows:
                if on % source.segment_count == node.content:
                    conn.execute('INSERT INTO placed VALUES (%s, %s)', (key, name))
    found = set()
    for node in source.segments:
        with source.connect_node(node) as conn:
            found |= {(node.content, r[0], r[1]) for _relation, r in
                      source.misplaced_rows(node, conn, info, sql.SQL('t.id, t."Name ""x"""'))}
    expected = {(on % source.segment_count, key, name) for key, name, on in rows
                if segment_for([key, name], source.segment_count) != on % source.segment_count}
    assert found == expected


def test_a_sandbox_routed_by_an_older_hash_is_refused_before_any_row_is_routed(work_dir):
    """Rows placed by another hash would be updated, deleted and checked where they are
    not: such a sandbox is refused when it is opened, in one line naming the fix."""
    from gpcdc_toolkit.cluster import Cluster
    from gpcdc_toolkit.errors import ClusterError
    from gpcdc_toolkit.sandbox import Sandbox

    sandbox = Sandbox("older", work_dir).up(segments=1)
    try:
        dsn = sandbox.cluster().coordinator_dsn
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP FUNCTION gp_dist.segment_of(int, text[])")
        with pytest.raises(ClusterError) as raised:
            Cluster.connect(dsn)
        message = str(raised.value)
        assert "\n" not in message and "no gp_dist.segment_of" in message and "gpcdc sandbox down --remove" in message
    finally:
        sandbox.down(remove=True)
