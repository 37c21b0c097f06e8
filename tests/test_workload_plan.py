"""The workload's planning and ground truth, without servers."""

import pytest

from gpcdc_toolkit.cluster import segment_for
from gpcdc_toolkit.workload import ACCOUNTS, EVENTS, Op, ThreadPlanner, WorkloadSpec, expected_state


def segments_of(planner, plan):
    return {planner.segment_of(op) for op in plan.ops}


def test_single_and_multi_segment_plans_touch_what_they_say():
    spec = WorkloadSpec(multi_segment_share=0.5, hot_keys=6, update_share=0.3, delete_share=0.1, seed=3)
    planner = ThreadPlanner(spec, thread=0, segments=4)
    sizes = []
    for _ in range(400):
        plan = planner.next()
        sizes.append(len(segments_of(planner, plan)))
        planner.committed(plan)
    assert sizes.count(1) > 100 and sum(1 for s in sizes if s >= 2) > 100


def test_hot_increments_are_in_ascending_key_order():
    planner = ThreadPlanner(WorkloadSpec(hot_keys=8, hot_share=1.0, multi_segment_share=1.0), 0, 3)
    for _ in range(50):
        keys = [op.key["id"] for op in planner.next().ops if op.kind == "increment"]
        assert keys == sorted(keys) and keys


def test_threads_own_disjoint_keys():
    spec = WorkloadSpec(seed=1)
    a, b = ThreadPlanner(spec, 0, 3), ThreadPlanner(spec, 1, 3)
    keys_a = {tuple(op.key.values()) for _ in range(100) for op in a.next().ops}
    keys_b = {tuple(op.key.values()) for _ in range(100) for op in b.next().ops}
    assert not keys_a & keys_b


def test_updates_and_deletes_only_touch_committed_own_rows():
    planner = ThreadPlanner(WorkloadSpec(update_share=0.5, delete_share=0.3, move_share=0.1, hot_keys=0), 0, 3)
    live: set[int] = set()
    for _ in range(300):
        plan = planner.next()
        for op in plan.ops:
            if op.table == ACCOUNTS and op.kind in ("update", "delete", "move"):
                assert op.key["id"] in live
        planner.committed(plan)
        for op in plan.ops:
            if op.table == ACCOUNTS:
                if op.kind == "insert":
                    live.add(op.key["id"])
                elif op.kind == "delete":
                    live.discard(op.key["id"])
                elif op.kind == "move":
                    live.discard(op.key["id"])
                    live.add(op.values["id"])


def record(outcome, *ops):
    return {"outcome": outcome, "ops": [op.to_json() for op in ops]}


def test_expected_state_applies_only_committed_transactions():
    records = [
        record("committed", Op("insert", ACCOUNTS, {"id": 10}, {"balance": 5, "note": "a"}),
               Op("insert", EVENTS, {"account_id": 10, "seq": 0}, {"payload": "p"})),
        record("aborted", Op("insert", ACCOUNTS, {"id": 11}, {"balance": 1, "note": "b"})),
        record("committed", Op("increment", ACCOUNTS, {"id": 1}, {"balance": 1})),
        record("committed", Op("move", ACCOUNTS, {"id": 10}, {"id": 20})),
        record("failed", Op("delete", ACCOUNTS, {"id": 20})),
        record("committed", Op("insert_range", EVENTS, {"account_id": 100}, {"count": 3})),
    ]
    state = expected_state(records, hot_keys=2)
    assert state[ACCOUNTS] == {(1,): (1, "hot"), (2,): (0, "hot"), (20,): (5, "a")}
    assert len(state[EVENTS]) == 4 and (102, 0) in state[EVENTS]


def test_expected_state_refuses_a_log_with_a_transaction_in_doubt():
    records = [record("committed", Op("increment", ACCOUNTS, {"id": 1}, {"balance": 1})),
               {**record("in_doubt", Op("increment", ACCOUNTS, {"id": 1}, {"balance": 1})), "gxid": 7}]
    with pytest.raises(ValueError, match="gxid 7 is in doubt"):
        expected_state(records, hot_keys=1)


def test_segment_of_uses_the_distribution_key():
    planner = ThreadPlanner(WorkloadSpec(), 0, 5)
    op = Op("insert", EVENTS, {"account_id": 77, "seq": 3}, {"payload": "x"})
    assert planner.segment_of(op) == segment_for([77], 5)
