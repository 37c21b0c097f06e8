"""Sandbox clusters of real PostgreSQL 15 servers, shaped like Greenplum."""

from ._sandbox import PG_MAJOR, Sandbox, SandboxNode, find_pg_bin, list_sandboxes

__all__ = ["PG_MAJOR", "Sandbox", "SandboxNode", "find_pg_bin", "list_sandboxes"]
