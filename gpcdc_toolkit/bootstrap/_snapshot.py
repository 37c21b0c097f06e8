"""The initial snapshot: every distributed table, node by node, as of the start point.

Files are PostgreSQL's COPY text format, one per table and segment, under
``<pipeline dir>/snapshot/``, with ``manifest.json`` naming the tables, their column
types and the files. Values are read back into the same Python values the capture
stream gives (:func:`gpcdc_toolkit.protocol.convert`), so snapshot and stream compare
as equals.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from .._sql import Name
from ..cluster import Cluster, Table
from ..protocol import DECODING_SETTINGS, convert

_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}


def distributed_tables(cluster: Cluster) -> list[Table]:
    return [cluster.table(name) for name in cluster.table_names()]


def _type_oids(conn: psycopg.Connection[Any], table: Table) -> list[int]:
    return [r[0] for r in conn.execute(
        "SELECT atttypid::int FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
        "AND NOT attisdropped AND attgenerated = '' ORDER BY attnum", (table.name,))]


def export_tables(conn: psycopg.Connection[Any], content: int, tables: list[tuple[Table, sql.Composable]],
                  directory: Path, manifest: dict[str, Any]) -> None:
    """COPY every table's rows on a node from ``conn`` (in a transaction already in the
    snapshot to export: the text settings are set for it alone) into files. Each table
    comes with what holds its rows there (the table, or a Citus worker's shards:
    ``Cluster.relation``)."""
    node_dir = directory / f"seg{content}"
    node_dir.mkdir(parents=True, exist_ok=True)
    # Values as the stream's text has them, whatever the server, the role or this host
    # would set: a date of 'SQL, DMY' would be read as another day, a float of
    # extra_float_digits = 0 rounded.
    for name, value in DECODING_SETTINGS.items():
        conn.execute(f"SET LOCAL {name} = '{value}'")
    for table, relation in tables:
        entry = manifest["tables"].setdefault(table.name, {
            "schema": table.parts[0], "name": table.parts[1], "columns": list(table.columns),
            "generated": dict(table.generated), "defaults": dict(table.defaults), "types": list(table.types),
            "type_oids": _type_oids(conn, table),
            "distribution_key": list(table.distribution_key), "primary_key": list(table.primary_key), "files": {},
        })
        path = node_dir / _file_name(table)
        rows = 0
        # The columns named: generated ones are the server's to compute.
        with path.open("wb") as f, conn.cursor().copy(sql.SQL("COPY (SELECT {} FROM {} t) TO STDOUT").format(
            sql.SQL(", ").join(map(Name, table.writable)), relation)
        ) as copy:
            for chunk in copy:
                f.write(chunk)
                rows += bytes(chunk).count(b"\n")
        entry["files"][str(content)] = {"path": str(path.relative_to(directory)), "rows": rows}


def _file_name(table: Table) -> str:
    """A file name for any table name (which may hold slashes, quotes, anything)."""
    digest = hashlib.blake2b(table.name.encode(), digest_size=4).hexdigest()
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', table.name)[:60]}-{digest}.copy"


def write_manifest(directory: Path, manifest: Mapping[str, Any]) -> None:
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def _unescape(field: str) -> str | None:
    if field == "\\N":
        return None
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        c = field[i]
        if c == "\\" and i + 1 < len(field):
            out.append(_ESCAPES.get(field[i + 1], field[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def read_copy_file(path: Path, type_oids: list[int]) -> Iterator[tuple[Any, ...]]:
    """Rows of a COPY text-format file, with values converted as the stream converts them."""
    with path.open(encoding="utf-8", newline="\n") as f:
        for line in f:
            fields = line[:-1].split("\t")
            yield tuple(convert(oid, _unescape(v)) for oid, v in zip(type_oids, fields))


class InitialSnapshot:
    """An exported initial snapshot, read back per table and segment."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        manifest_path = self.directory / "manifest.json"
        if not manifest_path.is_file():
            from ..errors import GpcdcError

            raise GpcdcError(f"no initial snapshot in {self.directory}", fix="run `gpcdc bootstrap create` first")
        self.manifest = json.loads(manifest_path.read_text())

    @property
    def tables(self) -> list[str]:
        return sorted(self.manifest["tables"])

    def columns(self, table: str) -> list[str]:
        """The columns of the table's rows: all but generated ones."""
        entry = self.manifest["tables"][table]
        return [c for c in entry["columns"] if c not in entry.get("generated", {})]

    def rows(self, table: str, segment: int | None = None) -> Iterator[tuple[Any, ...]]:
        """Rows of a table (of one segment, or of all), as the stream's value types."""
        entry = self.manifest["tables"][table]
        for content, file in sorted(entry["files"].items(), key=lambda kv: int(kv[0])):
            if segment is None or int(content) == segment:
                yield from read_copy_file(self.directory / file["path"], entry["type_oids"])

    def row_counts(self, table: str) -> dict[int, int]:
        return {int(c): f["rows"] for c, f in self.manifest["tables"][table]["files"].items()}

    def to_pandas(self, table: str) -> Any:
        """One table as a pandas DataFrame, with a ``gp_segment_id`` column."""
        import pandas as pd

        entry = self.manifest["tables"][table]
        frames = []
        for content in sorted(int(c) for c in entry["files"]):
            frame = pd.DataFrame(list(self.rows(table, content)), columns=self.columns(table), dtype=object)
            frame["gp_segment_id"] = content
            frames.append(frame)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=self.columns(table))
