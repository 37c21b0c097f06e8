"""Sandbox clusters of real PostgreSQL 15 servers, shaped like Greenplum."""

from ._expand import Expansion
from ._sandbox import FLAVOURS, PG_MAJOR, Sandbox, SandboxNode, citus_installed, find_pg_bin, list_sandboxes

__all__ = ["Expansion", "FLAVOURS", "citus_installed", "PG_MAJOR", "Sandbox", "SandboxNode", "find_pg_bin", "list_sandboxes"]
