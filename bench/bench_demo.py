"""The demo's notebook runs: each run's time, report size and stored notebook size, against a baseline run
in the same process: an empty notebook through `gpcdc run` (a kernel started, the
notebook executed and exported, the index rewritten), the cost every job pays.

    .venv/bin/python bench/bench_demo.py
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from gpcdc_toolkit._runtime import interrupt_on_sigterm
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.demo import DemoOptions, run_demo
from gpcdc_toolkit.report import read_runs, run_notebook

EMPTY = {"cells": [{"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": "x = 1", "outputs": [],
                    "execution_count": None, "id": "p"}],
         "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
         "nbformat": 4, "nbformat_minor": 5}


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="gpcdc-bench-demo-", dir="/var/tmp"))
    root.chmod(0o755)
    try:
        config = load_config({"work_dir": str(root), "source.sandbox": "source", "target.sandbox": "target",
                              "report.dir": str(root / "reports")}, environ={})
        empty = root / "empty.ipynb"
        empty.write_text(json.dumps(EMPTY))
        baseline = [run_notebook(config, empty).seconds for _ in range(3)]
        base = sorted(baseline)[1]
        started = time.monotonic()
        code = run_demo(config, DemoOptions(), say=lambda line: None)
        wall = time.monotonic() - started
        runs = sorted((r for r in read_runs(root / "reports") if r["job"] != "empty"), key=lambda r: r["started"])
        print(f"baseline (empty notebook through gpcdc run, median of 3): {base:.2f} s")
        print(f"{'job':<10} {'status':<8} {'seconds':>8} {'x baseline':>10} {'report MB':>9} {'notebook KB':>11}")
        for run in runs:
            size = (root / "reports" / run["dir"] / "report.html").stat().st_size / 1e6
            stored = (root / "reports" / run["dir"] / "notebook.ipynb").stat().st_size / 1e3
            print(f"{run['job']:<10} {run['status']:<8} {run['seconds']:>8.1f} {run['seconds'] / base:>10.1f} {size:>9.2f}"
                  f" {stored:>11.0f}")
        print(f"demo wall time {wall:.1f} s ({wall / base:.0f}x baseline), exit status {code}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
