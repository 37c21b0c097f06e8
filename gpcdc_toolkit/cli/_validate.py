"""``gpcdc validate``."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from ..config import Config
from ..errors import ConfigError
from ._command import Command, say


def gxid_argument(what: str) -> Callable[[str], int]:
    """An argument type taking a positive gxid, refusing anything else as not ``what``."""
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return int(text)
    return parse


syncpoint_id = gxid_argument("a sync point id (a positive gxid)")


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
        when.add_argument("--at-syncpoint", dest="syncpoint", type=syncpoint_id, metavar="ID",
                          help="read both sides at a sync point that `gpcdc syncpoint --hold` holds")
        when.add_argument("--no-syncpoint", dest="syncpoint", action="store_false",
                          help="read both sides as they are, one after the other: exact only when neither changes")
        when.add_argument("--against-syncpoint", dest="against", type=syncpoint_id, metavar="ID",
                          help="compare the target as it is with the source as it was at sync point ID, by the "
                               "digests recorded then (a target rebuilt with `gpcdc replay --until-syncpoint ID`)")
        parser.add_argument("--archive", type=Path, metavar="PATH",
                            help="with --against-syncpoint: the archive whose copy of the record to read")
        parser.add_argument("--mode", dest="setting:validate.mode", choices=("checksum", "spark"),
                            default=argparse.SUPPRESS, help="same as --validate-mode")
        parser.add_argument("--fail-on", dest="setting:validate.fail_on", choices=("error", "warning", "info"),
                            default=argparse.SUPPRESS, help="same as --validate-fail-on")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        # Exit 2 whatever stopped the validation: 1 is kept for "it ran, and found differences"
        # (or an expectation the target fails).
        if args.archive is not None and args.against is None:
            raise ConfigError("--archive names where a sync point's record is", fix="give it with --against-syncpoint ID")
        if args.against is not None and args.tables:
            raise ConfigError("--against-syncpoint compares every table the sync point recorded",
                              fix="leave out --tables")
        try:
            from ..validate import check_against_syncpoint, validate

            run = (check_against_syncpoint(config, args.against, archive=args.archive) if args.against is not None
                   else validate(config, tables=args.tables, syncpoint=args.syncpoint))
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
                                 "there for this long (inf: until stopped) for `gpcdc validate --at-syncpoint`")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        from ..bootstrap import Pipeline, distributed_tables
        from ..connect import open_cluster
        from ..validate._recorded import record_syncpoint
        from ..validate._syncpoint import held_file, publish, take_syncpoint

        if not args.hold >= 0:  # negative, or not a number
            raise ConfigError(f"--hold {args.hold:g} is not a number of seconds", fix="give the seconds to hold, or 0")
        source = open_cluster(config, "source")
        pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
        with source.coordinator_connection() as conn:
            captured = conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (pipeline.slot,)).fetchone()
        if captured is None:  # the cut would be marked, and recorded where no replay looks
            raise ConfigError(f"the source has no slot {pipeline.slot}: no pipeline with topic prefix "
                              f"{pipeline.prefix!r} captures it", fix="give the pipeline's kafka.topic_prefix, or "
                              "bootstrap it first (`gpcdc bootstrap create`)")
        target = open_cluster(config, "target") if args.hold else None
        tables = distributed_tables(source)
        with take_syncpoint(source, target, pipeline=config.kafka.topic_prefix, tables=tables,
                            lock_timeout=config.validate.lock_timeout) as point:
            say(f"sync point {point.gxid}: writers held {point.stall_ms} ms")
            record_syncpoint(point, tables, pipeline.syncpoints_dir)
            say(f"sync point {point.gxid}: {len(tables)} tables digested as of the cut (`gpcdc validate "
                f"--against-syncpoint {point.gxid}` proves a target rebuilt there)")
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
                stop.wait(None if args.hold > threading.TIMEOUT_MAX else args.hold)  # inf: until stopped
            finally:
                path.unlink(missing_ok=True)
        return 0
