"""Capture workers as processes: one per node, in the foreground or the background.

Each worker writes ``node<content>.pid`` and ``node<content>.status.json`` in the
pipeline directory. Background workers are stopped by the pid they recorded
(SIGTERM: a clean stop that acknowledges what Kafka has), never by name.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg import conninfo

from .._runtime import kill_pid, pid_alive, read_json, running_pid, stop_pids, write_atomic
from ..bootstrap import Pipeline
from ..config import ENV_PREFIX, SETTINGS, Config
from ..connect import kafka_client_settings, open_cluster
from ..errors import GpcdcError, UnreachableError
from ._hosts import check_nodes, holder, worker_application
from ._worker import CaptureWorker, WorkerSettings, tune_for_capture

log = logging.getLogger(__name__)


def config_environment(config: Config) -> dict[str, str]:
    """Environment variables that make a child process resolve the same configuration:
    the same file (for what only a file holds, such as ``[kafka.client]``), and every
    setting. Not flags: a command line is visible to every local user, and a DSN may
    hold a password."""
    out = {ENV_PREFIX + "CONFIG": str(config.file)} if config.file is not None else {}
    for name, spec in SETTINGS.items():
        value = config.value(name)
        if spec.type is bool:
            out[spec.env_var] = "true" if value else "false"
        elif value is not None:
            out[spec.env_var] = str(value)
    return out


def child_environment(config: Config) -> dict[str, str]:
    """This process's environment, its ``GPCDC_*`` variables replaced by ``config``'s."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    return {**inherited, **config_environment(config)}


@dataclass(frozen=True)
class Started:
    """What :meth:`CaptureGroup.start` did: the workers it started (node: pid), and the
    nodes it left to another host's worker (node: that worker's ``application_name``)."""

    pids: dict[int, int]
    elsewhere: dict[int, str]


class CaptureGroup:
    """The capture workers of one pipeline (topic prefix) over the source cluster."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)

    def pid_file(self, content: int) -> Path:
        return self.pipeline.directory / f"node{content}.pid"

    def status_file(self, content: int) -> Path:
        return self.pipeline.directory / f"node{content}.status.json"

    def confirmed_file(self, content: int) -> Path:
        """Where the node's worker records the last event of its partition Kafka confirmed
        (kept across its restarts, unlike its status)."""
        return self.pipeline.directory / f"node{content}.confirmed.json"

    def pid(self, content: int) -> int | None:
        return running_pid(self.pid_file(content), "capture run")

    def status(self, content: int) -> dict[str, Any] | None:
        try:
            return read_json(self.status_file(content))
        except (FileNotFoundError, ValueError):
            return None

    def worker_argv(self, content: int) -> list[str]:
        """The worker's command line: its settings come in its environment."""
        return [sys.executable, "-m", "gpcdc_toolkit", "capture", "run", "--node", str(content)]

    def start(self, timeout: float = 60.0, nodes: Collection[int] | None = None) -> Started:
        """Start a background worker for every node (of ``nodes``, default all) that has
        none, here or on another host, and return their pids once each streams, with the
        nodes another host's workers capture; a worker that exits instead is reported
        with its last words. On failure, the workers this call started are stopped."""
        start = self.pipeline.start_point()  # fails clearly before anything starts
        captured = [node.content for node in start.captured_nodes]
        if nodes is not None:
            check_nodes(nodes, captured)
        wanted = [c for c in captured if (nodes is None or c in nodes) and not self.pid(c)]
        holders = self.held_elsewhere(wanted)
        foreign = {c: h for c, h in holders.items() if holder(h) is None}
        if foreign:
            content, name = min(foreign.items())
            raise GpcdcError(f"the pipeline's slot on node {content} is held by another client ({name!r})",
                             fix="stop that client (pg_stat_activity shows it on the node, by the slot's active_pid), then start capture")
        started: dict[int, int] = {}
        logged: dict[int, int] = {}  # where each worker's log was when it started: what follows is its own
        try:
            for content in (c for c in wanted if c not in holders):
                self.status_file(content).unlink(missing_ok=True)
                log = self.log_file(content)
                logged[content] = log.stat().st_size if log.exists() else 0
                started[content] = self.start_node(content, log)
            self._wait_streaming(started, logged, timeout)
        except BaseException:  # a failure, a timeout, an interrupt: nothing of this start keeps running
            self.stop(nodes=list(started))
            raise
        return Started(started, holders)

    def _wait_streaming(self, started: dict[int, int], logged: dict[int, int], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting = set(started)
        while waiting:
            for content in list(waiting):
                if (self.status(content) or {}).get("state") == "streaming":
                    waiting.discard(content)
                elif not pid_alive(started[content]):
                    with self.log_file(content).open("rb") as log:
                        log.seek(logged[content])
                        said = log.read().decode(errors="replace")
                    raise GpcdcError(f"the capture worker of node {content} exited: {last_words(said)}",
                                     fix=f"see {self.log_file(content)}")
            if waiting and time.monotonic() > deadline:
                raise GpcdcError(f"capture workers of nodes {sorted(waiting)} did not start streaming within {timeout:g} s; "
                                 f"the {len(started)} workers this start began are stopped",
                                 fix=f"see their logs in {self.pipeline.directory}, then start capture again")
            time.sleep(0.05)  # polling the workers' status files

    def held_elsewhere(self, contents: Collection[int]) -> dict[int, str]:
        """The nodes among ``contents`` without a worker on this host whose slot a client
        holds (a capture worker of another host, or anything else), with its
        ``application_name``. A node that does not answer is not among them: a worker
        started for it waits for it, and for its slot, itself."""
        contents = [c for c in contents if not self.pid(c)]
        if not contents:
            return {}
        try:
            cluster = open_cluster(self.config, "source")
        except UnreachableError:
            return {}
        held = {}
        for node in (n for n in cluster.nodes if n.content in contents):
            try:
                with cluster.connect_node(node) as conn:
                    row = conn.execute(
                        "SELECT coalesce(r.application_name, '') FROM pg_replication_slots s LEFT JOIN "
                        "pg_stat_activity r ON r.pid = s.active_pid WHERE s.slot_name = %s AND s.active",
                        (self.pipeline.slot,)).fetchone()
            except UnreachableError:
                continue
            if row is not None and (holder(row[0]) is None or other_worker(row[0]) is not None):
                held[node.content] = str(row[0])
        return held

    def log_file(self, content: int) -> Path:
        return self.pipeline.directory / f"node{content}.log"

    def start_node(self, content: int, log_path: Path) -> int:
        with log_path.open("ab") as log:
            proc = subprocess.Popen(self.worker_argv(content), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env=child_environment(self.config))
        write_atomic(self.pid_file(content), str(proc.pid))
        return proc.pid

    def stop(self, timeout: float = 30.0, nodes: Collection[int] | None = None) -> list[int]:
        """Stop this host's workers (of ``nodes``, default all); returns their nodes.
        Nodes the pipeline does not capture are refused, as by :meth:`start`."""
        if nodes is not None and (unknown := set(nodes) - set(self._contents())):
            check_nodes(unknown, [node.content for node in self.pipeline.start_point().captured_nodes])
        running = {c: pid for c, pid in self.running().items() if nodes is None or c in nodes}
        stop_pids(list(running.values()), timeout=timeout)
        for content in self._contents():
            if nodes is None or content in nodes:
                self.pid_file(content).unlink(missing_ok=True)
        return sorted(running)

    def kill(self, content: int) -> int:
        """SIGKILL one worker (for fault tests); returns its pid."""
        pid = self.pid(content)
        if pid is None:
            last = (self.status(content) or {}).get("state", "never started")
            raise GpcdcError(f"no capture worker runs for node {content} (its last state: {last})",
                             fix=f"see {self.log_file(content)}")
        kill_pid(pid)
        return pid

    def running(self) -> dict[int, int]:
        """The nodes whose worker runs, with its pid."""
        return {content: pid for content in self._contents() if (pid := self.pid(content))}

    def _contents(self) -> list[int]:
        return sorted(int(p.name[4:-4]) for p in self.pipeline.directory.glob("node*.pid"))


def last_words(log: str) -> str:
    """What a worker's log says it ended on: the line naming a native crash, which the
    crash's stack and the list of loaded modules follow, or else its last line."""
    lines = log.strip().splitlines() or ["(no output)"]
    return next((line for line in reversed(lines) if line.startswith("Fatal Python error: ")), lines[-1])


def other_worker(application_name: str | None) -> tuple[str, int] | None:
    """(host, pid) of the capture worker ``application_name`` names, unless it is one of
    this host's that has died (its walsender not gone yet)."""
    worker = holder(application_name)
    if worker and application_name == worker_application(socket.gethostname(), worker[1]) and not pid_alive(worker[1]):
        return None
    return worker


def run_worker(config: Config, content: int) -> None:
    """Run one node's worker in this process until SIGTERM or SIGINT."""
    group = CaptureGroup(config)
    pipeline = group.pipeline
    start = pipeline.start_point()
    cluster = open_cluster(config, "source")
    nodes = {n.content: n for n in cluster.nodes}
    if content not in nodes:
        raise GpcdcError(f"the source cluster has no node with content {content}",
                         fix=f"use one of {', '.join(map(str, sorted(nodes)))}")
    settings = WorkerSettings(prefix=config.kafka.topic_prefix, kafka=kafka_client_settings(config),
                              capture=config.capture, replicas=config.kafka.replication_factor)
    database = conninfo.conninfo_to_dict(cluster.coordinator_dsn).get("dbname") or "postgres"
    worker = CaptureWorker(cluster, nodes[content], start, settings, database=str(database),
                           partitions=cluster.segment_count, status_file=group.status_file(content),
                           confirmed_file=group.confirmed_file(content), source=lambda: open_cluster(config, "source"))
    if config.capture.metrics_port:
        from .._metrics import capture_metrics, capture_port, serve

        serve(capture_port(config.capture.metrics_port, content), "capture.metrics_port",
              lambda: capture_metrics(worker.stats, config.kafka.topic_prefix))
    stop = threading.Event()
    stopped_by: list[str] = []

    def request_stop(signum: int, _frame: object) -> None:
        stopped_by.append(signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, request_stop)
    write_atomic(group.pid_file(content), str(os.getpid()))
    tune_for_capture()
    # The worker's log says that it began and why it ended, so that a worker found gone
    # is told apart from one stopped; a native crash leaves its stack there.
    faulthandler.enable()
    log.setLevel(logging.INFO)
    log.info("%s: capture worker %d started", worker.node, os.getpid())
    try:
        worker.run(stop)
    finally:
        if group.pid(content) in (None, os.getpid()):
            group.pid_file(content).unlink(missing_ok=True)
    log.info("%s: capture worker %d stopped on %s", worker.node, os.getpid(), " then ".join(stopped_by) or "no signal")
