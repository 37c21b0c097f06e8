"""The cluster interface: discovery, distributed transactions, routing and markers."""

from ._cluster import COORDINATOR, Cluster, Node, Table, TableRef, connect_dsn, quoted
from ._ddl import CreateTable, DdlError, parse_create_table
from ._dtx import DistributedTransaction, Session, gid, gxid_of, resolve_in_doubt
from ._markers import CommitRecord, DdlRecord, GxidMarker, MarkerError, OnePhaseMarker
from ._routing import jump_consistent_hash, key_hash, segment_for

__all__ = [
    "COORDINATOR", "Cluster", "Node", "Table", "TableRef", "connect_dsn", "quoted",
    "CreateTable", "DdlError", "parse_create_table",
    "DistributedTransaction", "Session", "gid", "gxid_of", "resolve_in_doubt",
    "CommitRecord", "DdlRecord", "GxidMarker", "MarkerError", "OnePhaseMarker",
    "jump_consistent_hash", "key_hash", "segment_for",
]
