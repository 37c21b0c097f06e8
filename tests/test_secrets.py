"""Passwords stay out of what others can read: error messages, process lists, the files a pipeline writes."""

import io
import re
from contextlib import redirect_stderr

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=300)
@given(st.text(alphabet="abcdefghijkXYZ0123456789!#%&*+,.:;<>?[]^_{|}~", min_size=6, max_size=16),
       st.sampled_from(["host=db password={p} bogus", "host=db password='{p}' port", "password {p} host=x",
                        "postgresql://u:{p}@db:1/x?y", "host=db port=1 password={p} dbname"]))
def test_a_malformed_dsn_is_quoted_without_its_password(password, form):
    from gpcdc_toolkit.cluster._cluster import _where
    from gpcdc_toolkit.errors import ClusterError

    dsn = form.format(p=password)
    with pytest.raises(ClusterError) as refused:
        _where(dsn)
    said = str(refused.value)
    assert "***" in said and password not in said, said
    for quoted in re.findall(r'"([^"]*)"', said):  # what libpq quotes from the DSN
        assert not any(password[i:i + 3] in quoted for i in range(len(password) - 2)), said
    assert "\n" not in str(refused.value)


def test_no_secret_in_process_lists_or_files_of_a_running_pipeline(source, source_sandbox, broker, work_dir):
    """A source DSN with a password (the sandbox trusts local connections, so any
    password connects): capture runs and reports; the password is in no process's
    command line and in no file the pipeline writes."""
    import uuid
    from pathlib import Path

    from gpcdc_toolkit.bootstrap import Pipeline, bootstrap, drop_slots
    from gpcdc_toolkit.capture import CaptureGroup, capture_status, wait_until_acknowledged
    from gpcdc_toolkit.config import load_config
    from gpcdc_toolkit.workload import WorkloadSpec, run_workload

    secret = f"Pw-{uuid.uuid4().hex}"
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"s{uuid.uuid4().hex[:8]}",
                          "source.dsn": f"{source_sandbox.dsn} password={secret}"}, environ={})
    pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
    group = CaptureGroup(config)
    try:
        bootstrap(source, pipeline, "snapshot")
        group.start()
        run_workload(source, WorkloadSpec(threads=1, transactions=20))
        wait_until_acknowledged(source, pipeline.slot)
        assert all(s.alive for s in capture_status(source, group))
        command_lines = [command_line(p) for p in Path("/proc").glob("[0-9]*/cmdline")]
        assert command_lines and not any(secret.encode() in line for line in command_lines)
        written = [p for p in pipeline.directory.rglob("*") if p.is_file()]
        written += [p for p in (work_dir / "logs").rglob("*") if p.is_file()] if (work_dir / "logs").exists() else []
        assert written and not any(secret.encode() in contents(p) for p in written)
    finally:
        group.stop()
        drop_slots(source, pipeline.slot, publication=pipeline.publication)


def command_line(path):
    try:
        return path.read_bytes()
    except OSError:  # the process ended meanwhile
        return b""


def contents(path):
    try:
        return path.read_bytes()
    except FileNotFoundError:  # a running worker's state file being replaced atomically: its ``*.tmp``
        assert path.suffix == ".tmp", f"{path} vanished"
        return b""


SECRETS = st.text(alphabet="abcdefghijkXYZ0123456789!#%&*+,.:;<>?[]^_{|}~", min_size=6, max_size=16)


@settings(max_examples=50)
@given(SECRETS, st.sampled_from(["host=db password={p}", "postgresql://u:{p}@db:1/x"]))
def test_a_flag_the_command_line_does_not_know_is_quoted_without_its_password(password, form):
    from gpcdc_toolkit.cli import main

    with pytest.raises(SystemExit) as stopped, redirect_stderr(io.StringIO()) as said:
        main(["status", "--no-such-flag", form.format(p=password)])
    assert stopped.value.code == 2
    (line,) = said.getvalue().splitlines()
    assert "unrecognized arguments: --no-such-flag" in line and "***" in line and password not in line, line


@pytest.mark.parametrize("form", ["host=127.0.0.1 port=1 user=u password={p}", "postgresql://u:{p}@127.0.0.1:1/x"])
def test_status_says_a_target_it_cannot_reach_without_its_password(source_sandbox, broker, work_dir, form):
    import subprocess
    import sys
    import uuid

    secret = f"Pw-{uuid.uuid4().hex}"
    done = subprocess.run([sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(work_dir),
                           "--kafka-bootstrap-servers", broker.bootstrap_servers, "--kafka-topic-prefix",
                           f"s{uuid.uuid4().hex[:8]}", "--target-dsn", form.format(p=secret), "status"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    said = done.stdout + done.stderr
    assert "target: dsn " in said and "not reachable now" in said and "***" in said, said
    assert secret not in said, said
    # No pipeline of that prefix: said so, rather than advising to start its capture.
    assert done.returncode == 3 and "no pipeline with topic prefix" in done.stderr, done.stderr
    assert "capture start" not in said, said


def test_status_tells_a_target_a_replay_would_refuse_from_one_it_cannot_reach(source_sandbox, broker, work_dir):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(work_dir),
                           "--kafka-bootstrap-servers", broker.bootstrap_servers, "--target-sandbox",
                           source_sandbox.name, "--target-kind", "postgres", "status"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    line = next(line for line in done.stdout.splitlines() if line.startswith("target: "))
    assert "which a replay would refuse: target is sandbox" in line and "not reachable" not in line, line
