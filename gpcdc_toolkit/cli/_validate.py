"""``gpcdc validate``."""

from __future__ import annotations

import argparse
import sys

from ..config import Config
from ._command import Command, say


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
