"""The gpcdc command line, run as a user runs it."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


def gpcdc(work_dir: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPCDC_")}
    return subprocess.run([sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(work_dir), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def wait_until_status_shows_kafka_away(work_dir: Path, status: list[str], timeout: float = 60) -> None:
    """Poll `gpcdc status` until it says the workers cannot deliver (exit 3)."""
    deadline = time.monotonic() + timeout
    while True:
        shown = gpcdc(work_dir, *status)
        if shown.returncode == 3 and ("waiting for Kafka" in shown.stderr or "reconnecting" in shown.stderr):
            return
        assert time.monotonic() < deadline, shown.stderr


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("gpcdc: error: ")
    return lines[0]


def test_sandbox_lifecycle(work_dir):
    up = gpcdc(work_dir, "sandbox", "up", "--name", "cli", "--segments", "2")
    try:
        assert up.returncode == 0, up.stderr
        assert "sandbox 'cli' is up" in up.stdout
        status = gpcdc(work_dir, "sandbox", "status", "--name", "cli")
        assert status.returncode == 0 and status.stdout.count("running (pid") == 3
    finally:
        down = gpcdc(work_dir, "sandbox", "down", "--name", "cli", "--remove")
    assert down.returncode == 0, down.stderr
    assert not (work_dir / "sandboxes" / "cli").exists()


@pytest.mark.parametrize("args,message", [
    (["sandbox", "status", "--name", "ghost"], "no sandbox named 'ghost'"),
    (["--source-dsn", "host=127.0.0.1 port=1 user=x", "workload", "--duration", "1"], "cannot reach coordinator 127.0.0.1:1"),
    (["workload", "--update-share", "1.5"], "invalid workload: update_share must be between 0 and 1"),
    (["workload", "--duration", "-5"], "invalid workload: duration must be a positive number of seconds, not -5"),
    (["workload", "--duration", "nan"], "invalid workload: duration must be a positive number of seconds, not nan"),
    (["workload", "--transactions", "-1"], "invalid workload: transactions must be at least 1, not -1"),
    (["workload", "--hot-keys", "-2"], "invalid workload: hot_keys must not be negative, not -2"),
    (["--source-dsn", "h=1", "--source-sandbox", "s", "workload"], "both a DSN"),
    (["--config", "/nonexistent.toml", "workload"], "cannot read config file /nonexistent.toml"),
    (["--kafka-bootstrap-servers", "127.0.0.1:1", "broker", "status"], "no Kafka broker answers at 127.0.0.1:1"),
    (["audit", "--from", "9" * 23], "is not epoch milliseconds of a time a stream can hold"),
    (["syncpoint", "--hold", "nan"], "--hold nan is not a number of seconds: give the seconds to hold, or 0"),
    (["syncpoint", "--hold", "-1"], "--hold -1 is not a number of seconds"),
    (["replay", "--skip-ddl", "-1"], "'-1' is not a gxid"),
    (["replay", "--skip-ddl", "0"], "'0' is not a gxid"),
])
def test_errors_are_one_line_with_a_non_zero_exit(work_dir, args, message):
    assert message in one_line_error(gpcdc(work_dir, *args, timeout=60))


def test_a_sync_point_looked_up_in_an_archive_that_is_not_there_is_not_looked_up_elsewhere(work_dir):
    done = gpcdc(work_dir, "validate", "--against-syncpoint", "5", "--archive", str(work_dir / "nowhere"), timeout=60)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"gpcdc: validate could not run: archive {work_dir / 'nowhere'} does not exist: give the directory "
        "`gpcdc archive --to` wrote"], done.stderr


def test_a_kafka_client_setting_librdkafka_refuses_is_a_configuration_error_even_for_broker_status(work_dir):
    """`broker status` connects as the pipeline does, with [kafka.client]: a broker that
    answers a plain client is not said to answer one the pipeline cannot configure."""
    path = work_dir / "bogus-client.toml"
    path.write_text('[kafka.client]\n"security.protocol" = "bogus"\n')
    done = gpcdc(work_dir, "--config", str(path), "--kafka-bootstrap-servers", "127.0.0.1:1", "broker", "status",
                 timeout=60)
    assert done.returncode == 2
    assert 'Kafka: Invalid value "bogus" for configuration property "security.protocol": correct [kafka.client] ' \
           "in the config file" in one_line_error(done)


def test_a_validation_closes_every_connection_and_file_it_opened(source, work_dir, monkeypatch, capsys):
    """The program ends without the interpreter's last collection (`cli.run`), which
    would have closed what a command left open in a reference cycle: a command closes
    what it opens. A validation with a suite for great-expectations, in this process,
    the collector held off: no connection or file of its own is still open after it."""
    import gc
    import io
    import json
    import uuid

    import psycopg

    from gpcdc_toolkit.cli import main
    from gpcdc_toolkit.cluster import Session

    for name in [k for k in os.environ if k.startswith("GPCDC_")]:
        monkeypatch.delenv(name)
    table = f"closed_{uuid.uuid4().hex[:6]}"
    suites = work_dir / f"suites-{table}"
    suites.mkdir()
    (suites / "values.json").write_text(json.dumps({
        "name": "values", "meta": {"gpcdc": {"frame": "target", "table": f"public.{table}"}},
        "expectations": [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "v"}}]}))
    with Session(source) as session:
        session.ddl(f"CREATE TABLE {table} (id int PRIMARY KEY, v text) DISTRIBUTED BY (id)")
        with session.transaction() as tx:
            tx.insert(table, [{"id": i, "v": str(i)} for i in range(50)])

    def still_open() -> dict[int, object]:
        return {id(o): o for o in gc.get_objects() if isinstance(o, (psycopg.Connection, io.IOBase))
                and not isinstance(o, (io.BytesIO, io.StringIO)) and not o.closed}  # those two hold no resource

    try:
        gc.collect()
        before = still_open()
        gc.disable()  # what the command leaves in cycles stays there to be seen
        try:
            status = main(["--work-dir", str(work_dir), "--source-sandbox", "source", "--target-sandbox", "source",
                           "--validate-expectations-dir", str(suites), "validate", "--no-syncpoint", "--tables", table])
            left = [repr(o) for key, o in still_open().items() if key not in before]
        finally:
            gc.enable()
        said = capsys.readouterr()
        assert status == 0, said
        assert "great-expectations: 4 expectations on the target, 0 failed" in said.out, said.out
        assert left == []
    finally:
        with Session(source) as session:
            session.ddl(f"DROP TABLE {table}")
