"""What the workload does, decided without I/O: transaction plans and the ground truth.

The workload writes two distributed tables:

* ``wl_accounts (id bigint PRIMARY KEY, balance bigint, note text) DISTRIBUTED BY (id)``
* ``wl_events (account_id bigint, seq int, payload text, PRIMARY KEY (account_id, seq))
  DISTRIBUTED BY (account_id)``

Each thread inserts, updates, moves and deletes accounts it created itself, so its
own log order is the commit order for those rows; hot keys (accounts ``1..hot_keys``)
are shared and only ever incremented, which commutes, so the expected final state
follows from the set of committed transactions whatever order they committed in.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..cluster import segment_for

ACCOUNTS = "wl_accounts"
EVENTS = "wl_events"
DDL = (
    f"CREATE TABLE {ACCOUNTS} (id bigint PRIMARY KEY, balance bigint NOT NULL, note text) DISTRIBUTED BY (id)",
    f"CREATE TABLE {EVENTS} (account_id bigint, seq int, payload text, PRIMARY KEY (account_id, seq)) "
    "DISTRIBUTED BY (account_id)",
)
FIRST_OWN_ID = 1_000_000  # ids below are hot keys
THREAD_STRIDE = 1_000_000_000  # each thread allocates ids in its own range of a run


@dataclass(frozen=True)
class WorkloadSpec:
    threads: int = 4
    duration: float | None = 5.0  # seconds; or stop after `transactions`
    transactions: int | None = None
    rate: float | None = None  # target distributed transactions per second, all threads
    rows_per_transaction: int = 10
    multi_segment_share: float = 0.5
    hot_keys: int = 0  # accounts 1..hot_keys, incremented concurrently
    hot_share: float = 0.3  # share of transactions that increment hot keys
    update_share: float = 0.2  # share of operations that update an own account
    delete_share: float = 0.05
    move_share: float = 0.02  # updates that change the distribution key
    abort_share: float = 0.05
    abort_after_prepare_share: float = 0.02
    large_transaction_rows: int = 0  # one transaction of this many rows, first
    legacy_markers: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        shares = {k: getattr(self, k) for k in ("multi_segment_share", "hot_share", "update_share",
                                                  "delete_share", "move_share", "abort_share",
                                                  "abort_after_prepare_share")}
        for name, value in shares.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, not {value}")
        if self.update_share + self.delete_share + self.move_share > 1.0:
            raise ValueError("update_share + delete_share + move_share must not exceed 1")
        if self.threads < 1 or self.rows_per_transaction < 1:
            raise ValueError("threads and rows_per_transaction must be at least 1")
        if self.duration is None and self.transactions is None:
            raise ValueError("give a duration or a number of transactions")
        if self.duration is not None and not 0 < self.duration < math.inf:
            raise ValueError(f"duration must be a positive number of seconds, not {self.duration}")
        if self.transactions is not None and self.transactions < 1:
            raise ValueError(f"transactions must be at least 1, not {self.transactions}")
        for name in ("hot_keys", "large_transaction_rows"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, not {getattr(self, name)}")
        if self.rate is not None and not 0 < self.rate < math.inf:
            raise ValueError(f"rate must be positive, not {self.rate}")


@dataclass(frozen=True)
class Op:
    """One write. ``kind`` is insert, update, move, delete, increment or insert_range."""

    kind: str
    table: str
    key: Mapping[str, Any]
    values: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> list[Any]:
        return [self.kind, self.table, dict(self.key), dict(self.values)]

    @classmethod
    def from_json(cls, data: list[Any]) -> Op:
        kind, table, key, values = data
        return cls(kind, table, key, values)


@dataclass(frozen=True)
class Plan:
    ops: tuple[Op, ...]
    outcome: str  # commit, abort, abort_after_prepare


class ThreadPlanner:
    """Plans one thread's transactions; remembers the accounts that thread owns."""

    def __init__(self, spec: WorkloadSpec, thread: int, segments: int, first_id: int = FIRST_OWN_ID) -> None:
        self.spec = spec
        self.segments = segments
        self.rng = random.Random(spec.seed * 1_000_003 + thread)
        self._next_id = first_id + thread * THREAD_STRIDE
        self.live = _KeySet()  # own accounts, committed
        self.hot_by_segment: dict[int, list[int]] = {}
        for key in range(1, spec.hot_keys + 1):
            self.hot_by_segment.setdefault(segment_for([key], segments), []).append(key)

    def _fresh_id(self, segment: int | None) -> int:
        while True:
            self._next_id += 1
            if segment is None or segment_for([self._next_id], self.segments) == segment:
                return self._next_id

    def next(self) -> Plan:
        spec, rng = self.spec, self.rng
        single = self.segments == 1 or rng.random() >= spec.multi_segment_share
        segment = rng.randrange(self.segments) if single else None
        ops: list[Op] = []
        claimed: set[int] = set()  # own accounts already written by this plan
        for _ in range(spec.rows_per_transaction):
            r = rng.random()
            own = self._pick_own(segment, claimed) if r < spec.update_share + spec.delete_share + spec.move_share else None
            if own is not None:
                claimed.add(own)
            if own is not None and r < spec.update_share:
                ops.append(Op("update", ACCOUNTS, {"id": own}, {"balance": rng.randrange(10**6), "note": f"u{rng.randrange(10**6)}"}))
            elif own is not None and r < spec.update_share + spec.delete_share:
                ops.append(Op("delete", ACCOUNTS, {"id": own}))
            elif own is not None and segment is None:
                new = self._fresh_id(None)
                claimed.add(new)
                ops.append(Op("move", ACCOUNTS, {"id": own}, {"id": new}))
            elif rng.random() < 0.5:
                new = self._fresh_id(segment)
                claimed.add(new)
                ops.append(Op("insert", ACCOUNTS, {"id": new}, {"balance": rng.randrange(10**6), "note": f"n{new}"}))
            else:
                account = self._fresh_id(segment)
                ops.append(Op("insert", EVENTS, {"account_id": account, "seq": 0}, {"payload": f"e{account}-{rng.random():.6f}"}))
        hot = self.hot_by_segment.get(segment, []) if segment is not None else list(range(1, spec.hot_keys + 1))
        if hot and rng.random() < spec.hot_share:
            # Increments in ascending key order everywhere: lock waits can never form a
            # cycle across segments, which no single server could detect.
            for key in sorted(rng.sample(hot, min(2, len(hot)))):
                ops.append(Op("increment", ACCOUNTS, {"id": key}, {"balance": 1}))
        if segment is None and len({self.segment_of(op) for op in ops}) < 2:
            other = (self.segment_of(ops[0]) + 1) % self.segments
            account = self._fresh_id(other)
            ops.append(Op("insert", EVENTS, {"account_id": account, "seq": 0}, {"payload": f"x{account}"}))
        r = rng.random()
        outcome = "abort" if r < spec.abort_share else (
            "abort_after_prepare" if r < spec.abort_share + spec.abort_after_prepare_share else "commit")
        return Plan(tuple(ops), outcome)

    def _pick_own(self, segment: int | None, claimed: set[int]) -> int | None:
        """A committed own account on ``segment`` (any when None) not yet in this plan."""
        for _ in range(4 * self.segments):
            if not self.live:
                return None
            key = self.live.choice(self.rng)
            if key not in claimed and (segment is None or segment_for([key], self.segments) == segment):
                return key
        return None

    def segment_of(self, op: Op) -> int:
        return segment_for([next(iter(op.key.values()))], self.segments)

    def committed(self, plan: Plan) -> None:
        """Record the effect of a committed plan on the accounts this thread owns."""
        for op in plan.ops:
            if op.table != ACCOUNTS or op.kind == "increment":
                continue
            if op.kind == "insert":
                self.live.append(op.key["id"])
            elif op.kind == "delete":
                self.live.remove(op.key["id"])
            elif op.kind == "move":
                self.live.remove(op.key["id"])
                self.live.append(op.values["id"])


class _KeySet:
    """A set with O(1) add, remove and uniform random choice."""

    def __init__(self) -> None:
        self._items: list[int] = []
        self._index: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def append(self, key: int) -> None:
        self._index[key] = len(self._items)
        self._items.append(key)

    def remove(self, key: int) -> None:
        i = self._index.pop(key)
        last = self._items.pop()
        if last != key:
            self._items[i] = last
            self._index[last] = i

    def choice(self, rng: random.Random) -> int:
        return self._items[rng.randrange(len(self._items))]


def large_plan(first_id: int, rows: int) -> Plan:
    return Plan((Op("insert_range", EVENTS, {"account_id": first_id}, {"count": rows}),), "commit")


def first_free_id(highest_existing: int | None) -> int:
    """Where a run's own ids start: past every id a previous run used."""
    if highest_existing is None or highest_existing < FIRST_OWN_ID:
        return FIRST_OWN_ID
    runs = (highest_existing - FIRST_OWN_ID) // THREAD_STRIDE + 1
    return FIRST_OWN_ID + runs * THREAD_STRIDE


def large_rows(first_id: int, count: int) -> Iterable[dict[str, Any]]:
    for i in range(count):
        yield {"account_id": first_id + i, "seq": 0, "payload": f"large-{i:012d}"}


def expected_state(records: Iterable[Mapping[str, Any]], hot_keys: int) -> dict[str, dict[tuple[Any, ...], tuple[Any, ...]]]:
    """The table contents the ground-truth log implies: table -> key -> non-key values.

    ``records`` are ground-truth log lines in the order they were written.
    """
    accounts: dict[tuple[Any, ...], tuple[Any, ...]] = {(k,): (0, "hot") for k in range(1, hot_keys + 1)}
    events: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for record in records:
        if record["outcome"] == "in_doubt":
            raise ValueError(f"gxid {record['gxid']} is in doubt in the log (a connection was lost as it committed), "
                             "so the log cannot say what the tables hold: compare with the source instead")
        if record["outcome"] != "committed":
            continue
        for op in map(Op.from_json, record["ops"]):
            if op.table == EVENTS:
                if op.kind == "insert_range":
                    for row in large_rows(op.key["account_id"], op.values["count"]):
                        events[(row["account_id"], 0)] = (row["payload"],)
                else:
                    events[(op.key["account_id"], op.key["seq"])] = (op.values["payload"],)
                continue
            key = (op.key["id"],)
            if op.kind == "insert":
                accounts[key] = (op.values["balance"], op.values["note"])
            elif op.kind == "update":
                accounts[key] = (op.values["balance"], op.values["note"])
            elif op.kind == "delete":
                del accounts[key]
            elif op.kind == "move":
                accounts[(op.values["id"],)] = accounts.pop(key)
            elif op.kind == "increment":
                balance, note = accounts[key]
                accounts[key] = (balance + op.values["balance"], note)
    return {ACCOUNTS: accounts, EVENTS: events}
