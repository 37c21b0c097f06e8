"""Chunks of a key space and their bisection (no servers): whatever the tables, the
chunks bisection hands out hold every differing row, and no more rows than asked
unless they cannot be split further."""

import hashlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpcdc_toolkit.validate._chunks import (
    BITS,
    LEVELS,
    MOD,
    Chunk,
    Digest,
    LoneRow,
    bisect,
    differing,
    first_level,
    settled,
    summed,
    without,
    xored,
)


def h64(text):
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def row_hash(table, key):
    return h64(f"{key}|{table[key]}")


def digests(table, level, parents):
    """A side's digests at a level within parents, as the databases compute them, each
    key a node of its own."""
    per_node = []
    for key in table:
        chunk = Chunk(level, row_hash(table, key) >> (64 - level * BITS))
        if not parents or chunk.parent() in parents:
            per_node.append([(chunk.prefix, 1, row_hash(table, key))])
    return summed(per_node)


def one_pass(per_node):
    """A node's first-level digests as ``gp_dist.chunk_digests`` returns them: (prefix,
    rows, sum) or (prefix, rows, sum, XOR of keys)."""
    return b"".join(struct.pack(">HqQQ", prefix, rows, total % MOD, keys[0] % MOD if keys else 0)
                    for prefix, rows, total, *keys in sorted(per_node))


def nodes_of(table, nodes):
    """Each node's first-level digests, the rows dealt out to ``nodes`` nodes by key."""
    dealt = [summed([[(row_hash(table, k) >> (64 - BITS), 1, row_hash(table, k))] for k in table
                     if int(h64(k)) % nodes == n]) for n in range(nodes)]
    return [one_pass((p, d.rows, d.checksum) for p, d in node.items()) for node in dealt]


def run(source, target, fetch_rows, one_pass=False):
    steps = bisect(fetch_rows)
    request = next(steps)
    try:
        while True:
            level, parents = request
            if level == 1 and one_pass:  # each side's rows on nodes of its own count, only differing chunks sent
                request = steps.send(first_level(nodes_of(source, 3), nodes_of(target, 2)).reply)
            else:
                request = steps.send((digests(source, level, set(parents)), digests(target, level, set(parents))))
    except StopIteration as done:
        return done.value


tables = st.dictionaries(st.text(max_size=6), st.integers(0, 3), max_size=300)


def edited(source, data, new_keys, edits, added):
    """The target: the source with up to ``edits`` rows deleted or changed, and up to
    ``added`` rows of ``new_keys`` added."""
    target = dict(source)
    for key in data.draw(st.lists(st.sampled_from(sorted(source)), max_size=edits)) if source else []:
        if data.draw(st.booleans()):
            target.pop(key, None)
        else:
            target[key] = source[key] + 1
    for key in data.draw(st.lists(new_keys, max_size=added)):
        target.setdefault(key, 9)
    return target


@given(tables, st.data(), st.integers(1, 50), st.booleans())
def test_bisection_hands_out_every_differing_row_in_small_chunks(source, data, fetch_rows, one_pass):
    target = edited(source, data, st.text(max_size=6), edits=5, added=3)
    chunks = run(source, target, fetch_rows, one_pass)
    changed = {k for k in set(source) | set(target) if source.get(k) != target.get(k)}
    # Every version of a differing row, on either side, is in a chunk handed out.
    for side in (source, target):
        versions = {k for k in changed if k in side}
        assert versions == {k for k in versions if any(row_hash(side, k) >> c.shift == c.prefix for c in chunks)}
    assert bool(chunks) == bool(changed)
    for chunk in chunks:
        rows = max(sum(1 for k in t if row_hash(t, k) >> chunk.shift == chunk.prefix) for t in (source, target))
        assert rows <= fetch_rows or chunk.level == LEVELS


def test_equal_tables_need_one_round_and_nothing_fetched():
    table = {str(i): i for i in range(1000)}
    steps = bisect(10)
    assert next(steps) == (0, ())
    with pytest.raises(StopIteration) as done:
        steps.send((digests(table, 0, set()), digests(table, 0, set())))
    assert done.value.value == []


def test_digests_add_up_over_nodes_modulo_two_to_the_64():
    total = summed([[(3, 1, MOD - 1)], [(3, 2, 5), (4, 1, 1)], [(4, 1, -1)]])
    assert total == {3: Digest(3, 4), 4: Digest(2, 0)}
    assert differing({3: Digest(1, 1)}, {}) == [3]
    assert differing({3: Digest(1, 1), 4: Digest(2, 2)}, {4: Digest(2, 2), 3: Digest(1, 2)}) == [3]


def test_the_first_level_in_one_pass_sums_nodes_modulo_two_to_the_64_and_keeps_what_differs():
    measured = first_level([one_pass([(3, 1, MOD - 1), (9, 2, 4)]), one_pass([(3, 2, 5)]), b""],
                           [one_pass([(3, 3, 4), (7, 1, 1)]), one_pass([(9, 1, 2), (9 + (1 << 15), 1, 2)])])
    assert measured.chunks == 4  # 3, 7, 9 and 32777 hold rows somewhere
    # Chunk 3 agrees (3 rows, 4 modulo 2**64), so only the others are sent to bisection.
    assert measured.reply == ({9: Digest(2, 4)}, {7: Digest(1, 1), 9: Digest(1, 2), 32777: Digest(1, 2)})
    equal = first_level([one_pass([(0, 1, 1), (65535, 1, MOD - 1)])], [one_pass([(0, 1, 1)]), one_pass([(65535, 1, -1)])])
    assert equal.reply == ({}, {}) and equal.chunks == 2


@pytest.mark.parametrize("reply, said", [
    (b"\x00" * 25, "node 0's chunk digests hold 25 bytes, not a multiple of 26"),
    (struct.pack(">HqQQHqQQ", 5, 1, 1, 0, 5, 1, 1, 0), "not one per chunk holding rows, in prefix order"),
    (struct.pack(">HqQQHqQQ", 6, 1, 1, 0, 5, 1, 1, 0), "not one per chunk holding rows, in prefix order"),
    (struct.pack(">HqQQ", 5, 0, 0, 0), "not one per chunk holding rows, in prefix order"),
])
def test_malformed_chunk_digests_are_refused(reply, said):
    with pytest.raises(ValueError, match=said):
        first_level([reply], [])


def test_chunks_and_bisection_refuse_what_cannot_be():
    with pytest.raises(ValueError, match="level is 0 to 4, not 5"):
        Chunk(5, 0)
    with pytest.raises(ValueError, match="prefix 65536 does not fit level 1"):
        Chunk(1, 1 << 16)
    with pytest.raises(ValueError, match="fetch_rows must be at least 1, not 0"):
        next(bisect(0))


# -- lone rows: a chunk's one extra row looked up by its key ------------------------------

def crowded_hash(table, key, chunks):
    """A row's hash whose chunk is one of the first ``chunks``: chunks crowded with
    differences, where the XOR of keys is often several keys' and names another row."""
    low = row_hash(table, key) & ((1 << (64 - BITS)) - 1)
    return (row_hash(table, key) % chunks) << (64 - BITS) | low


def keyed_nodes(table, chunks, nodes):
    """Each node's first-level digests with the XOR of its keys, rows dealt out by key."""
    per_node = []
    for n in range(nodes):
        digests = {}
        for key in table:
            if key % nodes == n:
                h = crowded_hash(table, key, chunks)
                rows, total, keys = digests.get(h >> (64 - BITS), (0, 0, 0))
                digests[h >> (64 - BITS)] = (rows + 1, (total + h) % MOD, keys ^ (key % MOD))
        per_node.append(one_pass((p, *d) for p, d in digests.items()))
    return per_node


def looked_up(table, chunks, keys):
    """What a side's nodes hold under each key looked up: the rows' hashes."""
    return {k: [crowded_hash(table, k, chunks)] for k in keys if k in table}


# Small keys, whose XORs are often other keys of the table; and the extremes of bigint.
integer_tables = st.dictionaries(st.integers(0, 15) | st.integers(-8, 40) | st.sampled_from([-(2**63), 2**63 - 1]),
                                 st.integers(0, 3), max_size=40)


@settings(max_examples=400)
@given(integer_tables, st.data(), st.integers(1, 8))
def test_a_settled_chunk_differs_by_its_lone_row_alone_and_every_differing_key_is_found(source, data, chunks):
    target = edited(source, data, st.integers(-8, 60), edits=8, added=4)
    measured = first_level(keyed_nodes(source, chunks, 3), keyed_nodes(target, chunks, 2), keyed=True)
    asked = {row.key for row in measured.lone.values()}
    done = settled(measured.lone, (looked_up(source, chunks, asked), looked_up(target, chunks, asked)))
    sides = (source, target)
    for prefix in done:  # the proof holds: that row taken away, the chunk is alike on both sides
        row = measured.lone[prefix]
        inside = [{k: v for k, v in side.items() if crowded_hash(side, k, chunks) >> (64 - BITS) == prefix}
                  for side in sides]
        assert row.key in inside[row.side] and crowded_hash(sides[row.side], row.key, chunks) == row.hash
        del inside[row.side][row.key]
        assert inside[0] == inside[1]
    # Every differing key is settled (looked up on both sides) or has each version in a
    # chunk still differing, which bisection goes on with.
    left = without(measured.reply, done)
    remaining = set(differing(*left))
    found = {measured.lone[p].key for p in done}
    for key in {k for k in set(source) | set(target) if source.get(k) != target.get(k)}:
        assert key in found or all(crowded_hash(side, key, chunks) >> (64 - BITS) in remaining
                                   for side in sides if key in side)
    assert set(differing(*measured.reply)) == remaining | done


def test_lone_rows_are_worked_out_only_for_a_keyed_table_and_only_one_row_apart():
    source = [one_pass([(1, 2, 10, 5 ^ 6), (2, 1, 7, 3), (3, 3, 9, 1)])]
    target = [one_pass([(1, 1, 4, 6), (2, 2, 7 + 11, 3 ^ 4), (3, 1, 2, 1)])]
    measured = first_level(source, target, keyed=True)
    # Chunk 1: the source holds key 5 more, hash 6; chunk 2: the target key 4, hash 11; chunk 3: two rows apart.
    assert measured.lone == {1: LoneRow(0, 5, 6), 2: LoneRow(1, 4, 11)}
    assert first_level(source, target).lone == {}
    negative = first_level([one_pass([(1, 1, 5, -3)])], [b""], keyed=True)
    assert negative.lone == {1: LoneRow(0, -3, 5)}
    # Proven only by the row the key names, with the chunk's difference as its hash, in that chunk.
    lone = {1: LoneRow(0, 5, 6 | 1 << 48)}
    assert settled(lone, ({5: [6 | 1 << 48]}, {})) == {1}
    assert settled(lone, ({5: [7 | 1 << 48]}, {})) == set()  # another hash: other rows differ too
    assert settled(lone, ({5: [6 | 1 << 48, 6 | 1 << 48]}, {})) == set()  # the key twice on that side
    assert settled(lone, ({}, {5: [6 | 1 << 48]})) == set()  # on the other side
    assert settled({2: LoneRow(0, 5, 6 | 1 << 48)}, ({5: [6 | 1 << 48]}, {})) == set()  # the row is in chunk 1


def test_keys_are_xored_over_nodes_and_sides_modulo_two_to_the_64():
    assert xored([[(1, 5), (2, -1)], [(1, 3)], []]) == {1: 6, 2: MOD - 1}
    assert xored([[(7, -(2**63))], [(7, -(2**63))]]) == {7: 0}  # a key on both sides cancels
