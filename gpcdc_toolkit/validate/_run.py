"""A validation run: the target against the source, table by table, at a sync point or
as both are now; results and fix statements written under ``work_dir``.

A run's directory, ``<work_dir>/validate/<prefix>/runs/<UTC time>/``, holds
``results.parquet`` and ``results.json`` (one row per table: rows on each side, chunks
fetched and settled by key, rows fetched, rows missing, extra, changed, misplaced, seconds), ``expectations.json``
(each great-expectations outcome on the target's tables), ``summary.json`` (the sync
point, its stall, the verdict) and, when something differs, ``fix.sql``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from .._expect import Outcome, load_suites
from ..audit._findings import SEVERITIES
from ..bootstrap import Pipeline, distributed_tables
from ..cluster import Cluster, Table, TableRef, connection_lost
from ..config import Config
from ..connect import open_cluster
from ..errors import GpcdcError, first_line
from ._causes import cause_of, events_of
from ._checksum import ChecksumResult, ValidationError, compare_checksums, target_table
from ._evidence import gather_evidence
from ._expectations import TargetSuites
from ._recorded import record_syncpoint
from ._snapshots import Snapshots
from ._syncpoint import SyncPoint, attach, held_file, take_syncpoint


def _rows_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("table", pa.string()), ("kind", pa.string()), ("key", pa.string()), ("key_text", pa.string()),
                      ("changed_columns", pa.list_(pa.string())), ("source", pa.string()), ("target", pa.string()),
                      ("source_segment", pa.int32()), ("target_segment", pa.int32()), ("cause", pa.string()),
                      ("cause_detail", pa.string()), ("events", pa.string())])


RESULT_COLUMNS = ("table", "equal", "source_rows", "target_rows", "missing", "extra", "changed", "misplaced",
                  "chunks", "settled", "rounds", "fetched", "seconds", "examples", "schema", "levels")


@dataclass(frozen=True)
class Validation:
    results: tuple[ChecksumResult, ...]
    syncpoint: dict[str, Any] | None  # SyncPoint.summary() of the sync point read at; None: read as they were
    mode: str
    seconds: float
    output: Path
    expectations: tuple[Outcome, ...] = ()  # of the target's suites (none when validate.expectations is off)
    fail_on: str = "warning"  # the least severity of a failed expectation that fails the validation
    # Per result, each differing row's cause and what shows it (see _causes); the cause
    # None where the evidence could not be read (the detail says why).
    causes: tuple[tuple[tuple[str | None, str, str | None], ...], ...] = ()
    suites_not_run: tuple[str, ...] = ()  # target suites naming no table compared, each with why

    def differing_rows(self) -> list[dict[str, Any]]:
        """Every differing row of every table, with its cause (``rows.parquet``)."""
        return [row for i, r in enumerate(self.results)
                for row in r.differing_rows(self.causes[i] if self.causes else None)]

    def cause_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for row in self.differing_rows():
            counts[row["cause"] or "not classified"] = counts.get(row["cause"] or "not classified", 0) + 1
        return counts

    @property
    def equal(self) -> bool:
        """Every table's rows and definition equal to the source's."""
        return all(r.equal for r in self.results)

    @property
    def failed_expectations(self) -> list[Outcome]:
        """Those not met, of severity ``fail_on`` or worse."""
        worst = SEVERITIES.index(self.fail_on)
        return [o for o in self.expectations if not o.success and SEVERITIES.index(o.severity) <= worst]

    @property
    def verified(self) -> bool:
        """Equal, and every expectation of severity ``fail_on`` or worse met."""
        return self.equal and not self.failed_expectations

    def rows(self) -> list[dict[str, Any]]:
        """One record per table, with the fields of RESULT_COLUMNS."""
        return [{"table": r.table, "equal": r.equal, "source_rows": r.diff.expected, "target_rows": r.diff.actual,
                 "missing": r.diff.missing, "extra": r.diff.extra, "changed": r.diff.changed,
                 "misplaced": r.diff.misplaced, "chunks": r.chunks, "settled": r.settled, "rounds": r.rounds,
                 "fetched": r.fetched,
                 "seconds": round(r.seconds, 3), "examples": list(r.diff.examples), "schema": list(r.schema),
                 "levels": [{"level": lv, "measured": m, "differing": d} for lv, m, d in r.levels]}
                for r in self.results]

    def frame(self) -> Any:
        """The results as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.rows(), columns=list(RESULT_COLUMNS))

    def lines(self) -> list[str]:
        at = (f"at sync point {self.syncpoint['syncpoint']} (writers held {self.syncpoint['stall_ms']} ms, "
              f"replayer {self.syncpoint['replay_hold_ms']} ms)" if self.syncpoint else "as read now, without a sync point")
        out = [f"{len(self.results)} tables compared {at}, {self.mode} mode, in {self.seconds:.1f} s"]
        for r in self.results:
            first, *schema = r.lines()
            settled = f" ({r.settled} settled by key)" if r.settled else ""
            out += [first + (f"; {r.chunks} chunks{settled}, {r.fetched} rows fetched" if not r.diff.equal else ""),
                    *schema]
        if self.expectations:
            out.append(f"great-expectations: {len(self.expectations)} expectations on the target, "
                       f"{len(self.failed_expectations)} failed")
            out += [f"  {o.suite}: {o.expectation}: {o.evidence}" for o in self.failed_expectations]
        out += self.suites_not_run
        if counts := self.cause_counts():
            out.append("differing rows by cause: " + ", ".join(f"{n} {cause}" for cause, n in sorted(counts.items()))
                       + f" (every row in {self.output / 'rows.parquet'})")
        verdict = ("target equals source" if self.equal else
                   f"{sum(not r.equal for r in self.results)} tables differ; fix statements in {self.output / 'fix.sql'}")
        return [*out, verdict]


def validate(config: Config, *, tables: Sequence[TableRef] | None = None, syncpoint: bool | int = True,
             source: Cluster | None = None, target: Cluster | None = None, spark: Any = None) -> Validation:
    """Compare ``tables`` (default: every distributed table of the source): ``syncpoint``
    True, at a new sync point (the replayer must be running); a gxid, at that sync point
    held by ``gpcdc syncpoint --hold``; False, as both clusters are now. By
    ``validate.mode`` (the Spark mode on ``spark``, or a session of its own)."""
    settings = config.validate
    source = source or open_cluster(config, "source")
    target = target or open_cluster(config, "target")
    started = time.monotonic()
    # An unknown name fails here, before any cut.
    infos = [source.table(t) for t in tables] if tables is not None else distributed_tables(source)
    if not infos:
        raise ValidationError("there is no table to validate: the source has no distributed table",
                              fix="create tables through the toolkit (DISTRIBUTED BY), or name them with --tables")
    # An expectation the target cannot compute, a suite great-expectations cannot load,
    # or great-expectations missing where it will be needed also fail here, before any cut.
    suites = TargetSuites(target, infos,
                          load_suites(Path(settings.expectations_dir) if settings.expectations_dir else None),
                          placement_checked=settings.check_placement) if settings.expectations else None
    with ExitStack() as stack:
        if settings.mode == "spark" and spark is None:
            from ..ingest.spark import command_session

            spark = stack.enter_context(command_session(config, "gpcdc-validate"))
        point: SyncPoint | None = None
        if syncpoint is True:
            point = stack.enter_context(take_syncpoint(source, target, pipeline=config.kafka.topic_prefix,
                                                       tables=infos, lock_timeout=settings.lock_timeout))
            # While the replayer reaches the cut: the record a rebuild is later proven against.
            record_syncpoint(point, infos, Pipeline(config.work_dir, config.kafka.topic_prefix).syncpoints_dir)
            sides: tuple[Snapshots, Snapshots] = (point.source, point.wait_for_replay(settings.replay_timeout))
        elif syncpoint is not False:
            point = stack.enter_context(attach(source, target, held_file(config.work_dir, config.kafka.topic_prefix,
                                                                         syncpoint)))
            sides = (point.source, point.wait_for_replay(0))
        else:
            sides = (stack.enter_context(Snapshots(source)), stack.enter_context(Snapshots(target)))
        # The target's catalog entries, read once for whichever of the suites and Spark needs them.
        target_infos = [target_table(target, info.parts) for info in infos] \
            if suites is not None or settings.mode == "spark" else []
        running = None
        if suites is not None:  # run while the tables are compared, in the same snapshots
            running = stack.enter_context(suites.start(sides[1], target_infos))
        with _naming_lost_servers(sides):
            if settings.mode == "spark":
                from ._spark import compare_spark

                results = tuple(compare_spark(spark, sides[0], sides[1], info, target_info,
                                              placement=settings.check_placement)
                                for info, target_info in zip(infos, target_infos, strict=True))
            else:
                results = tuple(compare_checksums(sides[0], sides[1], info.parts, fetch_rows=settings.fetch_rows,
                                                  placement=settings.check_placement) for info in infos)
        outcomes: list[Outcome] = []
        if running is not None:
            outcomes = running.outcomes([(result.diff.expected, result.diff.actual) for result in results])
        summary = point.summary() if point is not None else None
    run = Validation(results, summary, settings.mode, time.monotonic() - started, _run_dir(config), tuple(outcomes),
                     settings.fail_on, _causes(config, target, results), _not_run(suites, source, infos, tables is None))
    _write(run, target)
    return run


@contextmanager
def _naming_lost_servers(sides: tuple[Snapshots, Snapshots]) -> Iterator[None]:
    """A comparison that lost a server's connection ends naming it, with no verdict."""
    try:
        yield
    except psycopg.Error as e:
        lost = [f"the {side}'s {node}" for side, snapshots in zip(("source", "target"), sides, strict=True)
                for node in snapshots.lost()]
        if not lost or not connection_lost(e):
            raise
        raise ValidationError(f"the comparison lost its connection to {' and '.join(lost)} and gives no verdict "
                              f"({first_line(e)})", fix="make sure the servers are up, then validate again") from None


def _not_run(suites: TargetSuites | None, source: Cluster, infos: Sequence[Table], every_table: bool) -> tuple[str, ...]:
    """A line for each target suite that names no table compared, with why."""
    if suites is None or not suites.unmatched:
        return ()
    known = {info.name for info in (infos if every_table else distributed_tables(source))}
    return tuple(f"expectation suite {name!r} not run: {table} is "
                 + ("not among the tables compared" if table in known else
                    "no distributed table of the source (name it as PostgreSQL prints it, "
                    f"e.g. {infos[0].name})") for name, table in suites.unmatched)


def _causes(config: Config, target: Cluster,
            results: Sequence[ChecksumResult]) -> tuple[tuple[tuple[str | None, str, str | None], ...], ...]:
    """Each differing row's cause, what shows it and the source events that wrote its
    key (as JSON), from the pipeline's record (read only when rows differ)."""
    from confluent_kafka import KafkaException

    if not any(r.diff.rows for r in results):
        return ()
    try:
        evidence = gather_evidence(config, target, results)
    except (GpcdcError, KafkaException, OSError) as e:  # the verdict stands; only the why is missing
        reason = f"not classified: the pipeline's record could not be read ({str(e).strip().splitlines()[0]})"
        return tuple(tuple((None, reason, None) for _ in r.diff.rows) for r in results)
    return tuple(tuple((*cause_of(r.table, r.columns, row, evidence), json.dumps(events_of(r.table, row, evidence)))
                       for row in r.diff.rows) for r in results)


def latest_differences(config: Config) -> Any:
    """The pipeline's latest validation run's differing rows as findings of the
    transactions that wrote them (a pandas DataFrame: rule ``difference: <cause>``,
    severity, gxid, evidence), for the transaction browser; empty when no run differed."""
    import pandas as pd

    runs = sorted((Path(config.work_dir) / "validate" / config.kafka.topic_prefix / "runs").glob("*/rows.parquet"))
    found = []
    for row in (pd.read_parquet(runs[-1]).to_dict("records") if runs else []):
        for event in json.loads(row["events"]) if row.get("events") else []:
            if event["gxid"] is not None:
                found.append({"rule": f"difference: {row['cause'] or 'not classified'}",
                              "severity": "info" if event["applied"] else "warning", "gxid": event["gxid"],
                              "evidence": f"{row['table']} {row['key_text']}: {row['kind']}; {row['cause_detail']}"})
    return pd.DataFrame(found, columns=["rule", "severity", "gxid", "evidence"])


def _run_dir(config: Config) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return Path(config.work_dir) / "validate" / config.kafka.topic_prefix / "runs" / stamp


def _write(run: Validation, target: Cluster) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    run.output.mkdir(parents=True)
    rows = run.rows()
    pq.write_table(pa.Table.from_pylist(rows), run.output / "results.parquet")
    (run.output / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    (run.output / "expectations.json").write_text(json.dumps([dataclasses.asdict(o) for o in run.expectations],
                                                             indent=1) + "\n")
    differing = run.differing_rows()
    pq.write_table(pa.Table.from_pylist(differing, schema=_rows_schema()), run.output / "rows.parquet")
    (run.output / "summary.json").write_text(json.dumps(
        {"verified": run.verified, "equal": run.equal, "failed_expectations": len(run.failed_expectations),
         "causes": run.cause_counts(), "suites_not_run": list(run.suites_not_run),
         "mode": run.mode, "seconds": round(run.seconds, 3), "tables": len(rows),
         "differing": [r["table"] for r in rows if not r["equal"]], "syncpoint": run.syncpoint}, indent=1) + "\n")
    if not run.equal:
        lines: list[str] = []
        for result in run.results:
            if result.fix:
                lines += result.fix_lines(target)
        (run.output / "fix.sql").write_text("\n".join(lines) + "\n")
