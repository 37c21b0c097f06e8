"""Chunks of a table and their bisection (pure).

Each database hashes every row to 64 bits (``_checksum`` says how); a row's chunk is a
prefix of its hash. Level 0 is the whole table; a level ``n`` chunk is the top
``16 * n`` bits, so each chunk splits into 65,536 at the next level. Chunks do not
depend on where a row lives, so a source and a target with different segment counts
cut a table alike. A changed row falls in one chunk on the source and another on the
target: both differ, and the rows of both are fetched from both sides, so the row
diff still meets both versions.

Per chunk, each node reports a *digest*: its row count and the sum of its rows' hashes.
Summed over the nodes (modulo 2**64) it does not depend on row order or placement, and
it counts duplicates, so tables without a key compare as multisets. A round's digests
are keyed by the chunks' prefixes at the level asked for. :func:`bisect` is a
generator: it asks for the digests of chunks at a level, is sent both sides' digests,
descends into the chunks that differ, and returns the chunks whose rows are few enough
to fetch and diff. Equal tables take one round: one digest per node.

Where every node computes the first level's digests in one pass (the sandbox's
``gp_dist.chunk_digests``), they arrive as bytes (:data:`CHUNK_DIGEST`), are summed
over the nodes as arrays, and only the chunks that differ are sent to bisection
(:func:`first_level`). Each digest there also holds the XOR of its rows' keys, for a
table keyed by one integer column: where one side's chunk holds exactly one row more
than the other's, that row is likely the chunk's only difference, and both sides' XORs
together are its key (:class:`LoneRow`). The row is then looked up by its key on both
sides, and the guess proven by its hash: its chunk's digests, that row taken away,
are equal (:func:`settled`). Such chunks leave bisection, and their rows are never
looked for by reading the table again.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

BITS = 16  # per level
LEVELS = 64 // BITS
MOD = 1 << 64


@dataclass(frozen=True, order=True)
class Chunk:
    level: int  # 0 (the whole table) to LEVELS
    prefix: int  # the top level * BITS bits of the row hash, as an unsigned number

    def __post_init__(self) -> None:
        if not 0 <= self.level <= LEVELS:
            raise ValueError(f"a chunk's level is 0 to {LEVELS}, not {self.level}")
        if not 0 <= self.prefix < 1 << (self.level * BITS):
            raise ValueError(f"prefix {self.prefix} does not fit level {self.level}")

    @property
    def shift(self) -> int:
        """How far to shift the 64-bit hash right to get this level's prefix."""
        return 64 - self.level * BITS

    def parent(self) -> Chunk | None:
        return None if self.level == 0 else Chunk(self.level - 1, self.prefix >> BITS)


class Digest(NamedTuple):
    rows: int = 0
    checksum: int = 0  # sum of row hashes, modulo 2**64


EMPTY = Digest()

# A level's digests on one side, by chunk prefix: tens of thousands of chunks each
# round, so plain integers and tuples rather than a Chunk apiece.
Digests = Mapping[int, Digest]


def summed(per_node: Iterable[Iterable[tuple[int, int, int]]]) -> dict[int, Digest]:
    """The digests of every node added up, chunk by chunk: each node's (prefix, rows,
    sum of hashes) triples of one level."""
    rows: dict[int, int] = {}
    sums: dict[int, int] = {}
    for triples in per_node:
        for prefix, count, checksum in triples:
            rows[prefix] = rows.get(prefix, 0) + count
            sums[prefix] = sums.get(prefix, 0) + checksum
    return {prefix: Digest(count, sums[prefix] % MOD) for prefix, count in rows.items()}


def differing(source: Digests, target: Digests) -> list[int]:
    """Prefixes of the chunks whose digests differ (a chunk one side lacks has no rows there)."""
    return sorted({prefix for prefix, _digest in source.items() ^ target.items()})


Request = tuple[int, tuple[Chunk, ...]]  # a level, and the chunks of the level above to look inside
Reply = tuple[Digests, Digests]  # (source, target): the requested level's digests, summed over nodes


def bisect(fetch_rows: int) -> Generator[Request, Reply, list[Chunk]]:
    """Bisect a table: yields (level, parents) to measure, is sent both sides' digests
    of the chunks at that level within those parents, and returns the differing chunks
    holding at most ``fetch_rows`` rows on either side (or at the last level, any). A
    reply may leave out chunks whose digests both sides agree on."""
    if fetch_rows < 1:
        raise ValueError(f"fetch_rows must be at least 1, not {fetch_rows}")
    to_fetch: list[Chunk] = []
    parents: tuple[Chunk, ...] = ()
    for level in range(LEVELS + 1):
        source, target = yield level, parents
        deeper: list[Chunk] = []
        for prefix in differing(source, target):
            rows = max(source.get(prefix, EMPTY).rows, target.get(prefix, EMPTY).rows)
            (to_fetch if rows <= fetch_rows or level == LEVELS else deeper).append(Chunk(level, prefix))
        if not deeper:
            break
        parents = tuple(deeper)
    return sorted(to_fetch)


# A node's digests of the first level's chunks that hold rows, as ``gp_dist.chunk_digests``
# returns them: 26 bytes each, in network order.
CHUNK_DIGEST = np.dtype([("prefix", ">u2"), ("rows", ">i8"), ("sum", ">u8"), ("keys", ">u8")])


class LoneRow(NamedTuple):
    """What a first-level chunk's digests say of its one extra row, if it has no other
    difference: the side that holds it (0 the source, 1 the target), its key, its hash."""

    side: int
    key: int  # as the key column holds it: signed 64 bits
    hash: int  # unsigned


@dataclass(frozen=True)
class FirstLevel:
    """Both sides' first-level digests, summed over their nodes: what bisection is sent,
    reduced to the chunks that differ, how many chunks hold rows on either side, and,
    for a keyed table, the chunks where one side holds one row more (:class:`LoneRow`)."""

    reply: Reply
    chunks: int
    lone: dict[int, LoneRow] = field(default_factory=dict)


def _dense(replies: Iterable[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = np.zeros(1 << BITS, dtype=np.int64)
    sums = np.zeros(1 << BITS, dtype=np.uint64)
    keys = np.zeros(1 << BITS, dtype=np.uint64)
    for node, reply in enumerate(replies):
        if len(reply) % CHUNK_DIGEST.itemsize:
            raise ValueError(f"node {node}'s chunk digests hold {len(reply)} bytes, not a multiple of "
                             f"{CHUNK_DIGEST.itemsize}")
        digests = np.frombuffer(reply, dtype=CHUNK_DIGEST)
        if len(digests) and (np.any(np.diff(digests["prefix"].astype(np.int64)) <= 0) or np.any(digests["rows"] < 1)):
            raise ValueError(f"node {node}'s chunk digests are not one per chunk holding rows, in prefix order")
        rows[digests["prefix"]] += digests["rows"]
        sums[digests["prefix"]] += digests["sum"]  # unsigned: modulo 2**64
        keys[digests["prefix"]] ^= digests["keys"]
    return rows, sums, keys


def _int64(value: int) -> int:
    return value - MOD if value >= 1 << 63 else value


def first_level(source: Iterable[bytes], target: Iterable[bytes], keyed: bool = False) -> FirstLevel:
    """Each side's nodes' replies of ``gp_dist.chunk_digests`` summed, compared;
    ``keyed``: the digests' keys are a key column's, and the lone rows are worked out."""
    (source_rows, source_sums, source_keys), (target_rows, target_sums, target_keys) = _dense(source), _dense(target)
    differ = np.flatnonzero((source_rows != target_rows) | (source_sums != target_sums))
    reply = tuple({int(p): Digest(int(rows[p]), int(sums[p])) for p in differ if rows[p]}
                  for rows, sums in ((source_rows, source_sums), (target_rows, target_sums)))
    both: Reply = (reply[0], reply[1])
    lone = lone_rows(both, {int(p): int(source_keys[p] ^ target_keys[p]) for p in differ}) if keyed else {}
    return FirstLevel(both, int(np.count_nonzero(source_rows + target_rows)), lone)


def xored(per_node: Iterable[Iterable[tuple[int, int]]]) -> dict[int, int]:
    """The XOR of the keys of every node's rows, chunk by chunk: (prefix, XOR of its
    keys) pairs, of one side's nodes or of both sides'."""
    keys: dict[int, int] = {}
    for pairs in per_node:
        for prefix, xor in pairs:
            keys[prefix] = keys.get(prefix, 0) ^ (xor % MOD)
    return keys


def lone_rows(reply: Reply, keys: Mapping[int, int]) -> dict[int, LoneRow]:
    """The chunks of ``reply`` where one side holds exactly one row more than the other,
    with what their digests say of that row if it is the chunk's only difference.
    ``keys``: per chunk, the XOR of both sides' keys (unsigned)."""
    lone = {}
    for prefix in differing(*reply):
        source, target = reply[0].get(prefix, EMPTY), reply[1].get(prefix, EMPTY)
        apart = source.rows - target.rows
        if apart in (1, -1):
            lone[prefix] = LoneRow(0 if apart == 1 else 1, _int64(keys.get(prefix, 0)),
                                   (source.checksum - target.checksum) * apart % MOD)
    return lone


def settled(lone: Mapping[int, LoneRow], found: tuple[Mapping[int, list[int]], Mapping[int, list[int]]]) -> set[int]:
    """The chunks of ``lone`` proven to differ by their lone row alone. ``found``: per
    side, the hashes of the rows its nodes hold under each key looked up. A chunk is
    settled when the side that holds one row more holds exactly one row under the key,
    in this chunk, whose hash is the chunk's difference of sums: that row taken away,
    the chunk's count and sum are equal on both sides, the test every other chunk
    passes. A chunk with other differences gives a key made of several rows' keys,
    which names no row or one that fails the test."""
    return {prefix for prefix, row in lone.items()
            if found[row.side].get(row.key) == [row.hash] and row.hash >> (64 - BITS) == prefix}


def without(reply: Reply, prefixes: Iterable[int]) -> Reply:
    """``reply`` with ``prefixes`` left out of both sides: agreed on, to bisection."""
    gone = set(prefixes)
    source, target = ({p: d for p, d in side.items() if p not in gone} for side in reply)
    return source, target
