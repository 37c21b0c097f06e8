"""Property: whatever the schema and the transactions, snapshot plus replay equals the source.

Hypothesis draws schemas (quoted names, case twins, names that are keywords or hold
``%`` as psycopg's placeholders do, a table without a key), values of many types (NULL and '', NaN, infinities, -0, bytes with
NUL, text that looks like the protocol's markers, emoji and right-to-left text),
transactions (inserts, updates, deletes, distribution-key moves) and DDL between them;
the pipeline runs on real servers, and each table's rows, compared as PostgreSQL's
text of each row, must be the same on the target as on the source, each on the
segment the target's distribution names; on a plain PostgreSQL or (marked citus) a
Citus target too, where the validation must find the tables equal.

CI runs a few examples; a longer run: ``GPCDC_PROPERTY_EXAMPLES=50
GPCDC_PROPERTY_SEED=7 ./dev test tests/test_replay_property.py`` (``GPCDC_PROPERTY_SHRINK=1``
to shrink a failure to a small example).
"""

import datetime as dt
import os
import uuid
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

from gpcdc_toolkit.bootstrap import Pipeline, bootstrap, drop_slots
from gpcdc_toolkit.capture import CaptureGroup, wait_until_acknowledged
from gpcdc_toolkit.cluster import Session, segment_for
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.replay import Replayer
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.validate._checksum import compare_checksums

from .conftest import TARGETS

EXAMPLES = int(os.environ.get("GPCDC_PROPERTY_EXAMPLES", "3"))
SEED = int(os.environ.get("GPCDC_PROPERTY_SEED", "20261123"))

NAMES = ["Order Items", "Acct", "acct", "select", 'we"ird', "ünï cödé", "a.b", "x-y z", "ORDER", "שלום", "a%%b", "50% off",
         "p%s", "%(x)s"]
MARKERS = ["__gpcdc_unchanged_toast__", "UNCHANGED_TOAST", '{"resolved": 1}', "BEGIN", "\\N", "", " ", "'; DROP TABLE x; --"]
TEXT = st.one_of(st.sampled_from(MARKERS), st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40),
                 st.sampled_from(["😀🚀", "مرحبا بالعالم", "x" * 3000]))

# type -> strategy of Python values psycopg writes as that type
TYPES = {
    "text": TEXT,
    "bytea": st.binary(max_size=40).map(lambda b: b + b"\x00" if b else b),
    "numeric(38,10)": st.one_of(st.decimals(min_value=-10**20, max_value=10**20, places=10,
                                            allow_nan=False, allow_infinity=False), st.just(Decimal("NaN"))),
    "float8": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.just(-0.0)),
    "timestamptz": st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30),
                                timezones=st.just(dt.UTC)),
    "date": st.dates(),
    "jsonb": st.recursive(st.none() | st.booleans() | st.integers(-10**9, 10**9) | TEXT,
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                          max_leaves=6).map(Jsonb),
    "int[]": st.lists(st.one_of(st.none(), st.integers(-2**31, 2**31 - 1)), max_size=4),
    "boolean": st.booleans(),
    "bigint": st.integers(-2**63, 2**63 - 1),
    "int": st.integers(-2**31, 2**31 - 1),
}
KEY_TYPES = {"bigint": st.integers(-2**40, 2**40), "text": TEXT.filter(lambda t: len(t) < 100)}


def ident(*parts):
    return sql.Identifier(*parts).as_string(None)


@st.composite
def schemas(draw, tag):
    """Two or three tables: (name, key column and type or None, [(column, type)])."""
    names = draw(st.lists(st.sampled_from(NAMES), min_size=2, max_size=3, unique=True))
    tables = []
    for i, name in enumerate(names):
        keyless = i == 0 and draw(st.booleans())
        columns = draw(st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=4))
        key_type = None if keyless else draw(st.sampled_from(sorted(KEY_TYPES)))
        # psycopg reads a % in a statement run with parameters as a placeholder, in quotes too.
        percent = [draw(st.sampled_from(["", "%", "%s", "%%"])) for _ in columns]
        tables.append((f"{name} {tag}", key_type, [(f"C{j}{p} {t}", t) for j, (t, p) in enumerate(zip(columns, percent))]))
    return tables


def row_values(draw, columns):
    return {c: draw(st.one_of(st.none(), TYPES[t])) for c, t in columns}


def table_texts(cluster, name):
    """Each row as PostgreSQL's text of it (from every segment, or at a front door)."""
    query = sql.SQL("SELECT t::text FROM {} AS t").format(sql.Identifier("public", name))
    return sorted(r[0] for r in cluster.fetch_all(query))


# Shrinking a failure costs minutes of pipelines: asked for, not by default.
PHASES = list(Phase) if os.environ.get("GPCDC_PROPERTY_SHRINK") else [Phase.explicit, Phase.generate]


@pytest.mark.parametrize("flavour", TARGETS)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None, phases=PHASES)
@seed(SEED)
@given(data=st.data())
def test_snapshot_plus_replay_equals_the_source(source, broker, work_dir, flavour, data):
    tag = uuid.uuid4().hex[:6]
    tables = data.draw(schemas(tag), label="tables")
    target = Sandbox(f"prop-{tag}", work_dir).up(segments=2, flavour=flavour)
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"p{tag}", "source.sandbox": "source", "target.sandbox": target.name},
                         environ={})
    pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
    group = CaptureGroup(config.with_settings({"capture.heartbeat_interval": 0.3}))
    keys = {name: [] for name, _k, _c in tables}  # live keys (keyed tables) or rows (keyless)
    try:
        with Session(source) as session:
            for name, key_type, columns in tables:
                body = ", ".join([f"id {key_type} PRIMARY KEY"] if key_type else ["id bigint"])
                body += "".join(f", {ident(c)} {t}" for c, t in columns)
                session.ddl(f"CREATE TABLE {ident('public', name)} ({body}) DISTRIBUTED BY (id)")
                if key_type is None:
                    session.ddl(f"ALTER TABLE {ident('public', name)} REPLICA IDENTITY FULL")

            def transaction(count):
                with session.transaction() as tx:
                    for _ in range(count):
                        name, key_type, columns = data.draw(st.sampled_from(tables), label="table")
                        live = keys[name]
                        action = data.draw(st.sampled_from(["insert", "update", "delete", "move"]) if live
                                           else st.just("insert"), label="action")
                        table = ("public", name)
                        if action == "insert":
                            strategy = KEY_TYPES[key_type] if key_type else st.integers(0, 5)
                            key = data.draw(strategy.filter(lambda k, t=key_type, live=live: t is None or k not in live),
                                            label="key")
                            row = {"id": key, **row_values(data.draw, columns)}
                            tx.insert(table, [row])
                            live.append(key)
                        elif key_type is None:
                            continue  # keyless rows change by ctid in the tests of twins; here they only grow
                        else:
                            key = data.draw(st.sampled_from(live), label="row")
                            if action == "delete":
                                tx.delete(table, {"id": key})
                                live.remove(key)
                            elif action == "update":
                                changed = data.draw(st.lists(st.sampled_from(columns), min_size=1, unique=True),
                                                    label="columns")
                                tx.update(table, {"id": key}, row_values(data.draw, changed))
                            else:
                                new = data.draw(KEY_TYPES[key_type].filter(lambda k, live=live: k not in live),
                                                label="new key")
                                tx.update(table, {"id": key}, {"id": new})
                                live[live.index(key)] = new

            for _ in range(data.draw(st.integers(0, 3), label="before")):
                transaction(data.draw(st.integers(1, 4)))
            bootstrap(source, pipeline, "snapshot")
            group.start()
            for step in range(data.draw(st.integers(2, 8), label="after")):
                if data.draw(st.integers(0, 4), label="ddl?") == 0:
                    name, key_type, columns = data.draw(st.sampled_from(tables), label="ddl table")
                    column = (f"N{step}{'%s' if step % 2 else ''} {tag}", data.draw(st.sampled_from(["int", "text"])))
                    default = "7" if column[1] == "int" else "'__gpcdc_unchanged_toast__'"
                    session.ddl(f"ALTER TABLE {ident('public', name)} ADD COLUMN {ident(column[0])} {column[1]} "
                                f"DEFAULT {default}")
                    columns.append(column)
                else:
                    transaction(data.draw(st.integers(1, 6)))
        wait_until_acknowledged(source, pipeline.slot)
        with Replayer(config) as replayer:
            done = replayer.run()
        assert done.pending == 0
        target_cluster = target.cluster()
        for name, _key_type, _columns in tables:
            assert table_texts(target_cluster, name) == table_texts(source, name), f"{name} differs"
            if flavour == "greenplum":
                routed = target_cluster.rows_by_segment(("public", name))
                for segment, rows in routed.items():
                    assert all(segment_for([row[0]], target_cluster.segment_count) == segment for row in rows)
            else:  # equal by the validation too, placement checked by the door's own rule
                result = compare_checksums(source, target_cluster, ("public", name))
                assert result.equal and result.diff.misplaced == 0, result.diff.examples
    finally:
        group.stop()
        drop_slots(source, pipeline.slot, publication=pipeline.publication)
        target.down(remove=True)
