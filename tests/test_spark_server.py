"""The work directory's Spark Connect server on a real JVM: `gpcdc spark up|down|status`,
the commands running their Spark work on it while it runs and on a session of their own
otherwise, sessions handed from one process to the next, and nothing of it left running."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gpcdc_toolkit._runtime import kill_pid, pid_alive, stop_group
from gpcdc_toolkit.archive import write_archive
from gpcdc_toolkit.capture import ensure_topics
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.connect import kafka_client_settings
from gpcdc_toolkit.ingest import SparkServer
from gpcdc_toolkit.protocol import Topics

from ._audit_stream import StreamBuilder
from .test_cli import gpcdc

# Each test starts a JVM or two of its own: a suite of its own (`./dev test-spark-server`).
pytestmark = pytest.mark.spark_server


def group_members(pgid: int) -> list[int]:
    """Processes of the process group ``pgid`` (the server's JVM and its Python workers)
    that have not exited (a zombie waits only for its parent to reap it)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    members.append(int(entry.name))
            except (ProcessLookupError, FileNotFoundError):
                pass
    return members


@pytest.fixture
def archive(broker, tmp_path):
    """A small stream (one distributed transaction with a part missing) as an archive."""
    config = load_config({"work_dir": str(tmp_path / "writer"), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"s{uuid.uuid4().hex[:8]}"}, environ={})
    kafka = kafka_client_settings(config)
    ensure_topics(kafka, Topics(config.kafka.topic_prefix), 3)
    b = StreamBuilder(config.kafka.topic_prefix)
    b.record(1, [0, 1], 10, 1000).part(0, 1, 100, 1001)  # segment 1's part never comes
    for node in (-1, 0, 1, 2):
        b.watermark(node, 50, 5000, prepared=(), prepared_ts=5000)
    b.produce(kafka)
    write_archive(config, tmp_path / "archive")
    return tmp_path / "archive"


def test_commands_run_on_the_server_while_it_runs_and_on_their_own_session_otherwise(archive, tmp_path):
    work = tmp_path / "work"
    server = SparkServer(work)
    try:
        before = gpcdc(work, "spark", "status")
        assert before.returncode == 3 and "is not running" in before.stderr, before
        assert len(before.stderr.strip().splitlines()) == 1

        up = gpcdc(work, "spark", "up")
        assert up.returncode == 0, up.stderr
        status = server.status()
        assert status.answers and status.url in up.stdout and f"pid {status.pid}" in up.stdout
        # Found running: the same server. (`--warm`, an audit of its own on it, is the demo's
        # first step: tests/test_reports.py.)
        again = gpcdc(work, "spark", "up")
        assert again.returncode == 0 and server.pid == status.pid, again.stderr
        assert f"pid {status.pid}" in again.stdout
        shown = gpcdc(work, "spark", "status")
        assert shown.returncode == 0 and status.url in shown.stdout

        on_server = gpcdc(work, "audit", "--archive", str(archive), "--fail-on", "error")
        assert on_server.returncode == 1, on_server.stderr
        assert "missing_part" in on_server.stdout
        # No JVM of its own: a local session writes its JVM's output to the command's log.
        assert not (work / "logs" / "gpcdc-audit.log").exists()
        assert server.pid == status.pid  # the same server, still running

        down = gpcdc(work, "spark", "down")
        assert down.returncode == 0 and "stopped" in down.stdout, down.stderr
        assert server.pid is None and not group_members(status.pid), group_members(status.pid)
        assert gpcdc(work, "spark", "down").stdout.strip() == "Spark Connect server was not running"

        on_its_own = gpcdc(work, "audit", "--archive", str(archive), "--fail-on", "error")
        assert on_its_own.returncode == 1 and "missing_part" in on_its_own.stdout, on_its_own.stderr
        assert (work / "logs" / "gpcdc-audit.log").exists()
        assert on_its_own.stdout.splitlines()[:-1] == on_server.stdout.splitlines()[:-1]  # the same findings
    finally:
        server.down()


def test_a_taken_port_and_a_dead_server_are_told_apart(tmp_path):
    import socket

    work = tmp_path / "work"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = gpcdc(work, "spark", "up", "--port", str(port))
    assert refused.returncode == 1 and refused.stderr.strip().splitlines() == [
        f"gpcdc: error: port {port} is taken by another process: choose another --port, or omit it to use a free one"]
    server = SparkServer(work)
    try:
        kill_pid(server.up("local[1]").pid)  # as a crash would
        status = server.status()
        assert not status.running and not status.answers and server.url is None
        assert gpcdc(work, "spark", "status").returncode == 3
    finally:
        server.down()


def test_a_killed_servers_temporary_files_stay_in_its_work_directory_until_the_next_start_or_stop(tmp_path):
    server = SparkServer(tmp_path / 'a "work" dir')  # spaces and quotes, through Spark's launcher
    try:
        kill_pid(server.up("local[1]").pid)  # as a crash would: none of the JVM's shutdown hooks runs
        left = {p.name for p in server.scratch.iterdir()}
        assert {name.split("-")[0] for name in left} >= {"blockmgr", "spark"}, left
        pid = server.up("local[1]").pid
        assert f"-Djava.io.tmpdir={server.scratch}" in Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        assert server.scratch.is_dir() and not left & {p.name for p in server.scratch.iterdir()}
        kill_pid(pid)
        assert server.down() is False and not server.scratch.exists()
    finally:
        server.down()


def test_a_server_whose_work_directory_has_a_comma_keeps_sparks_local_directories_whole(tmp_path):
    # Spark reads its local directories as a list split at commas.
    server = SparkServer(tmp_path / "a,b")
    try:
        pid = server.up("local[1]").pid
        assert server.status().answers and {p.name.split("-")[0] for p in server.scratch.iterdir()} >= {"spark"}
        assert not (Path.cwd() / "b").exists() and not (tmp_path / "a").exists()  # neither half used
        assert server.down() is True and not server.scratch.exists() and not pid_alive(pid)
    finally:
        server.down()


def test_a_process_that_connected_is_refused_a_local_session_once_the_server_is_gone(tmp_path):
    # As PySpark leaves a process that made a Connect session: it cannot start a local JVM.
    probe = ("import os\n"
             "os.environ['SPARK_CONNECT_MODE_ENABLED'] = '1'\n"
             "from gpcdc_toolkit.config import load_config\n"
             "from gpcdc_toolkit.ingest import SparkServerError\n"
             "from gpcdc_toolkit.ingest.spark import spark_session\n"
             f"config = load_config({{'work_dir': {str(tmp_path)!r}}}, environ={{}})\n"
             "try:\n"
             "    spark_session(config)\n"
             "except SparkServerError as e:\n"
             "    print(e)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPCDC_", "SPARK_"))}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines() == [
        f"this process connected to the Spark server of {tmp_path}, which no longer answers, and PySpark allows "
        "it no local session now: start the server again (`gpcdc spark up`), or restart the process (the kernel)"]


def test_checkpoints_of_results_dropped_are_released_by_a_thread_of_their_own(archive, tmp_path):
    # PySpark's finalizer would release them with a gRPC call from wherever the collector
    # runs, which hangs when that is inside another gRPC call: an audit's second run in
    # one session did. Here the dropped results sit in reference cycles, so that the
    # collector (not the reference count) frees them, and audits run while it does.
    work = tmp_path / "work"
    server = SparkServer(work)
    probe = (
        "import gc, sys, threading\nfrom pathlib import Path\n"
        "from pyspark.errors import PySparkException\n"
        "from pyspark.sql.connect.dataframe import DataFrame\n"
        "from pyspark.sql.connect.plan import CachedRemoteRelation\n"
        "from gpcdc_toolkit.audit import run_audit\n"
        "from gpcdc_toolkit.config import load_config\n"
        "from gpcdc_toolkit.ingest.spark import spark_session\n"
        "from gpcdc_toolkit.ingest._release import releases_sent\n"
        "config = load_config({'work_dir': sys.argv[1]}, environ={})\n"
        "spark = spark_session(config)\n"
        "ids = []\n"
        "for run in range(2):\n"
        "    result = run_audit(spark, config, archive=Path(sys.argv[2]), write=False)\n"
        "    assert result.fails('error'), result.summary\n"
        "    ids.append(result.findings._plan._relation_id)\n"
        "    cycle = [result]\n"
        "    cycle.append(cycle)\n"
        "    del result, cycle\n"
        "inline = []\n"
        "prepare = spark.client._execute_plan_request_with_metadata\n"
        "def watched(*args, **kwargs):\n"
        "    if collecting:\n"
        "        inline.append(threading.current_thread().name)\n"
        "    return prepare(*args, **kwargs)\n"
        "spark.client._execute_plan_request_with_metadata = watched\n"
        "collecting = True\n"
        "gc.collect()\n"
        "collecting = False\n"
        "assert 'MainThread' not in inline, inline  # no release sent by the collector itself\n"
        "assert releases_sent(60)\n"
        "for relation_id in ids:\n"
        "    gone = CachedRemoteRelation(relation_id, spark)\n"
        "    try:\n"
        "        DataFrame(gone, spark).count()\n"
        "        raise SystemExit(f'relation {relation_id} was not released')\n"
        "    except PySparkException:\n"
        "        pass\n"
        "    finally:\n"
        "        gone._relation_id = None\n"
        "print('released', len(ids))\n")
    try:
        assert gpcdc(work, "spark", "up").returncode == 0
        done = subprocess.run([sys.executable, "-c", probe, str(work), str(archive)], capture_output=True, text=True,
                              timeout=300, stdin=subprocess.DEVNULL)
        assert done.returncode == 0 and done.stdout.strip() == "released 2", done.stderr[-2000:]
    finally:
        server.down()


_TURN = """
import json, os, signal, sys
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql.connect.dataframe import DataFrame
from pyspark.sql.connect.plan import CachedRemoteRelation
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.ingest.spark import spark_session

work, how, before = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
spark = spark_session(load_config({"work_dir": work}, environ={}))
server = spark.client._builder.url.netloc
seen = {"session": spark.session_id, "partitions": spark.conf.get("spark.sql.shuffle.partitions"),
        "views": sorted(t.name for t in spark.catalog.listTables() if t.isTemporary)}

def passed_on(batches):
    yield from batches

# What a holder leaves in its session: a checkpoint it still holds, a view, a setting;
# and Python workers, which Spark starts for each session.
held = spark.range(5).mapInArrow(passed_on, "id long").localCheckpoint()
spark.range(2).createOrReplaceTempView("left_behind")
spark.conf.set("spark.sql.shuffle.partitions", "7")
if before:
    kept = CachedRemoteRelation(before["checkpoint"], spark)  # the last holder's, if this is its session
    try:
        DataFrame(kept, spark).count()
        seen["last_checkpoint"] = "kept"
    except PySparkException:
        seen["last_checkpoint"] = "released"
    finally:
        kept._relation_id = None
    other = SparkSession.builder.remote(f"sc://{server}/;session_id={before['session']}").create()
    try:
        other.range(1).count()
        seen["last_session"] = "open"
    except PySparkException as e:
        seen["last_session"] = "closed" if "SESSION_CLOSED" in str(e) else str(e)
    other.release_session_on_close = False
    other.stop()
print(json.dumps({**seen, "checkpoint": held._plan._relation_id}), flush=True)
if how == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
if how == "holding":
    sys.stdin.readline()
spark.stop()
if how == "expired":  # after, as the server's idle timeout closes a session no one uses
    SparkSession.builder.remote(f"sc://{server}/;session_id={seen['session']}").create().stop()
"""


def test_processes_in_turn_share_one_session_left_tidy_and_one_killed_or_closed_is_replaced(tmp_path):
    import json

    work = tmp_path / "work"
    server = SparkServer(work)

    def turn(how, before=None):
        args = [sys.executable, "-c", _TURN, str(work), how, json.dumps(before or {})]
        if how == "holding":
            return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        done = subprocess.run(args, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert done.returncode == (-9 if how == "killed" else 0), done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def worker_daemons():
        """The server's daemons of Python workers (each forks the workers of its sessions)."""
        daemons = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                state, parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
                command = (entry / "cmdline").read_bytes().split(b"\0")[-3:-1]
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(parent) == status.pid and state != "Z" and command == [b"pyspark.daemon", b"pyspark.worker"]:
                daemons.append(int(entry.name))
        return daemons

    try:
        server.up("local[1]")
        status = server.status()
        first = turn("tidy")
        assert (first["partitions"], first["views"]) == ("4", [])
        second = turn("tidy", first)
        # The same session, as a new one is: the last holder's checkpoint, view and setting gone.
        assert second["session"] == first["session"]
        assert (second["partitions"], second["views"], second["last_checkpoint"]) == ("4", [], "released")
        killed = turn("killed", second)
        assert killed["session"] == first["session"]
        # Left in use by a holder that was killed: released whole, and another session begun.
        after_kill = turn("tidy", killed)
        assert after_kill["session"] != killed["session"] and after_kill["last_session"] == "closed"
        assert (after_kill["partitions"], after_kill["views"]) == ("4", [])
        # Given back, then closed by the server: the next holder begins another.
        expired = turn("expired", after_kill)
        assert expired["session"] == after_kill["session"]
        after_expiry = turn("tidy", expired)
        assert after_expiry["session"] != expired["session"] and after_expiry["last_session"] == "closed"
        # Side by side, two processes hold two sessions.
        holding = turn("holding")
        held = json.loads(holding.stdout.readline())
        beside = turn("tidy", after_expiry)
        holding.communicate("\n", timeout=300)
        assert holding.returncode == 0
        assert held["session"] != beside["session"]
        assert after_expiry["session"] in (held["session"], beside["session"])
        # One daemon of Python workers per session the server has seen, not per process.
        sessions = {first["session"], after_kill["session"], after_expiry["session"], held["session"],
                    beside["session"]}
        assert len(sessions) == 4 and len(worker_daemons()) == 4, worker_daemons()
    finally:
        server.down()


def test_a_start_that_cannot_record_its_pid_leaves_no_server_running(tmp_path, monkeypatch):
    """A server no pid file names could be stopped by nothing the toolkit has: one whose
    pid cannot be written (a full disk, an interrupt just then) is stopped at once."""
    from gpcdc_toolkit.ingest import _server

    started = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    def full_disk(path, text):
        raise OSError(28, "No space left on device", str(path))

    stopped = []  # (pid, running when stopped)

    def stop(pid, **kwargs):
        stopped.append((pid, pid_alive(pid)))
        stop_group(pid, **kwargs)

    monkeypatch.setattr(_server.subprocess, "Popen", popen)
    monkeypatch.setattr(_server, "write_atomic", full_disk)
    monkeypatch.setattr(_server, "stop_group", stop)
    with pytest.raises(OSError, match="No space left on device"):
        SparkServer(tmp_path / "work").up("local[1]")
    (process,) = started
    try:
        assert stopped == [(process.pid, True)]  # stopped by the start, not gone of itself (no Java, say)
        process.wait(timeout=30)
        assert group_members(process.pid) == []
    finally:  # what this test started goes, whatever the code under test left
        stop_group(process.pid)
