"""The ``gpcdc`` commands, one small class each."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..bootstrap import METHODS, InitialSnapshot, Pipeline, bootstrap, drop_slots
from ..broker import EmbeddedBroker, check_reachable
from ..capture import (
    CaptureGroup,
    capture_status,
    check_against_truth,
    delete_topics,
    read_captured,
    run_worker,
    wait_until_acknowledged,
)
from ..config import SETTINGS, Config, flag
from ..connect import kafka_client_settings, open_cluster
from ..errors import ConfigError
from ..protocol import StartPoint, Topics, format_lsn
from ..protocol._topics import DISPATCHERS
from ..replay import Replayer, ReplaySettings, StatusLine
from ..sandbox import Sandbox, list_sandboxes
from ..workload import ACCOUNTS, EVENTS, WorkloadSpec, read_ground_truth, reset_tables, run_workload, verify


class Command:
    """A subcommand: ``name`` and ``help`` for the parser, ``add_arguments``, ``run``."""

    name = ""
    help = ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass

    def run(self, args: argparse.Namespace, config: Config) -> int:
        raise NotImplementedError


def _print(line: str) -> None:
    print(line, flush=True)


class SandboxUp(Command):
    name, help = "up", "create and start a sandbox cluster (or start an existing one)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--name", default="source", help="sandbox name (default: source)")
        parser.add_argument("--segments", type=int, default=3, help="number of segments (default: 3)")
        parser.add_argument("--base-port", type=int, help="first port; nodes take consecutive ports (default: free ports)")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        sandbox = Sandbox(args.name, config.work_dir).up(segments=args.segments, base_port=args.base_port)
        _print(f"sandbox {sandbox.name!r} is up: {sandbox.dsn}")
        return 0


class SandboxDown(Command):
    name, help = "down", "stop a sandbox cluster"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--name", default="source", help="sandbox name (default: source)")
        parser.add_argument("--remove", action="store_true", help="also delete its data")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        Sandbox(args.name, config.work_dir).down(remove=args.remove)
        _print(f"sandbox {args.name!r} is {'removed' if args.remove else 'stopped'}")
        return 0


class SandboxStatus(Command):
    name, help = "status", "show the nodes of one sandbox, or of all"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--name", help="sandbox name (default: every sandbox)")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        sandboxes = [Sandbox(args.name, config.work_dir)] if args.name else list_sandboxes(config.work_dir)
        if not sandboxes:
            _print(f"no sandboxes in {config.work_dir}")
        down = 0
        for sandbox in sandboxes:
            status = sandbox.status()
            _print(f"sandbox {sandbox.name}:")
            for node, pid in status:
                down += pid is None
                state = f"running (pid {pid})" if pid else "stopped"
                _print(f"  {node.name:<12} port {node.port:<5} {state:<22} {node.datadir}")
        return 0 if down == 0 else 3


class BrokerUp(Command):
    name, help = "up", "start the embedded Kafka-compatible broker"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--port", type=int, help="port (default: a free one)")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        broker = EmbeddedBroker(config.work_dir).up(port=args.port)
        _print(f"broker is up: bootstrap.servers={broker.bootstrap_servers} (pid {broker.pid})")
        return 0


class BrokerDown(Command):
    name, help = "down", "stop the embedded broker"

    def run(self, args: argparse.Namespace, config: Config) -> int:
        EmbeddedBroker(config.work_dir).down()
        _print("broker is stopped")
        return 0


class BrokerStatus(Command):
    name, help = "status", "tell whether the configured Kafka answers"

    def run(self, args: argparse.Namespace, config: Config) -> int:
        servers = kafka_client_settings(config)["bootstrap.servers"]
        check_reachable(servers)
        _print(f"Kafka answers at {servers}")
        return 0


def _add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    d = WorkloadSpec()
    parser.add_argument("--threads", type=int, default=d.threads)
    parser.add_argument("--duration", type=float, default=d.duration, help="seconds (default: %(default)s)")
    parser.add_argument("--transactions", type=int, help="stop after this many transactions instead")
    parser.add_argument("--rate", type=float, help="target distributed transactions per second (default: as fast as possible)")
    parser.add_argument("--rows", type=int, default=d.rows_per_transaction, help="rows per transaction")
    parser.add_argument("--multi-segment-share", type=float, default=d.multi_segment_share)
    parser.add_argument("--hot-keys", type=int, default=d.hot_keys, help="shared accounts updated concurrently")
    parser.add_argument("--hot-share", type=float, default=d.hot_share)
    parser.add_argument("--update-share", type=float, default=d.update_share)
    parser.add_argument("--delete-share", type=float, default=d.delete_share)
    parser.add_argument("--move-share", type=float, default=d.move_share, help="updates of the distribution key")
    parser.add_argument("--abort-share", type=float, default=d.abort_share)
    parser.add_argument("--abort-after-prepare-share", type=float, default=d.abort_after_prepare_share)
    parser.add_argument("--large-transaction-rows", type=int, default=0, help="run one transaction this large first")
    parser.add_argument("--legacy-markers", action="store_true", help="write WAL markers as stock Greenplum does")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ground-truth", type=Path, help="append one JSON line per transaction to this file")


def _workload_spec(args: argparse.Namespace) -> WorkloadSpec:
    try:
        return WorkloadSpec(
            threads=args.threads, duration=None if args.transactions else args.duration,
            transactions=args.transactions, rate=args.rate, rows_per_transaction=args.rows,
            multi_segment_share=args.multi_segment_share, hot_keys=args.hot_keys, hot_share=args.hot_share,
            update_share=args.update_share, delete_share=args.delete_share, move_share=args.move_share,
            abort_share=args.abort_share, abort_after_prepare_share=args.abort_after_prepare_share,
            large_transaction_rows=args.large_transaction_rows, legacy_markers=args.legacy_markers, seed=args.seed,
        )
    except ValueError as e:
        raise ConfigError(f"invalid workload: {e}") from None


def _progress_line(result: object) -> None:
    if sys.stderr.isatty():
        print(f"\r{result.committed} committed, {result.rate:.0f} dtx/s", end="", file=sys.stderr, flush=True)  # type: ignore[attr-defined]


class Workload(Command):
    name, help = "workload", "run concurrent distributed transactions against a cluster"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--cluster", choices=("source", "target"), default="source")
        _add_workload_arguments(parser)

    def run(self, args: argparse.Namespace, config: Config) -> int:
        spec = _workload_spec(args)
        result = run_workload(open_cluster(config, args.cluster), spec, ground_truth=args.ground_truth,
                              progress=_progress_line)
        if sys.stderr.isatty():
            print(file=sys.stderr)
        _print(result.summary())
        return 0


class Demo(Command):
    name, help = "demo", "the main job on the embedded default: sandbox, broker, bootstrap, capture, replay, checks"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--segments", type=int, default=3)
        parser.add_argument("--method", choices=METHODS, default="snapshot", help="bootstrap method")
        parser.add_argument("--keep", action="store_true", help="leave the sandbox, broker and capture running")
        _add_workload_arguments(parser)
        parser.set_defaults(hot_keys=10, duration=5.0)

    def run(self, args: argparse.Namespace, config: Config) -> int:
        if config.source.dsn:
            raise ConfigError("the demo runs on a sandbox, but source.dsn is set", fix="unset it, or run `gpcdc workload`")
        spec = _workload_spec(args)
        started = time.monotonic()
        sandbox = Sandbox(config.source.sandbox or "source", config.work_dir)
        target = Sandbox(config.target.sandbox or "target", config.work_dir)
        broker = EmbeddedBroker(config.work_dir)
        group = CaptureGroup(config, heartbeat_interval=0.5)
        pipeline = group.pipeline
        try:
            sandbox.up(segments=args.segments)
            _print(f"sandbox {sandbox.name!r}: coordinator + {args.segments} segments ({sandbox.dsn})")
            if not config.kafka.bootstrap_servers:
                broker.up()
            servers = kafka_client_settings(config)["bootstrap.servers"]
            check_reachable(servers)
            _print(f"Kafka: {servers}")
            cluster = sandbox.cluster()
            cluster.check_logical_decoding()
            # A fresh start, so that the checks below compare like with like.
            group.stop()
            drop_slots(cluster, pipeline.slot, publication=pipeline.publication)
            shutil.rmtree(pipeline.directory, ignore_errors=True)
            delete_topics(kafka_client_settings(config), Topics(pipeline.prefix))
            reset_tables(cluster)

            truth = config.work_dir / "demo-ground-truth.jsonl"
            truth.unlink(missing_ok=True)
            before = run_workload(cluster, dataclasses.replace(spec, duration=1.0, transactions=None),
                                  ground_truth=truth)
            _print(f"workload before the bootstrap: {before.summary()}")
            start = bootstrap(cluster, pipeline, args.method)
            snapshot = InitialSnapshot(pipeline.snapshot_dir)
            rows = sum(sum(snapshot.row_counts(t).values()) for t in snapshot.tables)
            _print(f"bootstrap ({start.method}): slot {pipeline.slot} on {len(start.nodes)} nodes; "
                   f"initial snapshot of {rows} rows in {len(snapshot.tables)} tables")
            group.start()
            _print(f"capture: {len(start.nodes)} workers streaming into {Topics(pipeline.prefix).changes} "
                   f"and {Topics(pipeline.prefix).dtx}")
            result = run_workload(cluster, spec, ground_truth=truth, progress=_progress_line)
            if sys.stderr.isatty():
                print(file=sys.stderr)
            _print(f"workload under capture: {result.summary()}")
            wait_until_acknowledged(cluster, pipeline.slot)
            for table, (expected, differ) in verify(cluster, truth, spec.hot_keys).items():
                _print(f"check {table}: {expected} rows expected from the ground-truth log, {differ} differ")
                if differ:
                    return 1
            captured = read_captured(config)
            check = check_against_truth(captured, read_ground_truth(truth), start.snapshot.sees)  # type: ignore[union-attr]
            _print(f"check Kafka: {check.after} distributed transactions after the start point captured "
                   f"whole on every segment they touched, {check.before} before it left to the initial snapshot, "
                   f"{len(captured.rows)} row events, {len(check.problems)} problems")
            for problem in check.problems[:10]:
                _print(f"  {problem}")
            if not check.ok:
                return 1

            if target.exists:
                target.down(remove=True)  # a fresh target, as the pipeline is fresh
            target.up(segments=max(1, args.segments - 1))
            _print(f"target sandbox {target.name!r}: coordinator + {max(1, args.segments - 1)} segments")
            status = StatusLine()
            with Replayer(config) as replayer:
                replayed = replayer.run(progress=status)
            status.close()
            if replayer.initial_load is not None:
                _print("replay: initial load of {} rows into {} tables".format(*replayer.initial_load))
            _print(f"replay: {replayed.line()}")
            target_cluster = target.cluster()
            for table in (ACCOUNTS, EVENTS):
                on_source = sorted(r for rows in cluster.rows_by_segment(table).values() for r in rows)
                on_target = sorted(r for rows in target_cluster.rows_by_segment(table).values() for r in rows)
                _print(f"check target {table}: {len(on_target)} rows, "
                       f"{'equal to the source' if on_target == on_source else 'DIFFERENT from the source'}")
                if on_target != on_source:
                    return 1
            _print(f"done in {time.monotonic() - started:.1f} s")
        finally:
            if not args.keep:
                group.stop()
                broker.down()
                for cluster_sandbox in (sandbox, target):
                    if cluster_sandbox.exists:
                        cluster_sandbox.down()
        return 0


class BootstrapCreate(Command):
    name, help = "create", "create slots on every node at a consistent point, and export the initial snapshot"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--method", choices=METHODS, default="snapshot",
                            help="peaceful: hold new transactions back while slots are made; "
                                 "snapshot: filter by a distributed snapshot (default)")
        parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for transactions or locks")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
        reused: list[StartPoint] = []
        start = bootstrap(open_cluster(config, "source"), pipeline, args.method, timeout=args.timeout,
                          on_reuse=reused.append)
        verb = "reused the existing" if reused else "created"
        _print(f"{verb} slot {pipeline.slot} on {len(start.nodes)} nodes ({start.method} method); "
               f"start point: {pipeline.start_point_file}")
        for node in start.nodes:
            _print(f"  node {node.content:>2}: consistent at {format_lsn(node.consistent_lsn)}, "
                   f"snapshot at {format_lsn(node.snapshot_lsn)}")
        if start.lock_window_ms is not None:
            _print(f"  new distributed transactions waited at most {start.lock_window_ms:.0f} ms")
        if start.snapshot is not None:
            _print(f"  distributed snapshot: xmax {start.snapshot.xmax}, "
                   f"{len(start.snapshot.in_progress)} in progress; cut took {start.extra.get('cut_ms')} ms")
        return 0


class BootstrapDrop(Command):
    name, help = "drop", "drop the pipeline's slots and publications, and forget its start point"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--delete-topics", action="store_true", help="also delete the pipeline's Kafka topics")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
        if CaptureGroup(config).stop():
            _print("stopped the capture workers")
        dropped = drop_slots(open_cluster(config, "source"), pipeline.slot, publication=pipeline.publication)
        existed = pipeline.directory.exists()
        shutil.rmtree(pipeline.directory, ignore_errors=True)
        _print(f"dropped slot {pipeline.slot} on {len(dropped)} nodes" if dropped else f"no slot {pipeline.slot} on any node")
        if existed:
            _print(f"removed {pipeline.directory}")
        if args.delete_topics:
            deleted = delete_topics(kafka_client_settings(config), Topics(pipeline.prefix))
            _print(f"deleted topics {', '.join(deleted) or '(none existed)'}")
        return 0


def _add_capture_tuning(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dispatcher", choices=DISPATCHERS, default="segment",
                        help="partition the changes topic by segment (default) or by key")
    parser.add_argument("--max-buffered", type=int, default=1000,
                        help="events of one transaction held back before it is streamed (bounds memory)")
    parser.add_argument("--heartbeat-interval", type=float, default=1.0, help="seconds between watermarks")


class CaptureRun(Command):
    name, help = "run", "run capture workers in the foreground (all nodes, or one with --node)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--node", type=int, help="content id of the one node to capture")
        _add_capture_tuning(parser)

    def run(self, args: argparse.Namespace, config: Config) -> int:
        if args.node is not None:
            run_worker(config, args.node, dispatcher=args.dispatcher, max_buffered=args.max_buffered,
                       heartbeat_interval=args.heartbeat_interval)
            return 0
        group = CaptureGroup(config, dispatcher=args.dispatcher, max_buffered=args.max_buffered,
                             heartbeat_interval=args.heartbeat_interval)
        check_reachable(kafka_client_settings(config)["bootstrap.servers"])
        procs = [subprocess.Popen(group.worker_argv(node.content)) for node in group.pipeline.start_point().nodes]
        _print(f"capturing {len(procs)} nodes; Ctrl-C stops")
        try:
            codes = [p.wait() for p in procs]
        except KeyboardInterrupt:
            for p in procs:
                p.terminate()
            codes = [p.wait() for p in procs]
        return max(codes, default=0)


class CaptureStart(Command):
    name, help = "start", "start capture workers in the background"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_capture_tuning(parser)

    def run(self, args: argparse.Namespace, config: Config) -> int:
        check_reachable(kafka_client_settings(config)["bootstrap.servers"])
        group = CaptureGroup(config, dispatcher=args.dispatcher, max_buffered=args.max_buffered,
                             heartbeat_interval=args.heartbeat_interval)
        started = group.start()
        _print(f"started {len(started)} capture workers" + (f": pids {sorted(started.values())}" if started else ""))
        return 0


class CaptureStop(Command):
    name, help = "stop", "stop the background capture workers"

    def run(self, args: argparse.Namespace, config: Config) -> int:
        stopped = CaptureGroup(config).stop()
        _print(f"stopped {len(stopped)} capture workers")
        return 0


class Status(Command):
    name, help = "status", "per node: slot position against the WAL, acknowledged commits, events, worker"

    def run(self, args: argparse.Namespace, config: Config) -> int:
        rows = capture_status(open_cluster(config, "source"), CaptureGroup(config))
        _print(f"{'node':>4} {'worker':<14} {'behind':>12} {'seconds':>8} {'events':>10} {'MB':>8} "
               f"{'acked LSN':>12} {'last acked commit':<24}")
        for r in rows:
            _print(f"{r.node:>4} {r.worker:<14} {r.bytes_behind:>12} {r.seconds_behind:>8} {r.events:>10} "
                   f"{r.megabytes:>8.1f} {r.acked_lsn:>12} {r.last_commit:<24}")
        troubled = [r for r in rows if r.state.startswith(("reconnecting", "waiting", "failed"))]
        for r in troubled:
            # A live worker that cannot reach Kafka, or one that stopped for good, says why.
            print(f"gpcdc: node {r.node}'s capture worker is {r.state.split(':')[0]}"
                  + (f": {r.last_error}" if r.last_error else ""), file=sys.stderr)
        down = [str(r.node) for r in rows if not r.alive]
        if down:
            print(f"gpcdc: capture workers are not running for nodes {', '.join(down)} "
                  f"(start them with `gpcdc capture start`)", file=sys.stderr)
            return 3
        return 3 if troubled else 0


class Replay(Command):
    name, help = "replay", "apply the pipeline's transactions to the target cluster, whole and in source order"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--once", action="store_true",
                            help="apply what the topics hold now, then stop (default: follow the stream)")
        parser.add_argument("--batch", type=int, default=ReplaySettings.batch_transactions,
                            help="source transactions per target transaction, at most (default: %(default)s)")
        parser.add_argument("--no-initial-load", dest="initial_load", action="store_false",
                            help="do not load the bootstrap's snapshot into the target before replaying")
        parser.add_argument("--legacy-per-segment", action="store_true",
                            help="replay a stream written with legacy markers segment by segment: exact once caught "
                                 "up, but parts of distributed transactions can show until then")
        parser.add_argument("--skip-ddl", type=int, action="append", default=[], metavar="GXID",
                            help="record a refused DDL transaction as applied without running it, once its change "
                                 "was given to the target by hand (repeatable)")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        if args.batch < 1:
            raise ConfigError(f"--batch must be at least 1, not {args.batch}")
        stop = []
        # Stop between batches, never inside a target commit.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.append(True))
        status = StatusLine()
        settings = ReplaySettings(batch_transactions=args.batch, initial_load=args.initial_load,
                                  legacy_per_segment=args.legacy_per_segment, skip_ddl=frozenset(args.skip_ddl))
        with Replayer(config, settings=settings) as replayer:
            try:
                final = replayer.run(follow=not args.once, progress=status, should_stop=lambda: bool(stop))
            finally:
                status.close()
            if replayer.initial_load is not None:
                _print("initial load: {} rows into {} tables".format(*replayer.initial_load))
        _print(final.line())
        return 0


GROUPS: dict[str, tuple[str, list[Command]]] = {
    "sandbox": ("sandbox clusters of PostgreSQL 15 servers", [SandboxUp(), SandboxDown(), SandboxStatus()]),
    "broker": ("the embedded Kafka-compatible broker", [BrokerUp(), BrokerDown(), BrokerStatus()]),
    "bootstrap": ("replication slots at a distributed-transaction-consistent point", [BootstrapCreate(), BootstrapDrop()]),
    "capture": ("capture workers: every node into Kafka", [CaptureRun(), CaptureStart(), CaptureStop()]),
}
COMMANDS: list[Command] = [Workload(), Status(), Replay(), Demo()]


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="configuration file (default: $GPCDC_CONFIG or ./gpcdc.toml)")
    for name, (_default, help_text) in SETTINGS.items():
        parser.add_argument(flag(name), dest="setting:" + name, metavar="VALUE", help=help_text)
