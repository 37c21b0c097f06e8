"""``gpcdc workload`` and ``gpcdc demo``: writing to a source, and the whole job on the embedded default."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..bootstrap import METHODS
from ..config import Config
from ..connect import open_cluster
from ..demo import DemoOptions, run_demo
from ..errors import ConfigError
from ..workload import WorkloadSpec, run_workload
from ._command import Command, say


def _add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    d = WorkloadSpec()
    parser.add_argument("--threads", type=int, default=d.threads)
    parser.add_argument("--duration", type=float, default=d.duration, help="seconds (default: %(default)s)")
    parser.add_argument("--transactions", type=int, help="stop after this many transactions instead")
    parser.add_argument("--rate", type=float, help="target distributed transactions per second (default: as fast as possible)")
    parser.add_argument("--rows", type=int, default=d.rows_per_transaction, help="rows per transaction")
    parser.add_argument("--multi-segment-share", type=float, default=d.multi_segment_share)
    parser.add_argument("--hot-keys", type=int, default=d.hot_keys, help="shared accounts updated concurrently")
    parser.add_argument("--hot-share", type=float, default=d.hot_share)
    parser.add_argument("--update-share", type=float, default=d.update_share)
    parser.add_argument("--delete-share", type=float, default=d.delete_share)
    parser.add_argument("--move-share", type=float, default=d.move_share, help="updates of the distribution key")
    parser.add_argument("--abort-share", type=float, default=d.abort_share)
    parser.add_argument("--abort-after-prepare-share", type=float, default=d.abort_after_prepare_share)
    parser.add_argument("--large-transaction-rows", type=int, default=0, help="run one transaction this large first")
    parser.add_argument("--legacy-markers", action="store_true", help="write WAL markers as stock Greenplum does")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ground-truth", type=Path, help="append one JSON line per transaction to this file")


def _workload_spec(args: argparse.Namespace) -> WorkloadSpec:
    try:
        return WorkloadSpec(
            threads=args.threads, duration=None if args.transactions else args.duration,
            transactions=args.transactions, rate=args.rate, rows_per_transaction=args.rows,
            multi_segment_share=args.multi_segment_share, hot_keys=args.hot_keys, hot_share=args.hot_share,
            update_share=args.update_share, delete_share=args.delete_share, move_share=args.move_share,
            abort_share=args.abort_share, abort_after_prepare_share=args.abort_after_prepare_share,
            large_transaction_rows=args.large_transaction_rows, legacy_markers=args.legacy_markers, seed=args.seed,
        )
    except ValueError as e:
        raise ConfigError(f"invalid workload: {e}") from None


def _progress_line(result: object) -> None:
    if sys.stderr.isatty():
        print(f"\r{result.committed} committed, {result.rate:.0f} dtx/s", end="", file=sys.stderr, flush=True)  # type: ignore[attr-defined]


class Workload(Command):
    name, help = "workload", "run concurrent distributed transactions against a cluster"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--cluster", choices=("source", "target"), default="source")
        _add_workload_arguments(parser)

    def run(self, args: argparse.Namespace, config: Config) -> int:
        spec = _workload_spec(args)
        result = run_workload(open_cluster(config, args.cluster), spec, ground_truth=args.ground_truth,
                              progress=_progress_line)
        if sys.stderr.isatty():
            print(file=sys.stderr)
        say(result.summary())
        return 0


class Demo(Command):
    name = "demo"
    help = ("the main job on the embedded default: sandboxes, broker, then bootstrap, capture, workload, replay, "
            "validation, audit and exploration, each a notebook run into reports/")
    sections = ("report",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        d = WorkloadSpec(hot_keys=10)
        parser.add_argument("--segments", type=int, default=3, help="source segments (the target gets one fewer)")
        parser.add_argument("--method", choices=METHODS, default="snapshot", help="bootstrap method")
        parser.add_argument("--keep", action="store_true", help="leave the sandboxes, the broker and capture running")
        parser.add_argument("--threads", type=int, default=d.threads, help="workload threads")
        parser.add_argument("--duration", type=float, default=d.duration, help="workload seconds (default: %(default)s)")
        parser.add_argument("--hot-keys", type=int, default=d.hot_keys, help="shared accounts updated concurrently")
        parser.add_argument("--seed", type=int, default=0)

    def run(self, args: argparse.Namespace, config: Config) -> int:
        if args.segments < 1:
            raise ConfigError(f"--segments {args.segments}: a sandbox needs at least one segment", fix="give 1 or more")
        try:
            spec = WorkloadSpec(threads=args.threads, duration=args.duration, hot_keys=args.hot_keys, seed=args.seed)
        except ValueError as e:
            raise ConfigError(f"invalid workload: {e}") from None
        return run_demo(config, DemoOptions(segments=args.segments, method=args.method, keep=args.keep, workload=spec),
                        say=say)
