"""Names as the toolkit writes them into SQL (``_sql.Name``): whatever a name holds
(``%`` in any of psycopg's placeholder forms, quotes, backslashes, text that looks
like PostgreSQL's own Unicode escapes), a statement run with parameters writes the
table and the columns of that name, and no other."""

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from gpcdc_toolkit._sql import Name, Quoted
from gpcdc_toolkit.sandbox import Sandbox

PIECES = st.sampled_from(["%", "%%", "%s", "%b", "%t", "%(x)s", '"', '""', "\\", "\\0025", 'U&"', "UESCAPE", " ", "é", "😀"])
NAMES = st.lists(st.one_of(PIECES, st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=4)),
                 min_size=1, max_size=6).map("".join).filter(lambda n: 0 < len(n.encode()) <= 63 and n.strip())


@pytest.fixture(scope="module")
def server(work_dir):
    sandbox = Sandbox(f"names-{uuid.uuid4().hex[:4]}", work_dir).up(flavour="postgres")
    try:
        yield sandbox.cluster()
    finally:
        sandbox.down(remove=True)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(table=NAMES, column=NAMES)
def test_a_statement_with_parameters_writes_the_table_and_column_so_named(server, table, column):
    with server.coordinator_connection() as conn:
        conn.execute(sql.SQL("CREATE TEMP TABLE {} ({} text, n int)").format(Name(table), Name(column)))
        conn.execute(sql.SQL("INSERT INTO {} ({}, n) VALUES (%s, %s)").format(Name(table), Name(column)), ["v", 1])
        found = conn.execute("SELECT c.relname, a.attname FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid "
                             "WHERE c.relnamespace = pg_my_temp_schema() AND a.attnum = 1 AND c.relname = %s",
                             [table]).fetchall()
        assert found == [(table, column)]
        read = sql.SQL("SELECT {}, n FROM {} WHERE {} = %s").format(Name(column), Name(table), Name(column))
        assert conn.execute(read, ["v"]).fetchall() == [("v", 1)]
        # As PostgreSQL quotes it itself (Citus's shard names), made free of % alike.
        quoted = conn.execute("SELECT quote_ident(%s)", [table]).fetchone()[0]
        assert "%" not in Quoted(quoted).as_string(conn) and Quoted(quoted).text == quoted
        assert conn.execute(sql.SQL("SELECT n FROM {} WHERE n = %s").format(Quoted(quoted)), [1]).fetchall() == [(1,)]
        conn.rollback()


def test_a_name_without_a_percent_sign_is_quoted_as_psycopg_quotes_it():
    for name in ["plain", 'we"ird', "Mixed Case", "a\\b"]:
        assert Name("s", name).as_string(None) == sql.Identifier("s", name).as_string(None)
    assert Name("a%b").as_string(None) == 'U&"a\\0025b"'
