"""``gpcdc bootstrap``, ``gpcdc capture`` and ``gpcdc status``: a pipeline's slots and workers."""

from __future__ import annotations

import argparse
import subprocess
import sys

from ..bootstrap import METHODS, Pipeline, bootstrap
from ..broker import check_reachable
from ..capture import (
    CaptureGroup,
    capture_status,
    drop_pipeline,
    extend_pipeline,
    holder,
    kafka_watermarks,
    parse_nodes,
    repair_segment,
    run_worker,
)
from ..config import Config
from ..connect import kafka_client_settings, open_cluster
from ..errors import ClusterChangedError, ConfigError, GpcdcError, SandboxError, UnreachableError
from ..protocol import StartPoint, Topics, format_lsn
from ._command import Command, say


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
        say(f"{verb} slot {pipeline.slot} on {len(start.nodes)} nodes ({start.method} method); "
               f"start point: {pipeline.start_point_file}")
        for node in start.nodes:
            say(f"  node {node.content:>2}: consistent at {format_lsn(node.consistent_lsn)}, "
                   f"snapshot at {format_lsn(node.snapshot_lsn)}")
        if start.lock_window_ms is not None:
            say(f"  new distributed transactions waited at most {start.lock_window_ms:.0f} ms")
        if start.snapshot is not None:
            say(f"  distributed snapshot: xmax {start.snapshot.xmax}, "
                   f"{len(start.snapshot.in_progress)} in progress; cut took {start.extra.get('cut_ms')} ms")
        return 0


class BootstrapDrop(Command):
    name, help = "drop", "drop the pipeline's slots and publications, and forget its start point"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--delete-topics", action="store_true", help="also delete the pipeline's Kafka topics")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
        dropped = drop_pipeline(config, open_cluster(config, "source"), delete_topics=args.delete_topics)
        if dropped.workers:
            say("stopped the capture workers")
        say(f"dropped slot {pipeline.slot} on {len(dropped.slots)} nodes" if dropped.slots
            else f"no slot {pipeline.slot} on any node")
        if dropped.directory:
            say(f"removed {dropped.directory}")
        if dropped.topics is not None:
            say(f"deleted topics {', '.join(dropped.topics) or '(none existed)'}")
        return 0


class BootstrapRepair(Command):
    name, help = "repair", ("capture a lost segment again from a new consistent point (after a failover, its slot "
                            "dropped or invalidated, or a tail Kafka lost), without capturing the others again")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--segment", type=int, required=True, help="the lost segment's content id")
        parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for transactions or locks")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        pid = CaptureGroup(config).pid(args.segment)
        if pid is not None:
            raise GpcdcError(f"segment {args.segment}'s capture worker runs (pid {pid})",
                             fix="a lost segment's worker stops by itself; stop it (`gpcdc capture stop`) if it runs")
        pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
        repair = repair_segment(open_cluster(config, "source"), pipeline, args.segment, kafka_client_settings(config),
                                timeout=args.timeout)
        say(f"segment {args.segment} repaired (repair {repair.number}): slot {repair.node.slot} consistent at "
            f"{format_lsn(repair.node.consistent_lsn)}, rows copied as of distributed snapshot xmax "
            f"{repair.snapshot.xmax} into {pipeline.repair_dir(args.segment, repair.number)}")
        say("start its capture (`gpcdc capture start`); the replayer reconciles the segment's rows on the target")
        return 0


class BootstrapExtend(Command):
    name, help = "extend", ("capture the segments added to the source since the bootstrap (an expansion), each "
                            "from a consistent point of its own with its rows copied, without capturing the others again")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for transactions or locks")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        group = CaptureGroup(config)
        running = group.running()
        if running:
            raise GpcdcError(f"capture workers run for nodes {sorted(running)}",
                             fix="stop them (`gpcdc capture stop`: they go on from their slots), extend, then "
                                 "`gpcdc capture start`")
        pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
        for repair in extend_pipeline(open_cluster(config, "source"), pipeline, kafka_client_settings(config),
                                      dispatcher=config.capture.dispatcher, timeout=args.timeout):
            content = repair.node.content
            say(f"segment {content} joined the pipeline: slot {repair.node.slot} consistent at "
                f"{format_lsn(repair.node.consistent_lsn)}, rows copied as of distributed snapshot xmax "
                f"{repair.snapshot.xmax} into {pipeline.repair_dir(content, repair.number)}")
        say("start capture (`gpcdc capture start`); the replayer puts the new segments' rows in place on the target")
        return 0


class CaptureRun(Command):
    name, help = "run", "run capture workers in the foreground (all nodes, or one with --node)"
    sections = ("capture",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--node", type=int, help="content id of the one node to capture")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        if args.node is not None:
            run_worker(config, args.node)
            return 0
        group = CaptureGroup(config)
        check_reachable(kafka_client_settings(config))
        procs = [subprocess.Popen(group.worker_argv(node.content)) for node in group.pipeline.start_point().captured_nodes]
        say(f"capturing {len(procs)} nodes; Ctrl-C stops")
        try:
            codes = [p.wait() for p in procs]
        except KeyboardInterrupt:
            for p in procs:
                p.terminate()
            codes = [p.wait() for p in procs]
        return max(codes, default=0)


def _add_nodes(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--nodes", type=_node_list, metavar="LIST",
                        help=f"{what} only these nodes: content ids and ranges, e.g. 0-31 or coordinator,0-7 "
                             "(default: all)")


def _node_list(text: str) -> frozenset[int]:
    try:
        return parse_nodes(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(e.message) from None


class CaptureStart(Command):
    name, help = "start", "start capture workers in the background (on this host, for the nodes no host captures)"
    sections = ("capture",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_nodes(parser, "start workers for")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        check_reachable(kafka_client_settings(config))
        started = CaptureGroup(config).start(nodes=args.nodes)
        pids = sorted(started.pids.values())
        say(f"started {len(pids)} capture workers" + (f": pids {pids}" if pids else ""))
        by_worker = {c: holder(name) for c, name in started.elsewhere.items()}
        for content, (host, pid) in sorted((c, w) for c, w in by_worker.items() if w is not None):
            say(f"node {content}: captured already by pid {pid} on {host}")
        return 0


class CaptureStop(Command):
    name, help = "stop", "stop this host's background capture workers"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_nodes(parser, "stop the workers of")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        stopped = CaptureGroup(config).stop(nodes=args.nodes)
        say(f"stopped {len(stopped)} capture workers")
        return 0


class Status(Command):
    name, help = "status", "per node: slot position against the WAL, acknowledged commits, events, worker"

    def run(self, args: argparse.Namespace, config: Config) -> int:
        source = open_cluster(config, "source")  # the source unreachable: nothing to show
        group = CaptureGroup(config)
        watermarks = None
        try:
            watermarks = kafka_watermarks(kafka_client_settings(config), Topics(config.kafka.topic_prefix))
        except GpcdcError as e:  # the rest is still worth showing; the exit status says it is not all well
            print(f"gpcdc: nothing is said of what Kafka holds: {e.message}", file=sys.stderr)
        rows = capture_status(source, group, watermarks)
        width = max([14, *(len(r.worker) for r in rows)])
        say(f"{'node':>4} {'worker':<{width}} {'behind':>12} {'seconds':>8} {'events':>10} {'MB':>8} "
            f"{'acked LSN':>12} {'last acked commit':<24} {'resolved in Kafka':<24}")
        for r in rows:
            say(f"{r.node:>4} {r.worker:<{width}} {r.bytes_behind:>12} {r.seconds_behind:>8} {r.events:>10} "
                f"{r.megabytes:>8.1f} {r.acked_lsn:>12} {r.last_commit:<24} {r.resolved_in_kafka:<24}")
        say(f"target: {_target(config)}")
        for r in rows:
            if r.held_by:
                print(f"gpcdc: node {r.node}'s slot is held by another client ({r.held_by!r}), not a capture worker",
                      file=sys.stderr)
        changed = [r for r in rows if r.changed]
        for r in changed:  # what a worker would stop on, whether one runs or not
            print(f"gpcdc: node {r.node} changed under the pipeline: {r.changed}", file=sys.stderr)
        if changed:
            return ClusterChangedError.exit_code
        troubled = [r for r in rows if r.state.startswith(("reconnecting", "waiting", "failed"))]
        for r in troubled:
            # A live worker that cannot reach Kafka, or one that stopped for good, says why.
            if r.state.startswith("failed"):
                print(f"gpcdc: node {r.node}'s capture stopped for good: {r.last_error}", file=sys.stderr)
            else:
                print(f"gpcdc: node {r.node}'s capture worker is {r.state.split(':')[0]}"
                      + (f": {r.last_error}" if r.last_error else ""), file=sys.stderr)
        down = [str(r.node) for r in rows if not r.alive and not r.state.startswith("failed") and not r.held_by]
        if down and not group.pipeline.start_point_file.is_file():
            print(f"gpcdc: no pipeline with topic prefix {config.kafka.topic_prefix!r} was bootstrapped in "
                  f"{config.work_dir} (bootstrap it with `gpcdc bootstrap create`, or run status with the work "
                  "directory and kafka.topic_prefix it was bootstrapped with)", file=sys.stderr)
        elif down:
            print(f"gpcdc: capture workers are not running for nodes {', '.join(down)} "
                  f"(start them with `gpcdc capture start`)", file=sys.stderr)
        return 3 if down or troubled or watermarks is None or any(r.held_by for r in rows) else 0


def _target(config: Config) -> str:
    """The target as the replayer would write to it; one it could not use now is said, not fatal."""
    try:
        return open_cluster(config, "target").describe()
    except (UnreachableError, SandboxError) as e:
        return f"{config.target.describe()}, not reachable now ({e.message})"
    except GpcdcError as e:  # reached, and refused: a replay would stop there too
        return f"{config.target.describe()}, which a replay would refuse: {e}"
