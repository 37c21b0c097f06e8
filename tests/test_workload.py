"""The workload against a real sandbox: its ground-truth log matches the data."""

import json
import uuid

from gpcdc_toolkit.cluster import Session
from gpcdc_toolkit.protocol import _markers as markers
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.validate import check_workload
from gpcdc_toolkit.workload import WorkloadSpec, read_ground_truth, reset_tables, run_workload

from ._decoding import committed_transactions, create_slot, drop_slot
from ._load import BackgroundLoad


def test_hot_key_workload_matches_its_ground_truth(source, work_dir):
    reset_tables(source)
    truth = work_dir / "truth-hot.jsonl"
    spec = WorkloadSpec(threads=4, duration=3.0, hot_keys=4, hot_share=0.6, update_share=0.3,
                        delete_share=0.1, move_share=0.05, abort_share=0.1, abort_after_prepare_share=0.05,
                        large_transaction_rows=5_000, seed=11)
    result = run_workload(source, spec, ground_truth=truth)
    records = list(read_ground_truth(truth))
    outcomes = {r["outcome"] for r in records}
    assert result.committed > 50 and result.aborted > 0 and "committed" in outcomes and "aborted" in outcomes
    assert result.one_phase > 0 and result.committed - result.one_phase > 0
    assert len({r["gxid"] for r in records}) == len(records), "gxids are unique"
    for r in records:
        if r["outcome"] == "committed":
            assert r["one_phase"] == (len(r["segments"]) == 1)
    report = {diff.table: diff for diff in check_workload(source, truth, spec.hot_keys)}
    assert all(diff.equal for diff in report.values()), report
    assert report["wl_events"].expected >= 5_000
    assert source.prepared_transactions() == []
    increments = sum(1 for r in records if r["outcome"] == "committed" for op in r["ops"] if op[0] == "increment")
    hot_total = sum(row[0] for rows in source.rows_by_segment("wl_accounts").values()
                    for row in [(r[1],) for r in rows if r[0] <= spec.hot_keys])
    assert hot_total == increments > 0


def test_markers_match_the_ground_truth(source, work_dir):
    """Every committed transaction of the log is in the WAL: its parts on exactly the
    segments the log names, and a commit record listing them when two-phase."""
    reset_tables(source)
    conns = {n.content: source.connect_node(n) for n in source.nodes}
    for conn in conns.values():
        create_slot(conn, "wl_truth")
    try:
        truth = work_dir / "truth-markers.jsonl"
        run_workload(source, WorkloadSpec(threads=3, transactions=150, hot_keys=3, seed=5), ground_truth=truth)
        parts: dict[int, set[int]] = {}
        records: dict[int, tuple[int, ...] | None] = {}
        one_phase: set[int] = set()
        for content, conn in conns.items():
            for local in committed_transactions(conn, "wl_truth"):
                for marker in (markers.decode(p, c) for p, c in local.messages):
                    if isinstance(marker, markers.GxidMarker):
                        parts.setdefault(marker.gxid, set()).add(content)
                    elif isinstance(marker, markers.OnePhaseMarker):
                        one_phase.add(marker.gxid)
                    elif isinstance(marker, markers.CommitRecord):
                        records[marker.gxid] = marker.segments
        for r in read_ground_truth(truth):
            gxid = r["gxid"]
            if r["outcome"] != "committed":
                assert gxid not in parts and gxid not in records
                continue
            assert parts[gxid] == set(r["segments"])
            if r["one_phase"]:
                assert gxid in one_phase and gxid not in records
            else:
                assert gxid not in one_phase and records[gxid] == tuple(r["segments"])
    finally:
        for conn in conns.values():
            drop_slot(conn, "wl_truth")
            conn.close()


def test_rate_limit_paces_the_workload(source):
    reset_tables(source)
    result = run_workload(source, WorkloadSpec(threads=2, duration=2.0, rate=50, abort_share=0, abort_after_prepare_share=0))
    # Pacing bounds the rate from above; a busy machine may commit fewer.
    assert 0 < result.committed <= 110, result  # 50/s for 2 s, give or take start-up


def test_tables_survive_setup_twice(source):
    reset_tables(source)
    run_workload(source, WorkloadSpec(threads=1, transactions=5, hot_keys=2))
    run_workload(source, WorkloadSpec(threads=1, transactions=5, hot_keys=2))
    with Session(source) as session:
        assert session.table("wl_accounts").distribution_key == ("id",)


def test_the_workload_writes_on_through_restarts_of_its_nodes(work_dir):
    """A segment stopped fast, one crashed, the coordinator crashed: the workload's
    threads reconnect and commit again after each, and finish what they left prepared.
    Its log stays true to the WAL: what it calls committed has a part on each segment it
    names, what it calls failed or aborted has none, what it calls in doubt is one or
    the other; with those settled, the log says what the tables hold."""
    sandbox = Sandbox(f"wl-{uuid.uuid4().hex[:6]}", work_dir).up(segments=2)
    try:
        cluster = sandbox.cluster()
        for node in cluster.segments:
            with cluster.connect_node(node) as conn:
                create_slot(conn, "wl_restarts")
        truth = work_dir / "truth-restarts.jsonl"
        spec = WorkloadSpec(threads=2, hot_keys=3, hot_share=0.5, seed=3)
        with BackgroundLoad(cluster, spec, ground_truth=truth) as load:
            load.wait_for_commits(10, timeout=60)
            for content, mode in [(0, "fast"), (1, "immediate"), (-1, "immediate")]:
                sandbox.restart(content, mode)
                load.wait_for_commits(10, timeout=60)
        assert cluster.prepared_transactions() == [], "the workload finishes the parts it left prepared"

        parts: dict[int, set[int]] = {}  # gxid -> segments where a part of it committed
        for node in cluster.segments:
            with cluster.connect_node(node) as conn:
                for local in committed_transactions(conn, "wl_restarts"):
                    for marker in (markers.decode(p, c) for p, c in local.messages):
                        if isinstance(marker, markers.GxidMarker):
                            parts.setdefault(marker.gxid, set()).add(node.content)
                drop_slot(conn, "wl_restarts")
        settled = []
        for r in read_ground_truth(truth):
            committed = parts.get(r["gxid"], set())
            if r["outcome"] == "in_doubt":
                assert committed in (set(), set(r["segments"])), r
                r = {**r, "outcome": "committed" if committed else "failed"}
            assert committed == (set(r["segments"]) if r["outcome"] == "committed" else set()), r
            settled.append(r)
        logged = {r["gxid"] for r in settled}
        assert {g for g in parts if g >= min(logged)} <= logged, "nothing commits that the log does not know"
        settled_log = work_dir / "truth-restarts-settled.jsonl"
        settled_log.write_text("".join(json.dumps(r) + "\n" for r in settled))
        report = check_workload(cluster, settled_log, spec.hot_keys)
        assert all(diff.equal for diff in report), report
    finally:
        sandbox.down(remove=True)
