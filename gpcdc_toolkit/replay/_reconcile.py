"""A repaired segment's rows put in place on the target (see ``capture/_repair.py``).

The target does not keep the source's placement, but the source's placement is a
function of the distribution key (``cluster/_routing.py``): the target's rows whose
key the source places on the repaired segment are exactly the rows that segment held,
as far as the stream told. They are deleted and the repair's copy, the segment's rows
at the cut, inserted in their place, inside the target transaction that also applies
every transaction whose part on the segment the copy stands for.
"""

from __future__ import annotations

from pathlib import Path

from psycopg import sql

from .._sql import Name
from ..bootstrap import InitialSnapshot
from ..cluster import Cluster, Writes
from ..cluster._routing import segment_for
from ..errors import StreamError
from ._load import load_rows
from ._order import RepairMark


def reconcile(tx: Writes, target: Cluster, mark: RepairMark, directory: Path) -> tuple[int, int]:
    """Replace, in ``tx``, the target's rows of the repaired segment by the repair's copy
    in ``directory``; returns (distribution keys deleted, rows inserted)."""
    if not (directory / "manifest.json").is_file():
        raise StreamError(f"the stream marks repair {mark.number} of segment {mark.segment}, but its copied rows are "
                          f"not in {directory}",
                          fix="replay with the work_dir where `gpcdc bootstrap repair` (or `extend`) ran")
    copy = InitialSnapshot(directory)
    cut = copy.manifest["cut"]
    if (cut["xmax"], frozenset(cut["in_progress"])) != (mark.snapshot.xmax, mark.snapshot.in_progress):
        raise StreamError(f"the copied rows in {directory} are of another cut (xmax {cut['xmax']}) than the one repair "
                          f"{mark.number} of segment {mark.segment} marked at offset {mark.offset} (xmax "
                          f"{mark.snapshot.xmax}): a repair failed after marking the stream",
                          fix=f"run what wrote the mark again: `gpcdc bootstrap repair --segment {mark.segment}`, or "
                              "`gpcdc bootstrap extend` for a segment added since the bootstrap")
    segments = int(copy.manifest["placement"]["segments"])
    writers = sorted({target.writer_of(node.content) for node in target.segments} or {target.writer_of(-1)})
    deleted = 0
    for table in copy.tables:
        key = copy.manifest["tables"][table]["distribution_key"]
        info = tx.session.table(table)
        query = sql.SQL("SELECT DISTINCT {} FROM {}").format(sql.SQL(", ").join(map(Name, key)),
                                                             info.identifier)
        held = {tuple(row) for writer in writers for row in tx.execute(writer, query)}
        gone = [dict(zip(key, values)) for values in held if segment_for(values, segments) == mark.segment]
        tx.delete_keys(table, [k for k in gone if None not in k.values()])
        for null_key in (k for k in gone if None in k.values()):  # = never matches a NULL
            where = sql.SQL(" AND ").join(sql.SQL("{} IS NOT DISTINCT FROM %s").format(Name(c)) for c in key)
            tx.execute(tx.route(info, null_key), sql.SQL("DELETE FROM {} WHERE {}").format(info.identifier, where),
                       list(null_key.values()))
        deleted += len(gone)
    return deleted, load_rows(tx, copy)
