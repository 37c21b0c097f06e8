"""``reports/index.html``: every run with its job, time, status, duration, headline
figures and links, newest first. Built again from each run's ``run.json`` every time
(a run directory deleted is a run gone from the index)."""

from __future__ import annotations

import html
import json
import math
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
h2{font-size:1.25em;margin:28px 0 6px} h2 small{font-weight:normal;color:#57606a;font-size:0.75em}
table{border-collapse:collapse;width:100%} th,td{text-align:left;padding:6px 10px;border-bottom:1px solid #d0d7de;
vertical-align:top} th{background:#f6f8fa}
.status{font-weight:600;border-radius:4px;padding:2px 8px}
.ok{background:#dafbe1;color:#116329}.findings{background:#fff8c5;color:#7d4e00}.failed{background:#ffebe9;color:#a40e26}
.running{background:#ddf4ff;color:#0550ae}
.fig{display:inline-block;margin:0 14px 2px 0}.fig b{font-size:1.1em}.verdict{color:#57606a}
.params{font:0.85em ui-monospace,monospace;color:#57606a}
.trends{display:flex;flex-wrap:wrap;gap:8px 22px;margin:4px 0 10px}
.trend{font-size:0.85em;color:#57606a}.trend svg{display:block}.trend b{color:#1f2328}
.filters{margin:0 0 8px} .filters label{margin-right:16px}
"""
# The filters: a job and a status, also read from and written to the address's
# fragment (index.html#job=audit&status=findings), so that a filtered view is a link.
_FILTER_SCRIPT = """
function gpcdcFilter(fromHash) {
  var job = document.getElementById("gpcdc-job"), status = document.getElementById("gpcdc-status");
  if (fromHash) {
    var wanted = new URLSearchParams(location.hash.slice(1));
    job.value = wanted.get("job") || "";
    status.value = wanted.get("status") || "";
  }
  var shown = 0;
  document.querySelectorAll("section[data-job]").forEach(function (section) {
    var rows = 0;
    section.querySelectorAll("tr[data-status]").forEach(function (row) {
      row.hidden = Boolean(status.value) && row.dataset.status !== status.value;
      rows += row.hidden ? 0 : 1;
    });
    section.hidden = (Boolean(job.value) && section.dataset.job !== job.value) || rows === 0;
    shown += section.hidden ? 0 : rows;
  });
  document.getElementById("gpcdc-shown").textContent = shown + " shown";
  if (!fromHash) {
    var hash = new URLSearchParams();
    if (job.value) hash.set("job", job.value);
    if (status.value) hash.set("status", status.value);
    history.replaceState(null, "", "#" + hash.toString());
  }
}
document.getElementById("gpcdc-job").addEventListener("change", function () { gpcdcFilter(false); });
document.getElementById("gpcdc-status").addEventListener("change", function () { gpcdcFilter(false); });
window.addEventListener("hashchange", function () { gpcdcFilter(true); });
gpcdcFilter(true);
"""
_STATUSES = ("ok", "findings", "failed", "running")
_TRENDS = 6  # figures drawn as a trend per job, at most (the run's duration first)


def index_html(runs: Iterable[Mapping[str, Any]]) -> str:
    """The index page of ``runs`` (each a run.json record, with ``dir`` its directory's
    name): filters by job and status, then each job's runs, newest first, under the
    trends of its figures across them. One file, no network."""
    ordered = sorted(runs, key=_started, reverse=True)
    counts: dict[str, int] = {}
    by_job: dict[str, list[Mapping[str, Any]]] = {}
    for run in ordered:
        counts[str(run.get("status"))] = counts.get(str(run.get("status")), 0) + 1
        by_job.setdefault(str(run.get("job", "")), []).append(run)
    tally = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no runs yet"
    options = "".join(f'<option value="{html.escape(job)}">{html.escape(job)}</option>' for job in sorted(by_job))
    statuses = "".join(f'<option value="{s}">{s}</option>' for s in _STATUSES)
    filters = (f'<div class="filters"><label>job <select id="gpcdc-job"><option value="">all</option>{options}'
               f'</select></label><label>status <select id="gpcdc-status"><option value="">all</option>{statuses}'
               '</select></label><span id="gpcdc-shown" class="verdict"></span></div>')
    sections = "\n".join(_section(job, job_runs) for job, job_runs in by_job.items())
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>gpcdc reports</title>'
            f"<style>{_STYLE}</style></head><body>\n<h1>gpcdc reports</h1>\n"
            f'<p class="sub">{len(ordered)} runs: {html.escape(tally)}</p>\n{filters}\n{sections}\n'
            f"<script>{_FILTER_SCRIPT}</script></body></html>\n")


def _section(job: str, runs: list[Mapping[str, Any]]) -> str:
    """A job's runs (newest first) under the trends of its figures."""
    last = str(runs[0].get("status", ""))
    rows = "\n".join(_row(run) for run in runs)
    return (f'<section data-job="{html.escape(job)}"><h2>{html.escape(job)} <small>{len(runs)} runs, the last '
            f'{html.escape(last)}</small></h2><div class="trends">{_trends(runs)}</div>'
            "<table><thead><tr><th>started (UTC)</th><th>status</th><th>duration</th><th>headline</th>"
            f"<th>parameters</th><th>files</th></tr></thead><tbody>\n{rows}\n</tbody></table></section>")


def _trends(runs: list[Mapping[str, Any]]) -> str:
    """A small line per numeric figure the job's runs report, oldest to newest."""
    series: dict[str, list[float]] = {}
    for run in reversed(runs):
        seconds = run.get("seconds")
        figures = [("duration (s)", seconds), *_pairs(run.get("figures"))]
        for label, value in figures:
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                series.setdefault(str(label), []).append(float(value))
    return "".join(_sparkline(label, values) for label, values in list(series.items())[:_TRENDS] if len(values) > 1)


def _sparkline(label: str, values: list[float], width: int = 150, height: int = 30) -> str:
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    step = width / (len(values) - 1)
    points = " ".join(f"{i * step:.1f},{height - 2 - (v - low) / span * (height - 4):.1f}" for i, v in enumerate(values))
    title = html.escape(f"{label}: " + ", ".join(format_figure(v) for v in values))
    return (f'<div class="trend"><svg width="{width}" height="{height}" role="img"><title>{title}</title>'
            f'<polyline fill="none" stroke="#0969da" stroke-width="1.5" points="{points}"/></svg>'
            f"{html.escape(label)}: <b>{html.escape(format_figure(values[-1]))}</b> "
            f"({html.escape(format_figure(low))} to {html.escape(format_figure(high))})</div>")


_STATUS_COLOURS = {"ok": ("#dafbe1", "#116329"), "findings": ("#fff8c5", "#7d4e00"), "failed": ("#ffebe9", "#a40e26"),
                   "running": ("#ddf4ff", "#0550ae")}


def run_banner(run: Mapping[str, Any]) -> str:
    """The line a report opens with: its job, start, status, duration and parameters, and
    a link back to the index of every run (the report sits one directory below it)."""
    status = str(run.get("status", ""))
    background, colour = _STATUS_COLOURS.get(status, ("#f6f8fa", "#1f2328"))
    seconds = run.get("seconds")
    parameters = run.get("parameters")
    given = ", ".join(f"{k} = {v!r}" for k, v in parameters.items()) if isinstance(parameters, dict) and parameters \
        else "none"
    return ('<div class="gpcdc-run" style="font:0.95em system-ui,sans-serif;color:#57606a;margin:8px 16px">'
            f'<a href="../{INDEX}">&larr; all runs</a> &middot; <b>{html.escape(str(run.get("job", "")))}</b>, started '
            f'{html.escape(str(run.get("started", "")))} UTC &middot; <span style="background:{background};color:{colour};'
            f'font-weight:600;border-radius:4px;padding:1px 8px">{html.escape(status)}</span>'
            + (f" in {seconds:.1f} s" if isinstance(seconds, int | float) else "")
            + f" &middot; parameters: {html.escape(given)}</div>")


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
                     for name, label in (("report.html", "report"), ("notebook.ipynb", "notebook"),
                                         ("kernel.log", "kernel output"))
                     if name in run.get("files", []))
    seconds = run.get("seconds")
    duration = f"{seconds:.1f} s" if isinstance(seconds, int | float) else ""
    parameters = run.get("parameters")
    given = " ".join(f"{k}={v!r}" for k, v in parameters.items()) if isinstance(parameters, dict) else ""
    return (f'<tr data-status="{html.escape(status)}"><td>{html.escape(str(run.get("started", "")))}</td>'
            f'<td><span class="status {html.escape(status)}">{html.escape(status)}</span></td><td>{duration}</td>'
            f'<td>{figures}{verdict}</td><td class="params">{html.escape(given)}</td><td>{links}</td></tr>')


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

