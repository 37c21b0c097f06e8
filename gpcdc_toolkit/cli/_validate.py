"""``gpcdc validate``."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from ..config import Config
from ..errors import ConfigError
from ._command import Command, say


def _gxid(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a sync point id (a positive gxid)")
    return int(text)


class Validate(Command):
    name, help = "validate", "compare the target with the source, table by table, at a consistent sync point"
    sections = ("validate",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--tables", nargs="+", metavar="TABLE",
                            help="tables as SQL names them (sales.\"Order Items\"); default: every distributed "
                                 "table of the source")
        when = parser.add_mutually_exclusive_group()
        when.add_argument("--new-syncpoint", dest="syncpoint", action="store_true", default=True,
                          help="cut the source now and read the target where the replayer reaches the cut "
                               "(the default; the replayer must be running)")
        when.add_argument("--at-syncpoint", dest="syncpoint", type=_gxid, metavar="ID",
                          help="read both sides at a sync point that `gpcdc syncpoint --hold` holds")
        when.add_argument("--no-syncpoint", dest="syncpoint", action="store_false",
                          help="read both sides as they are, one after the other: exact only when neither changes")
        parser.add_argument("--mode", dest="setting:validate.mode", choices=("checksum", "spark"),
                            default=argparse.SUPPRESS, help="same as --validate-mode")
        parser.add_argument("--fail-on", dest="setting:validate.fail_on", choices=("error", "warning", "info"),
                            default=argparse.SUPPRESS, help="same as --validate-fail-on")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        # Exit 2 whatever stopped the validation: 1 is kept for "it ran, and found differences"
        # (or an expectation the target fails).
        try:
            from ..validate import validate

            run = validate(config, tables=args.tables, syncpoint=args.syncpoint)
        except Exception as e:  # noqa: BLE001 (any cause is reported in one line)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            print(f"gpcdc: validate could not run: {first}", file=sys.stderr)
            return 2
        for line in run.lines():
            say(line)
        say(f"results in {run.output}")
        return 0 if run.verified else 1


class SyncPointCommand(Command):
    name = "syncpoint"
    help = "cut the source at a consistent point and mark it in the stream; with --hold, keep it readable"
    sections = ("validate",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--hold", type=float, default=0.0, metavar="SECONDS",
                            help="wait for the replayer to reach the sync point, then keep both sides readable "
                                 "there for this long (or until stopped) for `gpcdc validate --at-syncpoint`")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        from ..connect import open_cluster
        from ..validate._syncpoint import held_file, publish, take_syncpoint

        if args.hold < 0:
            raise ConfigError(f"--hold {args.hold:g} is negative", fix="give the seconds to hold, or 0")
        source = open_cluster(config, "source")
        target = open_cluster(config, "target") if args.hold else None
        with take_syncpoint(source, target, pipeline=config.kafka.topic_prefix,
                            lock_timeout=config.validate.lock_timeout) as point:
            say(f"sync point {point.gxid}: writers held {point.stall_ms} ms")
            if not args.hold:
                return 0
            point.wait_for_replay(config.validate.replay_timeout)
            path = held_file(config.work_dir, config.kafka.topic_prefix, point.gxid)
            stop = threading.Event()
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: stop.set())
            publish(point, path)
            try:
                say(f"sync point {point.gxid}: replayer held {point.replay_hold_ms} ms; both sides readable for "
                    f"{args.hold:g} s: gpcdc validate --at-syncpoint {point.gxid}")
                stop.wait(args.hold)
            finally:
                path.unlink(missing_ok=True)
        return 0
