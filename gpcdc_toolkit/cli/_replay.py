"""``gpcdc replay``."""

from __future__ import annotations

import argparse
import signal

from ..config import Config
from ..errors import ConfigError
from ..replay import Replayer, ReplaySettings, StatusLine
from ._command import Command, say


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
                say("initial load: {} rows into {} tables".format(*replayer.initial_load))
        say(final.line())
        return 0
