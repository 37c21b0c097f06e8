"""Which DDL from the stream the replayer runs on a target (no servers)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpcdc_toolkit.replay import APPLIED, STATE, DdlRefused, check_ddl
from gpcdc_toolkit.replay._ddl_policy import SYSTEM_SCHEMAS, locked_relations

RESERVED = frozenset({APPLIED, STATE})

CARRIED = [
    ("CREATE TABLE t (id int PRIMARY KEY, x text CHECK (length(x) > 0)) DISTRIBUTED BY (id)", "CREATE TABLE"),
    ('CREATE TABLE "Sales Data"."Line ""Items""" (id int PRIMARY KEY) DISTRIBUTED BY (id)', "CREATE TABLE"),
    ("CREATE TABLE t (id int PRIMARY KEY, at timestamptz DEFAULT now()) DISTRIBUTED BY (id)", "CREATE TABLE"),
    ("ALTER TABLE t ADD COLUMN c int DEFAULT 7", "ALTER TABLE ADD COLUMN"),
    ("ALTER TABLE t ADD COLUMN c numeric DEFAULT -1.5", "ALTER TABLE ADD COLUMN"),
    ("ALTER TABLE t ADD COLUMN c int[] DEFAULT ARRAY[1, 2]", "ALTER TABLE ADD COLUMN"),
    ("ALTER TABLE t ADD COLUMN c text", "ALTER TABLE ADD COLUMN"),
    ("ALTER TABLE t ADD COLUMN now text", "ALTER TABLE ADD COLUMN"),
    ("ALTER TABLE t ADD COLUMN g int GENERATED ALWAYS AS (id * 3) STORED", "ALTER TABLE ADD COLUMN"),
    ("ALTER TABLE t ALTER COLUMN v TYPE bigint USING v * 2 + 1", "ALTER TABLE ALTER COLUMN TYPE"),
    ("ALTER TABLE t ALTER COLUMN v TYPE text USING upper(v::text)", "ALTER TABLE ALTER COLUMN TYPE"),
    ("ALTER TABLE t ALTER COLUMN v SET DEFAULT now()", "ALTER TABLE SET/DROP DEFAULT"),
    ("ALTER TABLE t DROP COLUMN c, ALTER COLUMN v SET NOT NULL", "ALTER TABLE DROP COLUMN, SET NOT NULL"),
    ("ALTER TABLE t REPLICA IDENTITY FULL", "ALTER TABLE REPLICA IDENTITY"),
    ("ALTER TABLE t RENAME COLUMN a TO b", "RENAME COLUMN"),
    ('ALTER TABLE "Order Items" RENAME TO "Order Lines"', "RENAME TABLE"),
    ("CREATE INDEX i ON t (lower(x)) WHERE n > 0", "CREATE INDEX"),
    ("DROP INDEX s.i", "DROP INDEX"),
    ("CREATE TYPE mood AS ENUM ('sad', 'ok')", "CREATE TYPE"),
    ("ALTER TYPE mood ADD VALUE 'happy'", "ALTER TYPE ADD VALUE"),
    ("CREATE TYPE pair AS (a int, b text)", "CREATE TYPE"),
    ("CREATE DOMAIN posint AS int CHECK (VALUE > 0)", "CREATE DOMAIN"),
    ('CREATE SCHEMA IF NOT EXISTS "Sales Data"', "CREATE SCHEMA"),
    ("ALTER TYPE mood RENAME VALUE 'sad' TO 'blue'", "ALTER TYPE RENAME VALUE"),
    ("CREATE DOMAIN posint AS int DEFAULT 1 CHECK (VALUE > 0)", "CREATE DOMAIN"),
    ("ALTER TABLE c ADD CONSTRAINT fk FOREIGN KEY (p) REFERENCES parent (id) ON DELETE RESTRICT",
     "ALTER TABLE ADD CONSTRAINT"),
]

REFUSED = [
    ("DROP TABLE wl_accounts", "DROP TABLE is not replayed"),
    ("TRUNCATE wl_accounts", "TruncateStmt"),
    ("ALTER TABLE t ADD COLUMN c int; DROP TABLE z", "2 statements"),
    ("ALTER TABLE t ADD COLUMN c timestamptz DEFAULT now()", "calls now()"),
    ("ALTER TABLE t ADD COLUMN c timestamptz DEFAULT clock_timestamp()", "calls clock_timestamp()"),
    ("ALTER TABLE t ADD COLUMN c timestamptz DEFAULT CURRENT_TIMESTAMP", "CURRENT TIMESTAMP"),
    ("ALTER TABLE t ADD COLUMN c timestamptz DEFAULT 'now'", "'now'"),
    ("ALTER TABLE t ADD COLUMN c date DEFAULT 'today'::date", "'today'"),
    ("ALTER TABLE t ADD COLUMN c float DEFAULT random()", "calls random()"),
    ("ALTER TABLE t ADD COLUMN c bigint DEFAULT nextval('s')", "calls nextval()"),
    ("ALTER TABLE t ADD COLUMN c int DEFAULT (SELECT 1)", "SubLink"),
    ("ALTER TABLE t ADD COLUMN id serial", "added as serial"),
    ("ALTER TABLE t ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY", "identity"),
    ("ALTER TABLE t ALTER COLUMN v TYPE int USING (random() * 10)::int", "calls random()"),
    ("ALTER TABLE t ADD CONSTRAINT k CHECK (pg_terminate_backend(1))", "calls pg_terminate_backend()"),
    ("ALTER TABLE t OWNER TO mallory", "ChangeOwner"),
    ("ALTER TABLE gp_dist.gp_segment_configuration ADD COLUMN x int", "system schema"),
    ("CREATE INDEX i ON pg_catalog.pg_class (relname)", "system schema"),
    (f"ALTER TABLE {STATE} ADD COLUMN x int", "the replayer's own tables"),
    (f"DROP INDEX {APPLIED}_pkey", "the replayer's own tables"),
    ("CREATE TEMP TABLE t (id int PRIMARY KEY)", "TEMPORARY"),
    ("CREATE TABLE t AS SELECT 1 DISTRIBUTED BY (x)", "CreateTableAsStmt"),
    ("CREATE TABLE t (id int) DISTRIBUTED RANDOMLY", "DISTRIBUTED RANDOMLY"),
    ("CREATE FUNCTION f() RETURNS int AS $$ SELECT 1 $$ LANGUAGE sql", "CreateFunctionStmt"),
    ("GRANT ALL ON t TO mallory", "GrantStmt"),
    ("COPY t TO PROGRAM 'rm -rf /'", "CopyStmt"),
    ("SELECT pg_terminate_backend(1)", "SelectStmt"),
    ("DO $$ BEGIN PERFORM 1; END $$", "DoStmt"),
    ("ALTER TABLE t ADD COLUMN c int DEFAULT 1 -- ; DROP TABLE t", None),  # a comment: one statement, carried
    ("CREATE DOMAIN d AS timestamptz DEFAULT now()", "the domain's default calls now()"),
    ("ALTER TABLE child ADD CONSTRAINT fk FOREIGN KEY (pid) REFERENCES parent (id) ON DELETE SET DEFAULT",
     "ON UPDATE/DELETE SET DEFAULT"),
    ("CREATE TABLE c (id int PRIMARY KEY, p int REFERENCES parent ON DELETE CASCADE) DISTRIBUTED BY (id)",
     "ON UPDATE/DELETE CASCADE"),
    ("ALTER TABLE t ADD COLUMN c timestamptz DEFAULT ('n' || 'ow')::timestamptz", "must be a literal"),
    ("ALTER TABLE t ADD COLUMN c timestamptz DEFAULT 'tomorrow 10:00'", "'tomorrow 10:00'"),
    ("ALTER TABLE t ADD COLUMN c oid DEFAULT 't'::regclass", "casts to regclass"),
    ("ALTER TABLE t ALTER COLUMN a TYPE int USING a::regclass::oid::int", "casts to regclass"),
    (f"ALTER TABLE t RENAME TO {STATE}", "the replayer's own tables"),
    ("ALTER TABLE (", "does not parse"),
    ("", "0 statements"),
]


@pytest.mark.parametrize("statement, kind", CARRIED)
def test_carried(statement, kind):
    checked = check_ddl(statement, reserved=RESERVED)
    assert checked.kind == kind and checked.statement == statement


@pytest.mark.parametrize("statement, reason", REFUSED)
def test_refused(statement, reason):
    if reason is None:
        assert check_ddl(statement, reserved=RESERVED).kind == "ALTER TABLE ADD COLUMN"
        return
    with pytest.raises(DdlRefused, match=None) as refused:
        check_ddl(statement, reserved=RESERVED)
    assert reason in str(refused.value) and "\n" not in str(refused.value)


def quote(name):
    return '"' + name.replace('"', '""') + '"'


# Within PostgreSQL's 63 bytes: longer names are cut, by the parser as by the server.
names = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=30).filter(
    lambda n: len(n.encode()) <= 63 and not n.startswith("pg_") and not n.startswith(tuple(RESERVED)))


@given(schema=names, table=names, column=names)
def test_names_come_back_exactly_as_quoted(schema, table, column):
    statement = f"ALTER TABLE {quote(schema)}.{quote(table)} ADD COLUMN {quote(column)} int DEFAULT 0"
    if schema in SYSTEM_SCHEMAS:
        with pytest.raises(DdlRefused, match="system schema"):
            check_ddl(statement, reserved=RESERVED)
        return
    assert check_ddl(statement, reserved=RESERVED).names == ((schema, table),)


@given(table=names, tail=st.sampled_from(["DROP TABLE x", "SELECT 1", "GRANT ALL ON t TO m", "COMMIT"]))
def test_a_second_statement_behind_an_allowed_one_is_refused(table, tail):
    with pytest.raises(DdlRefused, match="2 statements"):
        check_ddl(f"ALTER TABLE {quote(table)} ADD COLUMN c int; {tail}", reserved=RESERVED)


@given(table=names)
def test_dropping_any_table_is_refused(table):
    with pytest.raises(DdlRefused, match="DROP TABLE"):
        check_ddl(f"DROP TABLE {quote(table)}", reserved=RESERVED)


@pytest.mark.parametrize("statement,locked", [
    ("ALTER TABLE wl_events ADD COLUMN x int", [(None, "wl_events")]),
    ('ALTER TABLE "S p"."T" RENAME TO u', [("S p", "T")]),
    ("DROP TABLE a, s.b", [(None, "a"), ("s", "b")]),
    ("TRUNCATE t1, t2", [(None, "t1"), (None, "t2")]),
    ("CREATE INDEX ON t (a)", [(None, "t")]),
    ("CREATE TABLE n (LIKE t) DISTRIBUTED BY (id)", [(None, "n")]),
    ("CREATE INDEX CONCURRENTLY ON t (a)", []),
    ("CREATE VIEW v AS SELECT * FROM t", []),
    ("COMMENT ON TABLE t IS 'x'", []),
    ("GRANT SELECT ON t TO public", []),
    ("not sql (", []),
])
def test_the_tables_a_statement_locks_against_writers(statement, locked):
    assert list(locked_relations(statement)) == locked
