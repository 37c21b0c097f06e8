"""The text capture decodes values into does not follow the settings of the capture
host, the role or the database: the same WAL always decodes to the same text."""

import psycopg2
import psycopg2.extras

from gpcdc_toolkit.capture._worker import DECODING_SETTINGS, pin_decoding_settings


def test_a_replication_session_decodes_with_the_pinned_settings_whatever_the_host_sets(source, monkeypatch):
    # What a capture host's environment could hold: libpq reads it at every connection.
    monkeypatch.setenv("PGTZ", "Asia/Tokyo")
    monkeypatch.setenv("PGDATESTYLE", "SQL, DMY")
    monkeypatch.setenv("PGOPTIONS", "-c IntervalStyle=sql_standard -c extra_float_digits=0")
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
