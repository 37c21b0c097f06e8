"""Every command, against a stopped source, a stopped broker and a malformed stream:
one line on stderr, a non-zero exit, never a traceback."""

import os
import socket
import subprocess
import sys
import uuid

import pytest
from confluent_kafka import Producer

from gpcdc_toolkit.capture import ensure_topics
from gpcdc_toolkit.protocol import Topics

from .test_cli import gpcdc

COMMANDS = [["bootstrap", "create"], ["bootstrap", "drop", "--delete-topics"], ["capture", "start"],
            ["capture", "run", "--node", "0"], ["status"], ["workload", "--duration", "1"], ["replay", "--once"],
            ["broker", "status"]]


@pytest.fixture(scope="module")
def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        yield s.getsockname()[1]


def assert_one_line(done):
    assert done.returncode != 0, done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("%")]
    assert len(lines) == 1 and lines[0].startswith("gpcdc: error: "), done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_stopped_servers(work_dir, closed_port, command):
    dsn = f"host=127.0.0.1 port={closed_port} dbname=postgres user=postgres"
    assert_one_line(gpcdc(work_dir / "stopped", "--source-dsn", dsn, "--target-dsn", dsn,
                          "--kafka-bootstrap-servers", f"127.0.0.1:{closed_port}", *command))


@pytest.mark.parametrize("garbage", [b"{not json", b"[1, 2]", b'{"op": "c"}', b'{"status": "END"}',
                                     b'{"type": "commit", "gxid": "x"}', b"\xff\xfe"])
def test_a_malformed_stream(work_dir, broker, garbage):
    from gpcdc_toolkit.sandbox import Sandbox

    prefix = f"m{uuid.uuid4().hex[:8]}"
    kafka = {"bootstrap.servers": broker.bootstrap_servers}
    ensure_topics(kafka, Topics(prefix), 1)
    producer = Producer(kafka)
    producer.produce(f"{prefix}.changes", garbage, partition=0)
    producer.produce(f"{prefix}.dtx", garbage, partition=0)
    assert producer.flush(10) == 0
    target = Sandbox(f"mal-{uuid.uuid4().hex[:4]}", work_dir).up(segments=1)
    try:
        done = gpcdc(work_dir, "--target-sandbox", target.name, "--kafka-bootstrap-servers",
                     broker.bootstrap_servers, "--kafka-topic-prefix", prefix, "replay", "--once", "--no-replay-initial-load")
        assert_one_line(done)
    finally:
        target.down(remove=True)


def test_a_full_disk_leaves_the_state_file_whole_and_says_so_in_one_line(tmp_path):
    import errno

    from gpcdc_toolkit._runtime import read_json, write_json
    from gpcdc_toolkit.cli import _describe

    state = tmp_path / "state.json"
    write_json(state, {"offset": 1})
    (tmp_path / "state.json.tmp").symlink_to("/dev/full")  # every write there: no space left
    with pytest.raises(OSError) as full:
        write_json(state, {"offset": 2})
    assert full.value.errno == errno.ENOSPC
    assert read_json(state) == {"offset": 1} and not (tmp_path / "state.json.tmp").exists()
    said = _describe(full.value)
    assert said.startswith(f"cannot use {tmp_path / 'state.json.tmp'}: No space left on device: free space")
    assert "\n" not in said


def test_a_read_only_work_directory_says_so_in_one_line(work_dir):
    """Root writes anywhere but on a read-only filesystem: the command sees its work
    directory through a read-only bind mount, in a mount namespace of its own."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.fail("this test needs `unshare -m` (root, as the test run is) to mount a read-only directory")
    work = work_dir / f"read-only-{uuid.uuid4().hex[:6]}"
    work.mkdir()
    read_only = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPCDC_")}
    done = subprocess.run(["unshare", "-m", "sh", "-c", read_only, str(work), sys.executable, "-m", "gpcdc_toolkit",
                           "--work-dir", str(work), "sandbox", "up", "--segments", "1"],
                          capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert_one_line(done)
    assert f"cannot use {work / 'sandboxes'}: Read-only file system: point --work-dir at a writable" in done.stderr
    assert list(work.iterdir()) == []


def test_an_immutable_work_directory_says_so_in_one_line(work_dir):
    """The unwritable directory that stops root too: one with the immutable attribute."""
    work = work_dir / f"immutable-{uuid.uuid4().hex[:6]}"
    work.mkdir()
    made = subprocess.run(["chattr", "+i", str(work)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.fail(f"this test needs chattr +i on {work_dir}'s filesystem (root, ext4 as the test run has): {made.stderr}")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPCDC_")}
        done = subprocess.run([sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(work), "sandbox", "up", "--segments", "1"],
                              capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    finally:
        subprocess.run(["chattr", "-i", str(work)], check=True)
    assert_one_line(done)
    assert f"cannot use {work / 'sandboxes'}: Operation not permitted: clear its immutable" in done.stderr
    assert list(work.iterdir()) == []
