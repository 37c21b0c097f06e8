"""``gpcdc sandbox``, ``gpcdc broker`` and ``gpcdc spark``: the servers the embedded default runs."""

from __future__ import annotations

import argparse
import sys
import time

from ..broker import KAFKA_VERSION, EmbeddedBroker, check_reachable
from ..cluster import COORDINATOR
from ..config import Config
from ..connect import kafka_client_settings
from ..ingest import SparkServer
from ..sandbox import FLAVOURS, Sandbox, list_sandboxes
from ._command import Command, say


class SandboxUp(Command):
    name, help = "up", "create and start a sandbox cluster (or start an existing one)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--name", default="source", help="sandbox name (default: source)")
        parser.add_argument("--segments", type=int, default=3, help="number of segments (default: 3)")
        parser.add_argument("--base-port", type=int, help="first port; nodes take consecutive ports (default: free ports)")
        parser.add_argument("--flavour", choices=FLAVOURS, default="greenplum",
                            help="greenplum: coordinator and segments (default); postgres: one plain server (a "
                                 "replay target); citus: a Citus coordinator and --segments workers (a replay target)")
        parser.add_argument("--mirrors", action="store_true",
                            help="a synchronous mirror per segment and a standby coordinator (greenplum only)")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        sandbox = Sandbox(args.name, config.work_dir).up(segments=args.segments, base_port=args.base_port,
                                                         flavour=args.flavour, mirrors=args.mirrors)
        say(f"sandbox {sandbox.name!r} is up: {sandbox.dsn}")
        return 0


class SandboxFailover(Command):
    name, help = "failover", ("fail a segment's primary and promote its mirror in its place (as Greenplum's FTS "
                              "does), or the coordinator and promote its standby (as gpactivatestandby does)")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--name", default="source", help="sandbox name (default: source)")
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--segment", type=int, help="the segment's content id")
        which.add_argument("--coordinator", action="store_true", help="the coordinator: its standby takes over")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        content = COORDINATOR if args.coordinator else args.segment
        promoted = Sandbox(args.name, config.work_dir).failover(content)
        what = "the coordinator" if args.coordinator else f"segment {content}"
        say(f"{what} of sandbox {args.name!r} failed over: its {'standby' if args.coordinator else 'mirror'} is the "
            f"primary, on port {promoted.port}")
        return 0


class SandboxExpand(Command):
    name, help = "expand", ("add segments and redistribute every table over them, as gpexpand does (one "
                            "distributed transaction per table; writers wait meanwhile)")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--name", default="source", help="sandbox name (default: source)")
        what = parser.add_mutually_exclusive_group(required=True)
        what.add_argument("--segments", type=int, help="how many segments to add")
        what.add_argument("--finish", action="store_true",
                          help="only move the rows an expansion stopped half-way left where they no longer belong")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        sandbox = Sandbox(args.name, config.work_dir)
        expansion = sandbox.finish_expansion() if args.finish else sandbox.expand(args.segments)
        if expansion.added:
            say(f"sandbox {args.name!r} has new segments {expansion.added}: {expansion.rows_moved} rows of "
                f"{len(expansion.moved)} tables moved to them")
        else:
            say(f"sandbox {args.name!r}: {expansion.rows_moved} rows of {len(expansion.moved)} tables moved to the "
                "segments their distribution key places them on")
        for table, (rows, gxid) in sorted(expansion.moved.items()):
            say(f"  {table}: {rows} rows (gxid {gxid})")
        return 0


class SandboxDown(Command):
    name, help = "down", "stop a sandbox cluster"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--name", default="source", help="sandbox name (default: source)")
        parser.add_argument("--remove", action="store_true", help="also delete its data")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        Sandbox(args.name, config.work_dir).down(remove=args.remove)
        say(f"sandbox {args.name!r} is {'removed' if args.remove else 'stopped'}")
        return 0


class SandboxStatus(Command):
    name, help = "status", "show the nodes of one sandbox, or of all"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--name", help="sandbox name (default: every sandbox)")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        sandboxes = [Sandbox(args.name, config.work_dir)] if args.name else list_sandboxes(config.work_dir)
        if not sandboxes:
            say(f"no sandboxes in {config.work_dir}")
        down = 0
        for sandbox in sandboxes:
            mirrors = {m.datadir for m in sandbox.mirrors}
            say(f"sandbox {sandbox.name}:")
            for node, pid in sandbox.status():
                down += pid is None
                state = f"running (pid {pid})" if pid else "stopped"
                role = "mirror" if node.datadir in mirrors else "primary"
                say(f"  {node.name:<12} {role:<8} port {node.port:<5} {state:<22} {node.datadir}")
        return 0 if down == 0 else 3


class BrokerUp(Command):
    name, help = "up", "start the embedded Kafka broker (Apache Kafka, KRaft mode)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--port", type=int, help="port (default: the one it had before, else a free one)")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        started = time.monotonic()
        broker = EmbeddedBroker(config.work_dir).up(port=args.port)
        say(f"broker is up: bootstrap.servers={broker.bootstrap_servers} (Apache Kafka {KAFKA_VERSION}, "
            f"pid {broker.pid}, {time.monotonic() - started:.1f} s); data in {broker.data}")
        return 0


class BrokerDown(Command):
    name, help = "down", "stop the embedded broker (its data stays)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--remove", action="store_true", help="also delete its data, ports and logs")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        broker = EmbeddedBroker(config.work_dir)
        if args.remove:
            broker.remove()
            say(f"broker is stopped and {broker.path} removed")
        else:
            broker.down()
            say("broker is stopped")
        return 0


class BrokerStatus(Command):
    name, help = "status", "where the configured Kafka listens, and whether it answers"

    def run(self, args: argparse.Namespace, config: Config) -> int:
        if config.kafka.bootstrap_servers:
            check_reachable(kafka_client_settings(config))  # as the pipeline connects: [kafka.client] too
            say(f"Kafka answers at {config.kafka.bootstrap_servers}")
            return 0
        broker = EmbeddedBroker(config.work_dir)
        status = broker.status()
        if status.answers:
            say(f"the embedded broker answers at {status.bootstrap_servers} (pid {status.pid})")
            return 0
        if status.running:
            print(f"gpcdc: the embedded broker runs (pid {status.pid}) but does not answer at "
                  f"{status.bootstrap_servers}; see {broker.log_file}", file=sys.stderr)
        else:
            where = f" (it listened at {status.bootstrap_servers})" if status.bootstrap_servers else ""
            print(f"gpcdc: the embedded broker is not running{where}; start it with `gpcdc broker up`", file=sys.stderr)
        return 3


class SparkUp(Command):
    name, help = "up", ("start the work directory's Spark Connect server: the commands and notebooks use it "
                        "instead of starting a JVM each")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--port", type=int, help="port (default: a free one)")
        parser.add_argument("--warm", action="store_true",
                            help="then audit a small stream made for it, so that the first audit of a pipeline "
                                 "finds what it runs compiled")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        started = time.monotonic()
        server = SparkServer(config.work_dir).up(config.spark.master, port=args.port,
                                                 class_archive=config.spark.class_archive)
        say(f"Spark Connect server is up: {server.url} ({config.spark.master}, pid {server.pid}, "
            f"{time.monotonic() - started:.1f} s); log in {server.log_file}")
        if args.warm:
            from ..audit import warm_up
            from ..ingest.spark import spark_session

            started = time.monotonic()
            spark = spark_session(config, "gpcdc-warm-up")
            try:
                warm_up(spark, config)
            finally:
                spark.stop()
            say(f"Spark Connect server is warm: an audit ran on it ({time.monotonic() - started:.1f} s)")
        return 0


class SparkDown(Command):
    name, help = "down", "stop the Spark Connect server (the commands start sessions of their own again)"

    def run(self, args: argparse.Namespace, config: Config) -> int:
        was_running = SparkServer(config.work_dir).down()
        say("Spark Connect server is stopped" if was_running else "Spark Connect server was not running")
        return 0


class SparkStatus(Command):
    name, help = "status", "whether the Spark Connect server runs and answers"

    def run(self, args: argparse.Namespace, config: Config) -> int:
        server = SparkServer(config.work_dir)
        status = server.status()
        if status.answers:
            say(f"Spark Connect server answers at {status.url} (pid {status.pid})")
            return 0
        if status.running:
            print(f"gpcdc: the Spark Connect server runs (pid {status.pid}) but does not answer at {status.url}; "
                  f"see {server.log_file}", file=sys.stderr)
        else:
            print("gpcdc: the Spark Connect server is not running: commands start a Spark session of their own; "
                  "start it with `gpcdc spark up`", file=sys.stderr)
        return 3
