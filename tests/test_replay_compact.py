"""Folding a batch's row events into each row's net effect (no servers)."""

import contextlib
import random

import pytest

from gpcdc_toolkit.replay._apply import Applier, ApplyError
from gpcdc_toolkit.replay._compact import compact

KEYS = {("public", "t"): ("id",), ("public", "nokey"): ()}


def event(op, after=None, before=None, table="t", unchanged=()):
    e = {"op": op, "after": after, "before": before, "source": {"schema": "public", "table": table, "gxid": 1}}
    if unchanged:  # as capture writes it: the columns are left out of "after" and listed
        e["after"] = {c: v for c, v in after.items() if c not in unchanged}
        e["unchanged"] = list(unchanged)
    return e


def apply_in_order(rows, events):
    for e in events:
        if e["op"] == "c":
            rows[e["after"]["id"]] = dict(e["after"])
        elif e["op"] == "d":
            rows.pop(e["before"]["id"])
        else:
            old = (e["before"] or e["after"])["id"]
            rows[e["after"]["id"]] = {**rows.pop(old), **e["after"]}
    return rows


def apply_compacted(rows, changes):
    (t,) = changes
    for key in t.deletes:
        rows.pop(key["id"], None)
    for row in t.upserts + t.inserts:
        rows[row["id"]] = dict(row)
    for key, values in t.updates:
        if key["id"] in rows:
            rows[key["id"]] = {**rows[key["id"]], **values}
    return apply_in_order(rows, t.ordered)


def test_hot_key_updates_fold_into_one_upsert():
    events = [event("u", {"id": 1, "v": n, "big": "x"}) for n in range(5)]
    (t,) = compact(events, KEYS)
    assert t.upserts == [{"id": 1, "v": 4, "big": "x"}] and not (t.deletes or t.inserts or t.updates or t.ordered)


def test_insert_then_delete_leaves_a_delete_and_a_move_deletes_the_old_key():
    (t,) = compact([event("c", {"id": 1, "v": 0}), event("d", before={"id": 1}),
                    event("u", {"id": 3, "v": 1}, before={"id": 2})], KEYS)
    assert t.deletes == [{"id": 1}, {"id": 2}] and t.inserts == [{"id": 3, "v": 1}] and not t.upserts
    assert [(key["id"], held) for key, held, _ in t.before] == [(1, False), (2, True), (3, False)]


def test_an_unchanged_toast_value_is_kept_from_the_row_or_left_alone():
    (t,) = compact([event("c", {"id": 1, "v": 0, "big": "x"}), event("u", {"id": 1, "v": 1, "big": 0}, unchanged=["big"]),
                    event("u", {"id": 2, "v": 5, "big": 0}, unchanged=["big"])], KEYS)
    assert t.inserts == [{"id": 1, "v": 1, "big": "x"}] and t.updates == [({"id": 2}, {"v": 5})] and not t.upserts


def test_a_move_that_needs_the_target_row_keeps_the_table_in_order():
    events = [event("u", {"id": 1, "v": 1}), event("u", {"id": 9, "v": 2, "big": 0}, before={"id": 2}, unchanged=["big"])]
    (t,) = compact(events, KEYS)
    assert t.ordered == events and not (t.upserts or t.inserts or t.deletes or t.updates)


def test_a_table_without_a_key_keeps_its_events_in_order():
    events = [event("c", {"a": 1}, table="nokey"), event("d", before={"a": 1}, table="nokey")]
    (t,) = compact(events, KEYS)
    assert t.ordered == events


@pytest.mark.parametrize("seed", range(100))
def test_the_net_effect_equals_applying_every_event_in_order(seed):
    rng = random.Random(seed)
    start = {k: {"id": k, "v": 0, "big": f"b{k}"} for k in range(0, 12, 2)}
    model = {k: dict(r) for k, r in start.items()}
    events = []
    for _ in range(rng.randint(1, 40)):
        present, absent = sorted(model), [k for k in range(12) if k not in model]
        choice = rng.random()
        if absent and (choice < 0.3 or not present):
            k = rng.choice(absent)
            e = event("c", {"id": k, "v": rng.randint(0, 9), "big": f"n{k}"})
        elif choice < 0.5:
            e = event("d", before={"id": rng.choice(present)})
        elif choice < 0.65 and absent:
            old, new = rng.choice(present), rng.choice(absent)
            unchanged = ["big"] if rng.random() < 0.3 else []
            e = event("u", {"id": new, "v": rng.randint(0, 9), "big": "moved"}, before={"id": old}, unchanged=unchanged)
        else:
            k = rng.choice(present)
            unchanged = ["big"] if rng.random() < 0.5 else []
            e = event("u", {"id": k, "v": rng.randint(0, 9), "big": f"u{k}"}, unchanged=unchanged)
        events.append(e)
        apply_in_order(model, [e])
    changes = compact(events, KEYS)
    folded = apply_compacted({k: dict(r) for k, r in start.items()}, changes)
    assert folded == model
    (t,) = changes
    if not t.ordered:  # folded: each key it writes says whether the source held it before
        assert {key["id"]: had for key, had, _ in t.before} == {k: k in start for k in touched(events)}
        assert {r["id"] for r in t.upserts} <= set(start) and not {r["id"] for r in t.inserts} & set(start)
    # The replayer's own checks, on a target as the source was: never refused, and the
    # batch leaves the source's rows.
    assert replayed(start, t) == (False, model)
    # On a target that lost a row outside the pipeline, or gained one, the checks refuse
    # the batch exactly where applying each event in order would have failed, but for a
    # gained key the source inserted and deleted in the batch: deleted, as the source's.
    k = rng.randrange(12)
    target = {key: dict(r) for key, r in start.items() if key != k}
    if k not in start:
        target[k] = {"id": k, "v": 0, "big": "outside"}
    refused, rows = replayed(target, t)
    if not t.ordered and k not in start and {"id": k} in t.deletes:
        assert not refused and rows == model
    else:
        assert refused == failed_in_order(target, events)


def touched(events):
    keys = set()
    for e in events:
        keys |= {image["id"] for image in (e["before"], e["after"]) if image is not None}
    return keys


class _Taken(Exception):
    pass


class FakeWrites:
    """One table's rows by id, written as ``Writes`` writes them, each write telling
    what it found."""

    def __init__(self, rows):
        self.rows = {k: dict(r) for k, r in rows.items()}

    def held(self, _table, keys):
        return [key["id"] in self.rows for key in keys]

    def delete_keys(self, _table, keys):
        return [self.rows.pop(key["id"], None) is not None for key in keys]

    def upsert(self, _table, rows):
        self.rows.update({row["id"]: dict(row) for row in rows})

    def insert(self, _table, rows):
        for row in rows:
            if row["id"] in self.rows:
                raise _Taken(row["id"])  # the primary key's violation
            self.rows[row["id"]] = dict(row)

    def update(self, _table, key, values):
        if key["id"] not in self.rows:
            return 0
        self.rows[key["id"]].update(values)
        return 1


def replayed(rows, changes):
    """(refused, the rows left) by the replayer's checks and writes of a folded batch
    (or, for a table kept in order, by applying its events one by one)."""
    if changes.ordered:
        if failed_in_order(rows, changes.ordered):
            return True, None
        return False, apply_in_order({k: dict(r) for k, r in rows.items()}, changes.ordered)
    applier = object.__new__(Applier)  # only its checks and writes, no target
    applier._key_taken = lambda _table: contextlib.nullcontext()
    target = FakeWrites(rows)
    try:
        applier._apply_folded(target, changes)
    except (ApplyError, _Taken):
        return True, None
    return False, target.rows


def failed_in_order(rows, events):
    """Whether an update or a delete, applied in order, finds no row to change, or an
    insert (or an update moving a row onto another key) finds its key taken."""
    rows = {k: dict(r) for k, r in rows.items()}
    for e in events:
        old = None if e["op"] == "c" else (e["before"] or e["after"])["id"]
        new = None if e["op"] == "d" else e["after"]["id"]
        if (old is not None and old not in rows) or (new is not None and new != old and new in rows):
            return True
        apply_in_order(rows, [e])
    return False
