"""A cluster from its DSN: a replay target (a Greenplum-style sandbox, or a front
door), or a capture source (a Greenplum-style coordinator, or a Citus coordinator).

``target.kind`` says which; ``auto`` tells them apart by the catalog: a coordinator
with ``gp_segment_configuration`` is a sandbox (``Cluster.connect`` refuses one made
without the routing functions of today's), a server with the ``citus`` extension a
Citus coordinator, any other a plain PostgreSQL server.
"""

from __future__ import annotations

from ..config import TARGET_KINDS
from ..errors import ClusterError
from ._cluster import Cluster, _where, connect_dsn
from ._frontdoor import CitusCluster, FrontDoor


def _kind_of(dsn: str, role: str) -> tuple[bool, bool]:
    """(a Greenplum-style coordinator, a Citus coordinator), from the catalog."""
    with connect_dsn(dsn, f"{role} {_where(dsn)}", autocommit=True) as conn:
        return conn.execute(  # type: ignore[return-value]
            "SELECT to_regclass('gp_segment_configuration') IS NOT NULL, "
            "EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')").fetchone()


def connect_source(dsn: str) -> Cluster:
    """The source cluster behind ``dsn``: a Citus coordinator (the ``citus``
    extension), else a Greenplum-style coordinator."""
    _sandbox, citus = _kind_of(dsn, "coordinator")
    return CitusCluster.connect(dsn) if citus else Cluster.connect(dsn)


def connect_target(dsn: str, kind: str = "auto") -> Cluster:
    """The target cluster behind ``dsn``, of ``kind`` (one of :data:`TARGET_KINDS`)."""
    if kind not in TARGET_KINDS:
        raise ClusterError(f"unknown target kind {kind!r}", fix=f"use one of {', '.join(TARGET_KINDS)}")
    sandbox, citus = _kind_of(dsn, "target")
    if kind == "sandbox" and not sandbox:
        raise ClusterError(f"target {_where(dsn)} is no Greenplum-style coordinator, but target.kind is sandbox",
                           fix="set target.kind to postgres (a Citus coordinator too) or auto to write it at its "
                               "front door, or point the DSN at a sandbox's coordinator")
    if sandbox and kind == "postgres":
        raise ClusterError(f"target {_where(dsn)} is a sandbox's coordinator, whose tables hold no rows, but "
                           "target.kind is postgres", fix="set target.kind to sandbox (or auto)")
    if sandbox:
        return Cluster.connect(dsn)
    return CitusCluster.connect(dsn) if citus else FrontDoor.connect(dsn)
