"""How a node of the source may have changed under the pipeline (pure): the checks a
capture session makes before it streams, and ``gpcdc status`` makes of every node."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ClusterChangedError
from ..protocol import COORDINATOR, NodeStart

REBOOTSTRAP = ("bootstrap the pipeline again (`gpcdc bootstrap drop`, then `gpcdc bootstrap create`) and replay into "
               "a fresh target; docs/reliability.md says what a node change loses and why")
EXTEND = ("extend the pipeline to the new segments (`gpcdc bootstrap extend`; a Citus source or the key dispatcher: "
          "bootstrap again), then start capture again (`gpcdc capture start`)")


def added_nodes(listed: Iterable[int], started: Iterable[NodeStart]) -> ClusterChangedError | None:
    """Contents the cluster lists and the start point does not (an expansion)."""
    added = sorted(set(listed) - {n.content for n in started})
    if not added:
        return None
    return ClusterChangedError(f"the source lists segments {added}, which the pipeline's start point does not "
                               "(added since the bootstrap): no slot of the pipeline decodes them", fix=EXTEND)


def node_change(node: object, start: NodeStart, *, system_identifier: str, timeline: int,
                slot_found: bool, wal_status: str | None) -> ClusterChangedError | None:
    """What makes ``node`` (as it answers now) unfit to capture from where its slot was,
    or None: another server in its place, its slot dropped, or its slot invalidated."""
    # A segment is captured again on its own; the coordinator's lost records take the whole pipeline.
    fix = REBOOTSTRAP if start.content == COORDINATOR else (
        f"capture it again with `gpcdc bootstrap repair --segment {start.content}`, or {REBOOTSTRAP}")
    if change := start.replaced_by(system_identifier, timeline):
        return ClusterChangedError(f"{node} {change}; its slot {start.slot} and the changes committed there after the "
                                   "slot's acknowledged position are not on this server's stream", fix=fix)
    if not slot_found:
        return ClusterChangedError(f"slot {start.slot} is missing on {node}: it was dropped, so the changes since its "
                                   "acknowledged position can no longer be decoded", fix=fix)
    if wal_status == "lost":
        return ClusterChangedError(f"slot {start.slot} on {node} was invalidated: the WAL it still needed was removed "
                                   "(the slot fell further behind than max_slot_wal_keep_size)", fix=fix)
    return None
