"""``reports/index.html``: every run with its job, time, status, duration, headline
figures and links, newest first. Built again from each run's ``run.json`` every time
(a run directory deleted is a run gone from the index)."""

from __future__ import annotations

import html
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .._runtime import pid_alive
from ._headline import format_figure

RUN_FILE = "run.json"
INDEX = "index.html"

_STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#1f2328}
h1{font-size:1.6em;margin:0 0 4px} p.sub{color:#57606a;margin:0 0 16px}
table{border-collapse:collapse;width:100%} th,td{text-align:left;padding:6px 10px;border-bottom:1px solid #d0d7de;
vertical-align:top} th{background:#f6f8fa}
.status{font-weight:600;border-radius:4px;padding:2px 8px}
.ok{background:#dafbe1;color:#116329}.findings{background:#fff8c5;color:#7d4e00}.failed{background:#ffebe9;color:#a40e26}
.running{background:#ddf4ff;color:#0550ae}
.fig{display:inline-block;margin:0 14px 2px 0}.fig b{font-size:1.1em}.verdict{color:#57606a}
"""


def index_html(runs: Iterable[Mapping[str, Any]]) -> str:
    """The index page of ``runs`` (each a run.json record, with ``dir`` its directory's name)."""
    ordered = sorted(runs, key=_started, reverse=True)
    counts: dict[str, int] = {}
    for run in ordered:
        counts[str(run.get("status"))] = counts.get(str(run.get("status")), 0) + 1
    rows = "\n".join(_row(run) for run in ordered)
    tally = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no runs yet"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>gpcdc reports</title>'
            f"<style>{_STYLE}</style></head><body>\n<h1>gpcdc reports</h1>\n"
            f'<p class="sub">{len(ordered)} runs: {html.escape(tally)}</p>\n'
            "<table><thead><tr><th>job</th><th>started (UTC)</th><th>status</th><th>duration</th>"
            f"<th>headline</th><th>files</th></tr></thead><tbody>\n{rows}\n</tbody></table></body></html>\n")


def _started(run: Mapping[str, Any]) -> tuple[str, float]:
    at = run.get("started_at")
    return str(run.get("started", "")), at if isinstance(at, int | float) else 0.0


def _row(run: Mapping[str, Any]) -> str:
    directory = str(run.get("dir", ""))
    status = str(run.get("status", ""))
    figures = "".join(f'<span class="fig"><b>{html.escape(format_figure(v))}</b> {html.escape(str(k))}</span>'
                      for k, v in _pairs(run.get("figures")))
    said = run.get("verdict") or run.get("error") or ""
    verdict = f'<div class="verdict">{html.escape(str(said))}</div>' if said else ""
    links = " ".join(f'<a href="{html.escape(quote(directory))}/{name}">{label}</a>'
                     for name, label in (("report.html", "report"), ("notebook.ipynb", "notebook"))
                     if name in run.get("files", []))
    seconds = run.get("seconds")
    duration = f"{seconds:.1f} s" if isinstance(seconds, int | float) else ""
    return (f"<tr><td>{html.escape(str(run.get('job', '')))}</td><td>{html.escape(str(run.get('started', '')))}</td>"
            f'<td><span class="status {html.escape(status)}">{html.escape(status)}</span></td><td>{duration}</td>'
            f"<td>{figures}{verdict}</td><td>{links}</td></tr>")


def _pairs(figures: Any) -> list[tuple[Any, Any]]:
    """A run's figures, [label, value] pairs; anything else in a hand-edited file left out."""
    return [(p[0], p[1]) for p in figures if isinstance(p, list) and len(p) == 2] if isinstance(figures, list) else []


def read_runs(reports: Path) -> list[dict[str, Any]]:
    runs = []
    for path in sorted(reports.glob(f"*/{RUN_FILE}")):
        try:
            run = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError):
            continue  # damaged: left out
        if not isinstance(run, dict):
            continue
        run = {**run, "dir": path.parent.name,
               "files": [f for f in run.get("files") or [] if isinstance(f, str)] if isinstance(run.get("files"), list)
               else []}
        if run.get("status") == "running" and not pid_alive(run.get("pid") if isinstance(run.get("pid"), int) else None):
            run.update(status="failed", error="the run ended without finishing (its process was killed)")
        runs.append(run)
    return runs


def runs_to_prune(runs: Iterable[Mapping[str, Any]], *, keep_runs: int, keep_days: float,
                  now: float) -> list[Mapping[str, Any]]:
    """The runs a retention removes: those beyond the newest ``keep_runs`` of their job
    (0: no such limit), and those started more than ``keep_days`` days before ``now``
    (epoch seconds; 0: no such limit). Never the newest run of a job, nor a run still
    running."""
    by_job: dict[str, list[Mapping[str, Any]]] = {}
    for run in sorted(runs, key=_started, reverse=True):
        by_job.setdefault(str(run.get("job")), []).append(run)
    out = []
    for job_runs in by_job.values():
        for rank, run in enumerate(job_runs):
            _, started_at = _started(run)
            too_many = keep_runs > 0 and rank >= keep_runs
            too_old = keep_days > 0 and started_at < now - keep_days * 86400
            if rank > 0 and run.get("status") != "running" and (too_many or too_old):
                out.append(run)
    return out


def prune_reports(reports: Path, *, keep_runs: int, keep_days: float, now: float,
                  dry_run: bool = False) -> list[Path]:
    """Remove the run directories :func:`runs_to_prune` names and rewrite the index;
    returns the directories (removed, or only named when ``dry_run``)."""
    doomed = [reports / str(run["dir"]) for run in runs_to_prune(read_runs(reports), keep_runs=keep_runs,
                                                                  keep_days=keep_days, now=now)]
    if not dry_run and doomed:
        for directory in doomed:
            shutil.rmtree(directory, ignore_errors=True)
        update_index(reports)
    return doomed


def update_index(reports: Path) -> Path:
    """Write ``reports/index.html`` from the runs there (atomically: a reader never sees half)."""
    page = index_html(read_runs(reports))
    path = reports / INDEX
    fd, temporary = tempfile.mkstemp(dir=reports, prefix=".index-", suffix=".html")
    with os.fdopen(fd, "w") as f:
        f.write(page)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)
    return path

