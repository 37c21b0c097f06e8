"""``gpcdc replay``."""

from __future__ import annotations

import argparse
import dataclasses
import signal
from pathlib import Path

from ..archive import ArchivedStream
from ..bootstrap import Pipeline
from ..config import Config
from ..connect import kafka_client_settings
from ..protocol import Topics
from ..replay import Replayer, StatusLine
from ..replay._until import iso_time, parse_time, syncpoint_before, syncpoints_in_kafka
from ._command import Command, say
from ._validate import gxid_argument, syncpoint_id


class Replay(Command):
    name, help = "replay", "apply the pipeline's transactions to the target cluster, whole and in source order"
    sections = ("replay",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--once", action="store_true",
                            help="apply what the topics hold now, then stop (default: follow the stream)")
        parser.add_argument("--skip-ddl", type=gxid_argument("a gxid (a positive integer, as the refusal names it)"),
                            action="append", default=[], metavar="GXID",
                            help="record a refused DDL transaction as applied without running it, once its change "
                                 "was given to the target by hand (repeatable)")
        parser.add_argument("--archive", type=Path, metavar="PATH",
                            help="read the stream and the pipeline's record from a Parquet archive (`gpcdc archive`) "
                                 "instead of Kafka; implies --once")
        until = parser.add_mutually_exclusive_group()
        until.add_argument("--until-syncpoint", type=syncpoint_id, metavar="ID",
                           help="stop once sync point ID is applied, with nothing after it: the target is then the "
                                "source as of that sync point")
        until.add_argument("--until", metavar="TIME",
                           help="stop at the last sync point committed at or before TIME (ISO 8601, UTC unless "
                                "it names a zone)")
        until.add_argument("--list-syncpoints", action="store_true",
                           help="list the sync points the stream holds (id, commit time, whether recorded), and stop")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        stop = []
        # Stop between batches, never inside a target commit.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.append(True))
        until = self._until(args, config)
        if until is None:
            return 0
        status = StatusLine()
        settings = dataclasses.replace(config.replay, skip_ddl=frozenset(args.skip_ddl))
        with Replayer(config, settings=settings, archive=args.archive) as replayer:
            if config.replay.metrics_port:
                from .._metrics import replay_metrics, serve

                target = replayer.target.describe()
                serve(config.replay.metrics_port, "replay.metrics_port",
                      lambda: replay_metrics(replayer.latest, config.kafka.topic_prefix, target))
            try:
                final = replayer.run(follow=not (args.once or args.archive), progress=status,
                                     should_stop=lambda: bool(stop), until_syncpoint=until or None)
            finally:
                status.close()
            if replayer.initial_load is not None:
                say("initial load: {} rows into {} tables".format(*replayer.initial_load))
        say(final.line())
        if until:
            say(f"stopped at sync point {until}: the target is the source as of it "
                f"(`gpcdc validate --against-syncpoint {until}` proves it)")
        return 0

    def _until(self, args: argparse.Namespace, config: Config) -> int | None:
        """The sync point to stop at (0: none); None once the sync points are listed."""
        if args.until_syncpoint is not None:
            return int(args.until_syncpoint)
        if args.until is None and not args.list_syncpoints:
            return 0
        until_ms = parse_time(args.until) if args.until is not None else None
        topics = Topics(config.kafka.topic_prefix)
        points = (ArchivedStream(args.archive, topics).syncpoints() if args.archive is not None
                  else syncpoints_in_kafka(kafka_client_settings(config), topics))
        if until_ms is None:
            recorded = {p.stem for p in Pipeline(args.archive or config.work_dir, topics.prefix).syncpoints_dir.glob("*.json")}
            for gxid, ms in points:
                say(f"{gxid}  {iso_time(ms)}  {'recorded' if str(gxid) in recorded else 'not recorded'}")
            say(f"{len(points)} sync points")
            return None
        gxid, ms = syncpoint_before(points, until_ms)
        say(f"--until {iso_time(until_ms)}: rounded down to sync point {gxid}, committed at {iso_time(ms)}")
        return gxid
