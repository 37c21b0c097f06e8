"""The cluster interface: discovery, distributed transactions, routing."""

from ..protocol import COORDINATOR
from ._cluster import Cluster, Node, Table, TableRef, connect_dsn, connection_lost, masked, quoted, settings_statement
from ._dtx import COMMIT_LOCK, START_LOCK, DistributedTransaction, Session, gid, gxid_of, resolve_in_doubt, syncpoint_lock
from ._frontdoor import CitusCluster, FrontDoor, FrontDoorSession, LocalTransaction
from ._routing import jump_consistent_hash, key_hash, segment_for
from ._target import connect_source, connect_target
from ._writes import Writes, WriteSession, assignments

__all__ = [
    "COORDINATOR", "Cluster", "Node", "Table", "TableRef", "connect_dsn", "connection_lost", "masked", "quoted", "settings_statement",
    "COMMIT_LOCK", "START_LOCK", "DistributedTransaction", "Session", "gid", "gxid_of", "resolve_in_doubt", "syncpoint_lock",
    "jump_consistent_hash", "key_hash", "segment_for",
    "CitusCluster", "FrontDoor", "FrontDoorSession", "LocalTransaction", "Writes", "WriteSession", "assignments",
    "connect_source", "connect_target",
]
