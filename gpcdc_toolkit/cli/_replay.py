"""``gpcdc replay``."""

from __future__ import annotations

import argparse
import dataclasses
import signal

from ..config import Config
from ..replay import Replayer, StatusLine
from ._command import Command, say


class Replay(Command):
    name, help = "replay", "apply the pipeline's transactions to the target cluster, whole and in source order"
    sections = ("replay",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--once", action="store_true",
                            help="apply what the topics hold now, then stop (default: follow the stream)")
        parser.add_argument("--skip-ddl", type=int, action="append", default=[], metavar="GXID",
                            help="record a refused DDL transaction as applied without running it, once its change "
                                 "was given to the target by hand (repeatable)")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        stop = []
        # Stop between batches, never inside a target commit.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.append(True))
        status = StatusLine()
        settings = dataclasses.replace(config.replay, skip_ddl=frozenset(args.skip_ddl))
        with Replayer(config, settings=settings) as replayer:
            if config.replay.metrics_port:
                from .._metrics import replay_metrics, serve

                target = replayer.target.describe()
                serve(config.replay.metrics_port, "replay.metrics_port",
                      lambda: replay_metrics(replayer.latest, config.kafka.topic_prefix, target))
            try:
                final = replayer.run(follow=not args.once, progress=status, should_stop=lambda: bool(stop))
            finally:
                status.close()
            if replayer.initial_load is not None:
                say("initial load: {} rows into {} tables".format(*replayer.initial_load))
        say(final.line())
        return 0
