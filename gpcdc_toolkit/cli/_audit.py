"""``gpcdc audit`` and ``gpcdc archive``."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

from ..config import Config
from ..errors import ConfigError
from ._command import Command, say


def _time_ms(text: str) -> int:
    """Epoch milliseconds, or an ISO 8601 time (UTC unless it says otherwise)."""
    if text.isdigit():
        if len(text) > 15:  # past the year 33,000: no stream's time, and past what Kafka's timestamps hold
            raise argparse.ArgumentTypeError(f"{text!r} is not epoch milliseconds of a time a stream can hold")
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither epoch milliseconds nor an ISO 8601 time "
                                         "(e.g. 2026-11-23T12:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


class Audit(Command):
    name, help = "audit", "check the change stream's consistency: whole transactions, nothing missing, nothing out of order"
    sections = ("audit",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        window = parser.add_mutually_exclusive_group()
        window.add_argument("--since-last", action="store_true",
                            help="read from where the last scheduled audit ended, carrying what it left open")
        window.add_argument("--from", dest="start", type=_time_ms, metavar="TS",
                            help="start at this Kafka time (epoch ms or ISO 8601)")
        parser.add_argument("--to", dest="end", type=_time_ms, metavar="TS", help="stop before this Kafka time")
        parser.add_argument("--archive", type=Path, metavar="PATH",
                            help="audit a Parquet archive (gpcdc archive) instead of the Kafka topics")
        parser.add_argument("--fail-on", dest="setting:audit.fail_on", choices=("error", "warning", "info"),
                            default=argparse.SUPPRESS, help="same as --audit-fail-on")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        # Exit 2 whatever stopped the audit: 1 is kept for "it ran, and found something".
        try:
            from .._expect import preload
            from ..audit import check_request, run_audit, summary_table
            from ..ingest.spark import command_session

            window = {"since_last": args.since_last, "start_ms": args.start, "end_ms": args.end,
                      "archive": args.archive}
            check_request(config, **window)  # bad input refused before a Spark session starts
            preload()  # the stream's suites run last

            with command_session(config, "gpcdc-audit") as spark:
                result = run_audit(spark, config, **window)
                say(summary_table(result.summary))
                say(f"{result.events} messages audited; findings in {result.output}")
        except Exception as e:  # noqa: BLE001 (any cause is reported in one line)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            print(f"gpcdc: audit could not run: {first}", file=sys.stderr)
            return 2
        return 1 if result.fails(config.audit.fail_on) else 0


class Archive(Command):
    name, help = "archive", "append the topics' new messages to a Parquet archive, for audits of long history and rebuilds"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--to", dest="path", type=Path, required=True, metavar="PATH",
                            help="the archive's directory")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        from ..archive import write_archive

        if args.path.exists() and not args.path.is_dir():
            raise ConfigError(f"{args.path} is not a directory", fix="give the archive's directory to --to")
        run = write_archive(config, args.path)
        say(f"archived {run.events} messages to {run.path}")
        return 0
