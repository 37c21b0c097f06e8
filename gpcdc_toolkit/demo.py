"""The main job on the embedded default, end to end: a sandbox source and target, the
broker, bootstrap, capture under a workload, the audit, replay, validation at a sync
point while the workload writes, and the checks that each stage equals the source.
``gpcdc demo`` runs it; it returns 0 when every check passed."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .bootstrap import InitialSnapshot, bootstrap
from .broker import EmbeddedBroker, check_reachable
from .capture import CaptureGroup, drop_pipeline, wait_until_acknowledged
from .cluster import Cluster
from .config import Config
from .connect import kafka_client_settings
from .errors import ConfigError
from .protocol import Topics
from .replay import Replayer, StatusLine
from .sandbox import Sandbox
from .validate import check_against_truth, check_workload, read_captured
from .workload import ACCOUNTS, EVENTS, WorkloadSpec, read_ground_truth, reset_tables, run_workload


@dataclass(frozen=True)
class DemoOptions:
    segments: int = 3
    method: str = "snapshot"  # bootstrap method
    keep: bool = False  # leave the sandboxes, the broker and capture running
    workload: WorkloadSpec = dataclasses.field(default_factory=lambda: WorkloadSpec(hot_keys=10, duration=5.0))


def run_demo(config: Config, options: DemoOptions, *, say: Callable[[str], None] = print,
             progress: Callable[[object], None] | None = None) -> int:
    if config.source.dsn:
        raise ConfigError("the demo runs on a sandbox, but source.dsn is set", fix="unset it, or run `gpcdc workload`")
    spec = options.workload
    started = time.monotonic()
    sandbox = Sandbox(config.source.sandbox or "source", config.work_dir)
    target = Sandbox(config.target.sandbox or "target", config.work_dir)
    broker = EmbeddedBroker(config.work_dir)
    group = CaptureGroup(config.with_settings({"capture.heartbeat_interval": 0.5}))
    pipeline = group.pipeline
    try:
        sandbox.up(segments=options.segments)
        say(f"sandbox {sandbox.name!r}: coordinator + {options.segments} segments ({sandbox.dsn})")
        if not config.kafka.bootstrap_servers:
            broker.up()
        servers = kafka_client_settings(config)["bootstrap.servers"]
        check_reachable(servers)
        say(f"Kafka: {servers}")
        cluster = sandbox.cluster()
        cluster.check_logical_decoding()
        # A fresh start, so that the checks below compare like with like.
        drop_pipeline(config, cluster, delete_topics=True)
        reset_tables(cluster)

        truth = config.work_dir / "demo-ground-truth.jsonl"
        truth.unlink(missing_ok=True)
        before = run_workload(cluster, dataclasses.replace(spec, duration=1.0, transactions=None),
                              ground_truth=truth)
        say(f"workload before the bootstrap: {before.summary()}")
        start = bootstrap(cluster, pipeline, options.method)
        snapshot = InitialSnapshot(pipeline.snapshot_dir)
        rows = sum(sum(snapshot.row_counts(t).values()) for t in snapshot.tables)
        say(f"bootstrap ({start.method}): slot {pipeline.slot} on {len(start.nodes)} nodes; "
               f"initial snapshot of {rows} rows in {len(snapshot.tables)} tables")
        group.start()
        say(f"capture: {len(start.nodes)} workers streaming into {Topics(pipeline.prefix).changes} "
               f"and {Topics(pipeline.prefix).dtx}")
        result = run_workload(cluster, spec, ground_truth=truth, progress=progress)
        if sys.stderr.isatty():
            print(file=sys.stderr)
        say(f"workload under capture: {result.summary()}")
        wait_until_acknowledged(cluster, pipeline.slot)
        for diff in check_workload(cluster, truth, spec.hot_keys):
            say(f"check {diff.table}: {diff.expected} rows expected from the ground-truth log, {diff.differing} differ")
            if not diff.equal:
                return 1
        captured = read_captured(config)
        check = check_against_truth(captured, read_ground_truth(truth), start.snapshot.sees)  # type: ignore[union-attr]
        say(f"check Kafka: {check.after} distributed transactions after the start point captured "
               f"whole on every segment they touched, {check.before} before it left to the initial snapshot, "
               f"{len(captured.rows)} row events, {len(check.problems)} problems")
        for problem in check.problems[:10]:
            say(f"  {problem}")
        if not check.ok:
            return 1
        if not _audit(config, say):
            return 1

        if target.exists:
            target.down(remove=True)  # a fresh target, as the pipeline is fresh
        target.up(segments=max(1, options.segments - 1))
        say(f"target sandbox {target.name!r}: coordinator + {max(1, options.segments - 1)} segments")
        status = StatusLine()
        with Replayer(config) as replayer:
            replayed = replayer.run(progress=status)
        status.close()
        if replayer.initial_load is not None:
            say("replay: initial load of {} rows into {} tables".format(*replayer.initial_load))
        say(f"replay: {replayed.line()}")
        if not _validate_while_writing(config, cluster, spec, say):
            return 1
        say(f"done in {time.monotonic() - started:.1f} s")
    finally:
        if not options.keep:
            group.stop()
            broker.down()
            for cluster_sandbox in (sandbox, target):
                if cluster_sandbox.exists:
                    cluster_sandbox.down()
    return 0


def _validate_while_writing(config: Config, cluster: Cluster, spec: WorkloadSpec,
                            say: Callable[[str], None]) -> bool:
    """The target against the source at a sync point, taken while the workload writes
    and a replayer follows: whether it is verified."""
    from .validate import validate

    stop = threading.Event()
    failures: list[BaseException] = []

    def guarded(work: Callable[[], object]) -> None:
        try:
            work()
        except BaseException as e:  # noqa: BLE001 (reported below)
            failures.append(e)

    def follow() -> None:
        with Replayer(config) as replayer:
            replayer.run(follow=True, should_stop=stop.is_set)

    writer = threading.Thread(target=guarded, args=(
        lambda: run_workload(cluster, dataclasses.replace(spec, duration=3.0, transactions=None)),))
    follower = threading.Thread(target=guarded, args=(follow,))
    writer.start()
    follower.start()
    try:
        run = validate(config, tables=[ACCOUNTS, EVENTS], source=cluster)
    finally:
        writer.join()
        stop.set()
        follower.join()
    for line in run.lines():
        say(f"validate: {line}")
    say(f"validate: results in {run.output}")
    for failure in failures:
        say(f"validate: the workload or the replayer failed meanwhile: {failure}")
    return run.verified and not failures


def _audit(config: Config, say: Callable[[str], None]) -> bool:
    """The audit of the captured topics: whether it found nothing at or above a warning."""
    from .audit import run_audit
    from .ingest.spark import spark_session

    spark = spark_session(config, "gpcdc-demo-audit", kafka_connector=False,
                          jvm_log=config.work_dir / "logs" / "gpcdc-demo-audit.log")
    try:
        result = run_audit(spark, config)
    finally:
        spark.stop()
    found = ", ".join(f"{count} {rule} ({severity})" for rule, severity, count in result.summary) or "no findings"
    say(f"audit: {result.events} messages of both topics: {found}; written to {result.output}")
    return not result.fails("warning")
