"""``gpcdc run``: a notebook as a scheduled job."""

from __future__ import annotations

import argparse
import signal
import time

from ..config import Config
from ._command import Command, say


class Run(Command):
    name = "run"
    help = ("execute a notebook with papermill into reports/<job>-<time>/ (the executed notebook and a "
            "self-contained HTML report) and update reports/index.html; exit 0 passed, 1 findings, 2 a cell failed")
    sections = ("report",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("notebook", metavar="NOTEBOOK",
                            help="a notebook's name (bootstrap, capture, workload, replay, audit, validate, explore, investigate) "
                                 "or path")
        parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                            help="a parameter of the notebook's parameters cell (repeatable); no secrets: "
                                 "parameters are stored in the executed notebook")
        parser.add_argument("--fail-on", choices=("error", "warning", "info"),
                            help="the least severity of a finding that fails the run (the notebook's fail_on)")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        from ..report import run_notebook

        def interrupted(_signum: int, _frame: object) -> None:
            raise KeyboardInterrupt  # the run is recorded as interrupted, then the command ends (130)

        signal.signal(signal.SIGTERM, interrupted)  # as a scheduler stops a job
        parameters = dict(args.parameter)
        if args.fail_on:
            parameters["fail_on"] = args.fail_on
        done = run_notebook(config, args.notebook, parameters)
        say(done.line())
        say(f"index: {done.directory.parent / 'index.html'}")
        return done.exit_code


class ReportsPrune(Command):
    name = "prune"
    help = ("remove runs from the report directory as report.keep_runs and report.keep_days say (never a job's "
            "last run, nor one still running), and rewrite its index")
    sections = ("report",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="only list what would be removed")

    def run(self, args: argparse.Namespace, config: Config) -> int:
        from ..report import prune_reports

        reports = config.report.dir
        if not reports.is_dir():
            say(f"{reports} holds no runs")
            return 0
        pruned = prune_reports(reports, keep_runs=config.report.keep_runs, keep_days=config.report.keep_days,
                               now=time.time(), dry_run=args.dry_run)
        for directory in pruned:
            say(f"{'would remove' if args.dry_run else 'removed'} {directory}")
        say(f"{len(pruned)} runs {'to remove' if args.dry_run else 'removed'} from {reports}")
        return 0
