"""``gpcdc sandbox`` and ``gpcdc broker``: the servers the embedded default runs."""

from __future__ import annotations

import argparse

from ..broker import EmbeddedBroker, check_reachable
from ..config import Config
from ..connect import kafka_client_settings
from ..sandbox import Sandbox, list_sandboxes
from ._command import Command, say


class SandboxUp(Command):
    name, help = "up", "create and start a sandbox cluster (or start an existing one)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--name", default="source", help="sandbox name (default: source)")
        parser.add_argument("--segments", type=int, default=3, help="number of segments (default: 3)")
        parser.add_argument("--base-port", type=int, help="first port; nodes take consecutive ports (default: free ports)")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        sandbox = Sandbox(args.name, config.work_dir).up(segments=args.segments, base_port=args.base_port)
        say(f"sandbox {sandbox.name!r} is up: {sandbox.dsn}")
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
            status = sandbox.status()
            say(f"sandbox {sandbox.name}:")
            for node, pid in status:
                down += pid is None
                state = f"running (pid {pid})" if pid else "stopped"
                say(f"  {node.name:<12} port {node.port:<5} {state:<22} {node.datadir}")
        return 0 if down == 0 else 3


class BrokerUp(Command):
    name, help = "up", "start the embedded Kafka-compatible broker"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--port", type=int, help="port (default: a free one)")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        broker = EmbeddedBroker(config.work_dir).up(port=args.port)
        say(f"broker is up: bootstrap.servers={broker.bootstrap_servers} (pid {broker.pid})")
        return 0


class BrokerDown(Command):
    name, help = "down", "stop the embedded broker"

    def run(self, args: argparse.Namespace, config: Config) -> int:
        EmbeddedBroker(config.work_dir).down()
        say("broker is stopped")
        return 0


class BrokerStatus(Command):
    name, help = "status", "tell whether the configured Kafka answers"

    def run(self, args: argparse.Namespace, config: Config) -> int:
        servers = kafka_client_settings(config)["bootstrap.servers"]
        check_reachable(servers)
        say(f"Kafka answers at {servers}")
        return 0
