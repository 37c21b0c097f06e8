"""Kafka as production runs it: several nodes, each broker and controller (KRaft),
every topic replicated on three of them and a write acknowledged once two have it.
The embedded default stays one node; a cluster is for proving what the pipeline
keeps when brokers of a cluster die."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

from .._runtime import free_port, stop_pids, write_json
from ..errors import BrokerError
from ._embedded import EmbeddedBroker, _new_cluster_id


class EmbeddedCluster:
    """``nodes`` Kafka nodes of one work directory, ``<work_dir>/kafka-cluster/node-N``.
    Each node is an :class:`EmbeddedBroker` whose state also names its quorum, so
    that a node killed alone comes back with ``node(N).up()``."""

    def __init__(self, work_dir: str | os.PathLike[str], nodes: int = 3) -> None:
        if nodes < 1:
            raise ValueError(f"a Kafka cluster has at least one node, not {nodes}")
        self.path = Path(work_dir).absolute() / "kafka-cluster"
        self.nodes = tuple(EmbeddedBroker(self.path, f"node-{i}") for i in range(1, nodes + 1))

    def node(self, node_id: int) -> EmbeddedBroker:
        """The node Kafka calls ``node_id`` (as in a partition's leader)."""
        if not 1 <= node_id <= len(self.nodes):
            raise BrokerError(f"the cluster has nodes 1 to {len(self.nodes)}, not {node_id}")
        return self.nodes[node_id - 1]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def up(self, timeout: float = 120.0) -> EmbeddedCluster:
        """Start the nodes that do not run; return once each answers."""
        self.path.mkdir(parents=True, exist_ok=True)
        with (self.path / "start.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._place()
            # A node answers only once a majority of the controllers has elected a
            # leader: the nodes start together, then each is waited for.
            started = [(node, node._launch(None)) for node in self.nodes if node.pid is None]
            try:
                for node, proc in started:
                    node._await(proc, timeout)
            except BrokerError:
                for node, _ in started:
                    node.down()
                raise
        return self

    def _place(self) -> None:
        """Each node's ports and the quorum's voters, chosen at the first start and kept."""
        if all(node._state() for node in self.nodes):
            return
        taken: set[int] = set()
        for _ in range(2 * len(self.nodes)):
            taken.add(free_port(avoid=taken))
        ports = sorted(taken)
        controller_ports = ports[len(self.nodes):]
        voters = ",".join(f"{i}@127.0.0.1:{port}" for i, port in enumerate(controller_ports, 1))
        cluster_id = _new_cluster_id()
        for i, node in enumerate(self.nodes):
            node.path.mkdir(parents=True, exist_ok=True)
            write_json(node._state_file,
                       {"port": ports[i], "controller_port": controller_ports[i], "cluster_id": cluster_id,
                        "node_id": i + 1, "voters": voters, "nodes": len(self.nodes)})

    def down(self, timeout: float = 30.0) -> None:
        """Stop every node, side by side (the last ones have no quorum left to shut down
        in a controlled way, and are killed after ``timeout``); their data stays."""
        stop_pids([pid for node in self.nodes if (pid := node.pid) is not None], timeout=timeout)
        for node in self.nodes:
            node.down()  # none runs now: this forgets their pids

    def remove(self) -> None:
        """Stop every node and delete the cluster's data, ports and logs."""
        self.down()
        shutil.rmtree(self.path, ignore_errors=True)
