"""The text capture decodes values into does not follow the settings of the capture
host, the role or the database: the same WAL always decodes to the same text."""

import datetime as dt
import uuid

import psycopg2
import psycopg2.extras

from gpcdc_toolkit.bootstrap import InitialSnapshot, Pipeline, bootstrap, drop_slots
from gpcdc_toolkit.capture._worker import pin_decoding_settings
from gpcdc_toolkit.cluster import Session
from gpcdc_toolkit.protocol import DECODING_SETTINGS


def test_a_replication_session_decodes_with_the_pinned_settings_whatever_the_host_sets(source, monkeypatch):
    # What a capture host's environment could hold: libpq reads it at every connection.
    monkeypatch.setenv("PGTZ", "Asia/Tokyo")
    monkeypatch.setenv("PGDATESTYLE", "SQL, DMY")
    monkeypatch.setenv("PGOPTIONS", "-c IntervalStyle=sql_standard -c extra_float_digits=0 -c bytea_output=escape")
    conn = psycopg2.connect(source.dsn(source.nodes[1]), connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        cur = conn.cursor()

        def shown() -> dict[str, str]:
            out = {}
            for name in DECODING_SETTINGS:
                cur.execute(f"SHOW {name}")
                out[name] = cur.fetchone()[0]
            return out

        assert shown() != DECODING_SETTINGS  # the host's settings reach the session
        pin_decoding_settings(cur)
        assert shown() == DECODING_SETTINGS
    finally:
        conn.close()


def test_the_initial_snapshot_holds_the_streams_text_whatever_the_host_sets(source, work_dir, monkeypatch):
    """Its rows are read back as the stream's are (:func:`convert`): a date written as
    'SQL, DMY' would go to the target as another day, a float of extra_float_digits = 0
    rounded, an interval or a time in another style as other text."""
    suffix = uuid.uuid4().hex[:8]
    pipeline = Pipeline(work_dir, f"t{suffix}")
    table = f'public."Text Settings {suffix}"'
    with Session(source) as session:
        session.ddl(f"CREATE TABLE {table} (id int PRIMARY KEY, d date, t timestamptz, i interval, f float8, b bytea) "
                    "DISTRIBUTED BY (id)")
        with session.transaction() as tx:
            tx.insert(table, [{"id": 1, "d": dt.date(2026, 12, 5), "t": dt.datetime(2026, 12, 5, 1, 2, 3, 456789, dt.UTC),
                               "i": dt.timedelta(days=400, seconds=3723, microseconds=500000), "f": 0.1 + 0.2,
                               "b": b"\x01A\\"}])
    try:
        with monkeypatch.context() as host:  # what a host's environment could hold: libpq reads it at each connection
            host.setenv("PGTZ", "Asia/Kolkata")
            host.setenv("PGDATESTYLE", "SQL, DMY")
            host.setenv("PGOPTIONS", "-c IntervalStyle=sql_standard -c extra_float_digits=0 -c bytea_output=escape")
            bootstrap(source, pipeline, "snapshot")
        rows = list(InitialSnapshot(pipeline.snapshot_dir).rows(table))
    finally:
        drop_slots(source, pipeline.slot, publication=pipeline.publication)
    assert rows == [(1, "2026-12-05", "2026-12-05 01:02:03.456789+00", "400 days 01:02:03.5", 0.1 + 0.2, "\\x01415c")]
