"""Audit throughput on Spark against the same rules in plain pandas, from a Parquet archive.

A synthetic stream of N events is written once as an archive (the ingest schema, as
``gpcdc archive`` writes it): three segments and the coordinator; 60% of the
distributed transactions two-phase on two segments, 40% one-phase; three row events
per part, framed by BEGIN and END; watermarks every 100 parts; one two-phase part in
10,000 dropped, so that the missing-part rule has work. Then, in the same run, each in
a process of its own (so that each peak is its own):

* Spark (``local[2]``, the toolkit's session settings, its JVM started from the archive
  of Spark's classes unless ``--class-archive off``): ``read_archive`` and
  ``audit_events`` (every rule; the stream's expectations are left out, since pandas
  has no counterpart here), the findings counted per rule: first in a fresh JVM, as a
  command with no Spark server pays it; then in another fresh JVM warmed first by the
  toolkit's own warm-up (``warm_up``, a small stream's audit, as ``gpcdc spark up
  --warm`` warms the server the commands and notebooks then use), its time not counted;
* pandas: the same rules over the same files, with pandas operations (sorts, groupbys,
  merges, shifts), counted per rule.

Printed per size: seconds and events/s of each, the ratio, the growth from the
smallest size, and each process's peak resident memory: the Python driver's and, for
Spark, the JVM's (in local mode the JVM runs the executors too). Both must count the
same findings.

    .venv/bin/python bench/bench_audit.py [--events 1000000,10000000] [--data DIR] [--class-archive off]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpcdc_toolkit._runtime import interrupt_on_sigterm

BASE_TS = 1_795_000_000_000
SKEW_MS, SILENCE_MS = 1000, 30_000


# -- the stream -------------------------------------------------------------------------

def generate(path: Path, events: int, seed: int = 7) -> None:
    """A synthetic archive of about ``events`` messages at ``path/run-000001``."""
    import pyarrow.parquet as pq

    from gpcdc_toolkit.ingest._rows import arrow_schema

    rng = np.random.default_rng(seed)
    transactions = int(events / 8.6)
    two_phase = rng.random(transactions) < 0.6
    first = rng.integers(0, 3, transactions)
    second = (first + rng.integers(1, 3, transactions)) % 3
    gxids = np.arange(1, transactions + 1)
    schema = arrow_schema()
    out = path / "run-000001"
    out.mkdir(parents=True, exist_ok=True)
    for segment in range(3):
        mine = (first == segment) | (two_phase & (second == segment))
        dropped = two_phase & (rng.random(transactions) < 1e-4) & (segment == 1)
        g = gxids[mine & ~dropped]
        pq.write_table(_segment_table(segment, g, two_phase[g - 1], rng, schema), out / f"segment-{segment}.parquet")
    pq.write_table(_coordinator_table(gxids[two_phase], first[two_phase], second[two_phase], schema),
                   out / "coordinator.parquet")
    # Each partition begins with its pipeline marker (offset 0), as capture writes it.
    markers = [("bench.changes", s, s) for s in range(3)] + [("bench.dtx", 0, -1)]
    pq.write_table(_table({"topic": [t for t, _, _ in markers], "partition": [p for _, p, _ in markers],
                           "offset": [0] * 4, "timestamp": [BASE_TS] * 4, "kind": ["pipeline"] * 4,
                           "segment": [n for _, _, n in markers]}, 4, schema), out / "markers.parquet")


def _table(columns: dict[str, Any], n: int, schema: Any) -> Any:
    import pyarrow as pa

    arrays = []
    for field in schema:
        value = columns.get(field.name)
        if value is None:
            arrays.append(pa.nulls(n, field.type))
        elif isinstance(value, pa.Array):
            arrays.append(value)
        elif pa.types.is_timestamp(field.type):
            arrays.append(pa.array(value, type=pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(field.type))
        else:
            arrays.append(pa.array(value, type=field.type, from_pandas=True))
    return pa.Table.from_arrays(arrays, schema=schema)


def _segment_table(segment: int, gxids: Any, two_phase: Any, rng: Any, schema: Any) -> Any:
    import pyarrow as pa

    parts = len(gxids)
    # Per part: BEGIN, 3 rows, END, and a watermark after every 100th part.
    kinds = np.array(["begin", "row", "row", "row", "end"])
    per_part = np.tile(kinds, parts)
    part_of = np.repeat(np.arange(parts), 5)
    marks = np.arange(99, parts, 100)
    order = np.concatenate([part_of * 10 + np.tile(np.arange(5), parts), marks * 10 + 5, [parts * 10 + 9]])
    kind = np.concatenate([per_part, np.full(len(marks) + 1, "resolved")])
    part = np.concatenate([part_of, marks, [parts - 1]])
    sort = np.argsort(order, kind="stable")
    kind, part = kind[sort], part[sort]
    n = len(kind)
    commit_lsn = 10**9 + part * 1000
    ts = BASE_TS + gxids[part] * 2
    is_row, is_frame, is_mark = kind == "row", np.isin(kind, ["begin", "end"]), kind == "resolved"
    seq = np.zeros(n, dtype=np.int64)
    begins = np.where(kind == "begin")[0]
    starts = begins[np.searchsorted(begins, np.arange(n), "right") - 1]
    seq[is_row] = (np.arange(n) - starts)[is_row]
    last_mark_ts = np.where(np.arange(n) == n - 1, ts + 10 * SKEW_MS, ts)
    keys = rng.integers(0, 50_000, n) + segment * 1_000_000
    key_text = np.char.add(np.char.add('{"id": ', keys.astype(str)), "}")
    entry_offsets = np.concatenate([[0], np.cumsum(np.where(is_row, 2, 0))]).astype(np.int32)
    rows = int(is_row.sum())
    after = pa.MapArray.from_arrays(
        pa.array(entry_offsets), pa.array(np.tile(["id", "v"], rows)),
        pa.array(np.column_stack([keys[is_row].astype(str), seq[is_row].astype(str)]).ravel()),
        mask=pa.array(~is_row))
    columns = {
        "topic": np.full(n, "bench.changes"), "partition": np.full(n, segment, dtype=np.int32),
        "offset": np.arange(n) + 1, "timestamp": ts + 3, "kind": kind, "segment": np.full(n, segment, dtype=np.int32),
        "gxid": np.where(is_mark, None, gxids[part]).astype(object),
        "xid": np.where(is_mark, None, commit_lsn).astype(object),
        "commit_lsn": np.where(is_mark, None, commit_lsn).astype(object),
        "commit_ts": np.where(is_mark, None, ts).astype(object),
        "op": np.where(is_row, "c", None).astype(object),
        "table_schema": np.where(is_row, "public", None).astype(object),
        "table_name": np.where(is_row, "bench", None).astype(object),
        "seq": np.where(is_row, seq, None).astype(object),
        "one_phase": np.where(is_frame | is_row, ~two_phase[part], None).astype(object),
        "key": np.where(is_row, key_text, None).astype(object),
        "after": after,
        "event_count": np.where(kind == "end", 3, None).astype(object),
        "end_lsn": np.where(kind == "end", commit_lsn + 8, None).astype(object),
        "resolved_lsn": np.where(is_mark, commit_lsn + 8, None).astype(object),
        "resolved_ts": np.where(is_mark, last_mark_ts, None).astype(object),
        "prepared": pa.array([[] if m else None for m in is_mark], type=pa.list_(pa.int64())),
        "prepared_ts": np.where(is_mark, last_mark_ts, None).astype(object),
    }
    return _table(columns, n, schema)


def _coordinator_table(gxids: Any, first: Any, second: Any, schema: Any) -> Any:
    import pyarrow as pa

    records = len(gxids)
    marks = np.arange(199, records, 200)
    order = np.concatenate([np.arange(records) * 10, marks * 10 + 5, [records * 10 + 9]])
    is_mark = np.concatenate([np.zeros(records, bool), np.ones(len(marks) + 1, bool)])
    index = np.concatenate([np.arange(records), marks, [records - 1]])
    sort = np.argsort(order, kind="stable")
    is_mark, index = is_mark[sort], index[sort]
    n = len(index)
    ts = BASE_TS + gxids[index] * 2 - 1
    resolved_ts = np.where(np.arange(n) == n - 1, ts + 10 * SKEW_MS, ts)
    segments = pa.array([None if m else sorted((int(first[i]), int(second[i]))) for m, i in zip(is_mark, index)],
                        type=pa.list_(pa.int32()))
    columns = {
        "topic": np.full(n, "bench.dtx"), "partition": np.zeros(n, dtype=np.int32), "offset": np.arange(n) + 1,
        "timestamp": ts + 3, "kind": np.where(is_mark, "resolved", "commit"), "segment": np.full(n, -1, np.int32),
        "gxid": np.where(is_mark, None, gxids[index]).astype(object),
        "xid": np.where(is_mark, None, index).astype(object),
        "commit_lsn": np.where(is_mark, None, 10**8 + index * 100).astype(object),
        "commit_ts": np.where(is_mark, None, ts).astype(object), "segments": segments,
        "resolved_lsn": np.where(is_mark, 10**8 + index * 100 + 50, None).astype(object),
        "resolved_ts": np.where(is_mark, resolved_ts, None).astype(object),
        "ddl_count": np.where(is_mark, None, 0).astype(object),
    }
    return _table(columns, n, schema)


# -- the two audits ---------------------------------------------------------------------

def spark_audit(path: Path, warmed: bool, use_class_archive: bool) -> dict[str, Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from gpcdc_toolkit.archive import read_archive
    from gpcdc_toolkit.audit import Thresholds, audit_events
    from gpcdc_toolkit.ingest._settings import SESSION_SETTINGS
    from gpcdc_toolkit.ingest.spark import class_archive, class_archive_options

    # The settings of the toolkit's own sessions (`gpcdc audit`), with room for 10M events.
    java_options = class_archive_options() if use_class_archive and class_archive(wait=True) else ""
    spark = (SparkSession.builder.master("local[2]").appName("bench-audit").config(map=SESSION_SETTINGS)
             .config("spark.driver.memory", "6g").config("spark.driver.defaultJavaOptions", java_options).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        if warmed:
            import tempfile

            from gpcdc_toolkit.audit import warm_up
            from gpcdc_toolkit.config import load_config

            with tempfile.TemporaryDirectory() as work_dir:
                warm_up(spark, load_config({"work_dir": work_dir}, environ={}))
        start = time.perf_counter()  # the JVM's start (and warm-up) is not the audit's
        findings, _ = audit_events(read_archive(spark, path), Thresholds(SKEW_MS, SILENCE_MS))
        counts = {r["rule"]: r["count"] for r in findings.groupBy("rule").count().collect()}
        elapsed = time.perf_counter() - start
        jvm = _jvm_peak_kib(spark)
    finally:
        spark.stop()
    return {**counts, "_jvm_peak_kib": jvm, "_seconds": elapsed}


def _jvm_peak_kib(spark: Any) -> int:
    return _peak_kib(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())


def _peak_kib(pid: int | str = "self") -> int:
    """A process's peak resident memory (VmHWM: unlike getrusage's, it starts afresh at
    exec, not at the parent's size when it forked)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def pandas_audit(path: Path) -> dict[str, Any]:
    import pandas as pd
    import pyarrow.parquet as pq

    start = time.perf_counter()
    frames = [pq.read_table(f).to_pandas() for f in sorted((path / "run-000001").glob("*.parquet"))]
    df = pd.concat(frames, ignore_index=True).sort_values(["topic", "partition", "offset"], kind="stable")
    counts: dict[str, int] = {}
    # Duplicates: one identity per message; the first copy stays.
    id_seq = np.select([df.kind == "row", df.kind == "begin", df.kind == "end", df.kind == "commit"],
                       [df.seq.fillna(0), -1, -2, -3], np.nan)
    df["id_seq"] = id_seq
    df["payload"] = pd.util.hash_pandas_object(
        df[["kind", "gxid", "op", "seq", "key", "event_count"]].astype(str) + df["after"].astype(str).to_frame().values,
        index=False)
    identity = ["segment", "commit_lsn", "id_seq"]
    has_id = df.id_seq.notna()
    copies = df[has_id].duplicated(identity, keep="first")
    duplicated = df[has_id][copies]
    counts["duplicate_events"] = duplicated.groupby(["topic", "partition"]).ngroups
    first_hash = df[has_id].groupby(identity)["payload"].transform("first")
    counts["conflicting_duplicate"] = int(((df[has_id].payload != first_hash) & copies).sum())
    events = df.drop(duplicated.index)
    counts["corrupt_message"] = int(events.kind.isna().sum())
    # Parts.
    framed = events[(events.segment >= 0) & events.kind.isin(["row", "begin", "end"])]
    is_end = framed.kind == "end"
    framed = framed.assign(end_gxid=framed.gxid.where(is_end), end_one_phase=framed.one_phase.where(is_end),
                           end_count=framed.event_count.where(is_end), is_end=is_end, is_row=framed.kind == "row")
    parts = framed.groupby(["topic", "partition", "segment", "commit_lsn"], as_index=False).agg(
        offset=("offset", "min"), ends=("is_end", "sum"), gxid=("end_gxid", "max"), one_phase=("end_one_phase", "max"),
        event_count=("end_count", "max"), rows=("is_row", "sum"), min_seq=("seq", "min"), max_seq=("seq", "max"),
        commit_ts=("commit_ts", "max"), end_lsn=("end_lsn", "max"))
    parts = parts.sort_values(["topic", "partition", "offset"])
    parts["next_offset"] = parts.groupby(["topic", "partition"]).offset.shift(-1)
    unended = (parts.ends == 0) & parts.next_offset.notna()
    short = (parts.ends > 0) & ((parts.rows != parts.event_count) | ((parts.rows > 0) & (
        (parts.min_seq != 1) | (parts.max_seq != parts.event_count))))
    counts["damaged_part"] = int((unended | short).sum())
    records = events[events.kind == "commit"][["gxid", "segments", "commit_ts", "commit_lsn", "offset", "topic",
                                               "partition"]]
    two_phase = parts[parts.gxid.notna() & (parts.one_phase == False)]  # noqa: E712 (a column of booleans)
    marks = events[events.kind == "resolved"]
    latest = marks.groupby("segment").agg(resolved_ts=("resolved_ts", "max"))
    prepared = marks.dropna(subset=["prepared_ts"]).sort_values("prepared_ts").groupby("segment").last()[
        ["prepared", "prepared_ts"]]
    expected = records.dropna(subset=["segments"]).explode("segments").rename(columns={"segments": "segment"})
    expected["segment"] = expected.segment.astype(int)
    absent = expected.merge(two_phase[["gxid", "segment"]], on=["gxid", "segment"], how="left", indicator=True)
    absent = absent[absent._merge == "left_only"].join(prepared, on="segment")
    held = [g in (p if p is not None else []) for g, p in zip(absent.gxid, absent.prepared)]
    proven = absent.prepared_ts.notna() & ~np.array(held, dtype=bool) & (
        absent.prepared_ts >= absent.commit_ts + pd.Timedelta(milliseconds=SKEW_MS))
    counts["missing_part"] = int(proven.sum())
    counts["late_part"] = int((~proven).sum())
    orphans = two_phase[~two_phase.gxid.isin(records.gxid)]
    coordinator = latest.resolved_ts.get(-1)
    lost = coordinator is not None and orphans.commit_ts + pd.Timedelta(milliseconds=SKEW_MS) <= coordinator
    counts["orphan_part"] = int(lost.sum()) if not isinstance(lost, bool) else 0
    counts["awaiting_record"] = len(orphans) - counts["orphan_part"]
    listed = two_phase.merge(records[["gxid", "segments"]].dropna(), on="gxid")
    counts["unlisted_part"] = sum(s not in list(segs) for s, segs in zip(listed.segment, listed.segments))
    counts["one_phase_contradiction"] = int(parts[parts.one_phase == True].gxid.isin(records.gxid).sum())  # noqa: E712
    ordered = pd.concat([parts[["topic", "partition", "offset", "commit_lsn"]],
                         records[["topic", "partition", "offset", "commit_lsn"]]]).sort_values(
        ["topic", "partition", "offset"])
    counts["commit_lsn_backwards"] = int((ordered.groupby(["topic", "partition"]).commit_lsn.shift() >
                                          ordered.commit_lsn).sum())
    both = pd.concat([parts[["partition", "offset", "end_lsn"]].assign(passed=np.nan),
                      marks[marks.segment >= 0][["partition", "offset"]].assign(passed=marks.resolved_lsn, end_lsn=np.nan)]
                     ).sort_values(["partition", "offset"])
    before = both.groupby("partition").passed.transform(lambda s: s.cummax().shift())
    counts["after_watermark"] = int((both.end_lsn.notna() & (before >= both.end_lsn)).sum())
    positions = records[["gxid", "offset"]].rename(columns={"offset": "position"})
    rows = events[(events.kind == "row") & events.key.notna()][["segment", "table_name", "key", "gxid", "offset"]]
    rows = rows.merge(positions, on="gxid").sort_values(["segment", "table_name", "key", "offset"])
    grouped = rows.groupby(["segment", "table_name", "key"])
    previous_gxid, previous_position = grouped.gxid.shift(), grouped.position.shift()
    against = rows[(previous_gxid != rows.gxid) & (previous_position > rows.position)]
    counts["key_order"] = against.assign(prev=previous_gxid[against.index]).groupby(
        ["segment", "prev", "gxid"]).ngroups
    timed = marks.dropna(subset=["resolved_ts"]).sort_values("offset")
    gaps = timed.groupby("segment").resolved_ts.diff() > pd.Timedelta(milliseconds=SILENCE_MS)
    counts["silent_node"] = int(gaps.sum())
    return {**{rule: n for rule, n in counts.items() if n}, "_seconds": time.perf_counter() - start}


# -- the run ----------------------------------------------------------------------------

def measure(which: str, path: Path, use_class_archive: bool) -> None:
    """One audit in this process: JSON of its time, counts and peaks on stdout."""
    counts = pandas_audit(path) if which == "pandas" else spark_audit(path, warmed=which == "warmed",
                                                                       use_class_archive=use_class_archive)
    elapsed = counts.pop("_seconds")
    jvm = counts.pop("_jvm_peak_kib", 0)
    print(json.dumps({"seconds": elapsed, "counts": counts, "python_peak_kib": _peak_kib(), "jvm_peak_kib": jvm}))


def run(which: str, path: Path, class_archive: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--measure", which, "--archive", str(path),
                           "--class-archive", class_archive], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", default="1000000,10000000")
    parser.add_argument("--data", type=Path, default=Path.home() / ".cache" / "gpcdc" / "bench-audit")
    parser.add_argument("--measure", choices=("spark", "warmed", "pandas"), help=argparse.SUPPRESS)
    parser.add_argument("--archive", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--class-archive", choices=("on", "off"), default="on",
                        help="start Spark's JVMs from the archive of its classes, as the toolkit's sessions do")
    args = parser.parse_args()
    if args.measure:
        measure(args.measure, args.archive, args.class_archive == "on")
        return
    sizes = [int(n) for n in args.events.split(",")]
    results = {}
    for size in sizes:
        path = args.data / f"events-{size}"
        if not (path / "run-000001").is_dir():
            generate(path, size)
        import pyarrow.parquet as pq

        events = sum(pq.ParquetFile(f).metadata.num_rows for f in (path / "run-000001").glob("*.parquet"))
        spark, warmed, pandas = (run(which, path, args.class_archive) for which in ("spark", "warmed", "pandas"))
        if not spark["counts"] == warmed["counts"] == pandas["counts"]:
            raise SystemExit(f"the audits disagree at {size}: spark {spark['counts']}, warmed {warmed['counts']}, "
                             f"pandas {pandas['counts']}")
        results[size] = (events, spark, pandas)
        print(f"{events:>10} events: spark {spark['seconds']:7.1f} s ({events / spark['seconds']:>9,.0f}/s), "
              f"warmed {warmed['seconds']:7.1f} s, pandas {pandas['seconds']:7.1f} s ({events / pandas['seconds']:>9,.0f}/s); "
              f"spark/pandas time {spark['seconds'] / pandas['seconds']:.2f}, warmed "
              f"{warmed['seconds'] / pandas['seconds']:.2f}; findings {spark['counts']}; "
              f"peak MiB: spark driver {spark['python_peak_kib'] / 1024:.0f} + JVM {spark['jvm_peak_kib'] / 1024:.0f}, "
              f"pandas {pandas['python_peak_kib'] / 1024:.0f}", flush=True)
    if len(sizes) > 1:
        (n0, s0, p0), (n1, s1, p1) = results[sizes[0]], results[sizes[-1]]
        print(f"growth {n0} -> {n1} events ({n1 / n0:.1f}x): spark time {s1['seconds'] / s0['seconds']:.2f}x, "
              f"pandas time {p1['seconds'] / p0['seconds']:.2f}x; spark driver peak "
              f"{s1['python_peak_kib'] / s0['python_peak_kib']:.2f}x, JVM peak {s1['jvm_peak_kib'] / s0['jvm_peak_kib']:.2f}x, "
              f"pandas peak {p1['python_peak_kib'] / p0['python_peak_kib']:.2f}x")


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
