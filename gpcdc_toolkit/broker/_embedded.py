"""The embedded broker: Apache Kafka itself, one node in KRaft mode (broker and
controller in one JVM), owned by a work directory.

Its jars come from Maven Central through the toolkit's own resolver (``_maven.py``);
it runs as ``java -cp ... kafka.Kafka server.properties`` with the properties, the
storage (formatted once), the logs and the state under ``<work_dir>/broker``. Its ports
are chosen at the first start and kept: after a crash it comes back where clients
look for it, with its data. Everything else in the toolkit talks plain Kafka protocol,
so a real cluster replaces it with one setting (``kafka.bootstrap_servers``).
"""

from __future__ import annotations

import base64
import fcntl
import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .._maven import resolve
from .._runtime import free_port, kill_pid, port_in_use, read_json, running_pid, stop_pid, write_atomic, write_json
from ..errors import BrokerError

KAFKA_VERSION = "4.1.1"
# Kafka logs through SLF4J 1.x; Log4j 2 writes it (log4j-core comes with Kafka).
ARTIFACTS = (f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}", "org.apache.logging.log4j:log4j-slf4j-impl:2.24.3")
# Sized for a 2-core laptop: a fixed heap, and two threads where Kafka's defaults assume a server.
JVM_OPTIONS = ("-Xms512m", "-Xmx512m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true")
MAIN = "kafka.Kafka"
_EXCEPTION = re.compile(r"^[\w.$]+(Exception|Error): ")


def kafka_classpath() -> str:
    return os.pathsep.join(str(jar) for jar in resolve(f"kafka-{KAFKA_VERSION}", ARTIFACTS))


def check_reachable(kafka: str | Mapping[str, str], timeout: float = 5.0) -> None:
    """Raise BrokerError unless a Kafka broker answers a metadata request (``kafka``: the
    bootstrap servers, or librdkafka settings with them and any security settings)."""
    from confluent_kafka.admin import AdminClient

    settings = {"bootstrap.servers": kafka} if isinstance(kafka, str) else dict(kafka)
    # log_level 0: the refused connections are reported once, below, not per retry
    client = AdminClient({**settings, "log_level": 0, "socket.connection.setup.timeout.ms": int(timeout * 1000)})
    try:
        client.list_topics(timeout=timeout)
    except Exception as e:  # confluent_kafka raises KafkaException with a KafkaError inside
        raise BrokerError(
            f"no Kafka broker answers at {settings.get('bootstrap.servers')} within {timeout:g} s ({e})",
            fix="start it (`gpcdc broker up` for the embedded one) or correct kafka.bootstrap_servers",
        ) from None


def _server_properties(port: int, controller_port: int, data: Path, quorum: Quorum | None = None) -> str:
    quorum = quorum or Quorum(1, f"1@127.0.0.1:{controller_port}", 1)
    # Every topic's replicas on as many nodes as there are, up to three; a write is
    # acknowledged once two of three have it, so that one node may die without a loss.
    replicas = min(quorum.nodes, 3)
    min_isr = min(replicas, 2)
    settings = {
        "process.roles": "broker,controller",
        "node.id": quorum.node_id,
        "controller.quorum.voters": quorum.voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": data,
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        "group.initial.rebalance.delay.ms": 0,
        # After a crash, the controller waits out the dead incarnation's session before it
        # lets the restarted broker lead its partitions: seconds, not the default nine.
        "broker.heartbeat.interval.ms": 500,
        "broker.session.timeout.ms": 2000,
        "num.network.threads": 2,
        "num.io.threads": 2,
        "background.threads": 2,
        "num.recovery.threads.per.data.dir": 1,
        "log.cleaner.threads": 1,
        # Kept until deleted: a replay or an audit may need the whole history, and time-based
        # retention would also drop, within minutes, messages that carry old timestamps.
        "log.retention.ms": -1,
        # The toolkit creates its topics with the partitions it needs; a typo must not make one.
        "auto.create.topics.enable": "false",
    }
    return "".join(f"{k}={v}\n" for k, v in settings.items())


def _log4j_properties(log_file: Path) -> str:
    return (f"rootLogger.level=INFO\nrootLogger.appenderRef.file.ref=file\n"
            f"appender.file.type=File\nappender.file.name=file\nappender.file.fileName={log_file}\n"
            "appender.file.layout.type=PatternLayout\nappender.file.layout.pattern=[%d] %p %m (%c)%n\n")


def _new_cluster_id() -> str:
    while True:  # Kafka's own random-uuid never starts with '-' (it would read as a flag)
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


@dataclass(frozen=True)
class Quorum:
    """A node's place in a KRaft quorum of ``nodes`` nodes, each broker and controller."""
    node_id: int
    voters: str  # controller.quorum.voters: "1@127.0.0.1:port,2@..."
    nodes: int


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap_servers: str | None  # where it listens (or listened)
    answers: bool


class EmbeddedBroker:
    """The Kafka broker of a work directory. ``broker.json`` keeps its ports and cluster
    id for good; ``broker.pid`` says which process runs it now."""

    def __init__(self, work_dir: str | os.PathLike[str], name: str = "broker") -> None:
        self.path = Path(work_dir).absolute() / name
        self._state_file = self.path / "broker.json"
        self._pid_file = self.path / "broker.pid"
        self.data = self.path / "data"
        self.log_file = self.path / "logs" / "server.log"
        self._console = self.path / "logs" / "console.log"
        self._log_starts: dict[Path, int] = {}

    def _state(self) -> dict[str, str] | None:
        if not self._state_file.is_file():
            return None
        return {k: str(v) for k, v in read_json(self._state_file).items()}

    @property
    def pid(self) -> int | None:
        return running_pid(self._pid_file, MAIN, str(self.path))

    @property
    def port(self) -> int | None:
        state = self._state()
        return int(state["port"]) if state else None

    @property
    def bootstrap_servers(self) -> str:
        if self.pid is None:
            raise BrokerError(f"the embedded broker of {self.path.parent} is not running",
                              fix="start it with `gpcdc broker up`")
        return f"127.0.0.1:{self.port}"

    def status(self, timeout: float = 5.0) -> BrokerStatus:
        pid, port = self.pid, self.port
        servers = f"127.0.0.1:{port}" if port else None
        answers = False
        if pid is not None and servers is not None:
            try:
                check_reachable(servers, timeout=timeout)
                answers = True
            except BrokerError:
                pass
        return BrokerStatus(pid is not None, pid, servers, answers)

    def up(self, port: int | None = None, timeout: float = 120.0) -> EmbeddedBroker:
        """Start the broker unless it runs already; return once it answers. Starts of
        one work directory's broker take turns (one starts it, the others find it)."""
        self.path.mkdir(parents=True, exist_ok=True)
        with (self.path / "start.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return self._up(port, timeout)

    def _up(self, port: int | None, timeout: float) -> EmbeddedBroker:
        if self.pid is not None:
            if port is not None and port != self.port:
                raise BrokerError(f"the embedded broker already runs on port {self.port}",
                                  fix="stop it first (`gpcdc broker down`) to move it to another port")
            return self
        self._await(self._launch(port), timeout)
        return self

    def _launch(self, port: int | None) -> subprocess.Popen[bytes]:
        """Start the broker's process (its ports and storage first); not waiting for it."""
        state = self._state() or {}
        quorum = Quorum(int(state["node_id"]), state["voters"], int(state["nodes"])) if "voters" in state else None
        if port is None and state.get("port"):
            port = int(state["port"])
            if port_in_use(port):
                raise BrokerError(f"port {port}, where the embedded broker listened before, is taken by another process",
                                  fix="stop that process, or start the broker on another port with --port")
        elif port is not None and port_in_use(port):
            raise BrokerError(f"port {port} is taken by another process",
                              fix="choose another --port, or omit it to use a free one")
        port = port or free_port()
        controller_port = int(state.get("controller_port") or 0)
        if quorum is None and (not controller_port or controller_port == port or port_in_use(controller_port)):
            controller_port = free_port(avoid={port})  # a quorum's voters know the port: it is kept
        cluster_id = state.get("cluster_id") or _new_cluster_id()
        (self.path / "logs").mkdir(parents=True, exist_ok=True)
        properties = self.path / "server.properties"
        properties.write_text(_server_properties(port, controller_port, self.data, quorum))
        (self.path / "log4j2.properties").write_text(_log4j_properties(self.log_file))
        write_json(self._state_file, {**state, "port": port, "controller_port": controller_port, "cluster_id": cluster_id})
        java = self._java()
        classpath = kafka_classpath()
        # The logs grow across runs: a failure is explained by what this run adds.
        self._log_starts = {path: path.stat().st_size if path.exists() else 0 for path in (self.log_file, self._console)}
        if not (self.data / "meta.properties").is_file():
            self._format(java, classpath, cluster_id, properties)
        with self._console.open("ab") as console:
            proc = subprocess.Popen(
                [java, *JVM_OPTIONS, f"-Dlog4j2.configurationFile={self.path / 'log4j2.properties'}",
                 f"-Dgpcdc.broker={self.path}", "-cp", classpath, MAIN, str(properties)],
                stdout=console, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        write_atomic(self._pid_file, str(proc.pid))
        return proc

    def _await(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        """Return once the started broker answers; stop it and raise if it exits or
        does not answer within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        port = self.port
        assert port is not None  # written by _launch
        while True:
            if proc.poll() is not None:
                self._pid_file.unlink(missing_ok=True)
                raise BrokerError(f"the embedded broker exited with status {proc.returncode}: {self._last_words()}",
                                  fix=f"see {self.log_file}")
            try:
                # A plain connect first: a client would log every refused attempt.
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                check_reachable(f"127.0.0.1:{port}", timeout=5.0)
                return
            except (OSError, BrokerError):
                if time.monotonic() > deadline:
                    stop_pid(proc.pid)
                    self._pid_file.unlink(missing_ok=True)
                    raise BrokerError(f"the embedded broker did not answer within {timeout:g} s: {self._last_words()}",
                                      fix=f"see {self.log_file}") from None
                time.sleep(0.05)  # polling the process's port; nothing to wait on instead

    def down(self, timeout: float = 60.0) -> None:
        """Stop the broker (a controlled shutdown; SIGKILL after ``timeout``). Its data stays."""
        pid = self.pid
        if pid is not None:
            stop_pid(pid, timeout=timeout)
        self._pid_file.unlink(missing_ok=True)

    def kill(self) -> int:
        """SIGKILL the broker (for fault tests), as a crash would; returns its pid."""
        pid = self.pid
        if pid is None:
            raise BrokerError(f"the embedded broker of {self.path.parent} is not running")
        kill_pid(pid)
        return pid

    def remove(self) -> None:
        """Stop the broker and delete its data, ports and logs."""
        self.down()
        shutil.rmtree(self.path, ignore_errors=True)

    def _java(self) -> str:
        java = shutil.which("java")
        if java is None:
            raise BrokerError("no Java runtime (java) on the PATH; the embedded broker is Apache Kafka",
                              fix="run ./dev setup, or install one (apt-get install openjdk-17-jre-headless)")
        return java

    def _format(self, java: str, classpath: str, cluster_id: str, properties: Path) -> None:
        done = subprocess.run(
            [java, "-Xmx256m", f"-Dlog4j2.configurationFile={self.path / 'log4j2.properties'}", "-cp", classpath,
             "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(properties), "--ignore-formatted"],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
        if done.returncode != 0:
            reason = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}").splitlines()[-1]
            raise BrokerError(f"cannot format the embedded broker's storage in {self.data}: {reason}",
                              fix="remove the broker's directory to start afresh (`gpcdc broker down --remove`)")

    def _last_words(self) -> str:
        """The broker's own reason: its last error in the log, else the console's last line."""
        for path in (self.log_file, self._console):
            try:
                with path.open("rb") as f:
                    f.seek(self._log_starts.get(path, 0))
                    lines = f.read().decode(errors="replace").splitlines()
            except FileNotFoundError:
                continue
            errors = [i for i, line in enumerate(lines) if " ERROR " in line or " FATAL " in line
                      or line.startswith("Error")]
            if errors:
                # The exception below the last error line, when there is one, says why.
                last = errors[-1]
                cause = lines[last + 1].strip() if last + 1 < len(lines) else ""
                return cause.split(": ", 1)[-1] if _EXCEPTION.match(cause) else lines[last].strip()
            if path == self._console and lines:
                return lines[-1].strip()
        return "it left no log"
