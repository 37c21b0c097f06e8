"""The demo as the README runs it (`gpcdc demo`): it runs every notebook with
parameters into reports/ and leaves nothing running, and a person's browser, with no
network, draws its reports' charts and shows their headline figures. A file of its own,
so that the demo runs once, on one test worker, beside the other report tests."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from gpcdc_toolkit.broker import EmbeddedBroker
from gpcdc_toolkit.capture import CaptureGroup
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.ingest import SparkServer
from gpcdc_toolkit.report import read_runs

from .test_reports import JOBS, page_as_shown, report_as_shown, visible_text

pytestmark = pytest.mark.reports  # long: `./dev test-reports`, not the default run

DEMO_TIMEOUT = 900  # the demo's own limit, below the tests' (pytest-timeout's) limit


@pytest.fixture(scope="module")
def demo(work_dir):
    """`gpcdc demo` as the README runs it, with sandboxes and a broker of its own:
    (its work directory, its reports directory, what it said)."""
    root = work_dir / "demo"
    reports = root / "reports"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GPCDC_")}, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(root), "--report-dir", str(reports),
                             "demo", "--duration", "2", "--segments", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=DEMO_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: the demo stops what it started
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"the demo did not end within {DEMO_TIMEOUT} s. It said:\n{out}{err}\n{where_it_was(root, reports)}")
    assert proc.returncode == 0, out + err
    assert "KeyboardInterrupt" not in err and "Traceback" not in err, err  # a clean run says nothing alarming
    return root, reports, out


def where_it_was(root, reports):
    """What a demo that did not end had done: its runs, and the last lines of its logs."""
    lines = [f"runs: {[(r['job'], r['status'], r.get('seconds')) for r in read_runs(reports)]}"]
    for log in sorted(root.rglob("*.log")):
        with contextlib.suppress(OSError):
            lines += [f"--- {log.relative_to(root)}", *log.read_text(errors="replace").splitlines()[-8:]]
    return "\n".join(lines)


@pytest.mark.timeout(DEMO_TIMEOUT + 300)
def test_the_demo_runs_every_notebook_with_parameters_and_leaves_nothing_running(demo):
    root, reports, said = demo
    for job in JOBS:
        assert f"\n{job}: ok in " in said, said
    assert "7 of 7 runs passed" in said and said.endswith(f"reports: {reports / 'index.html'}\n")
    runs = {run["job"]: run for run in read_runs(reports)}
    assert sorted(runs) == sorted(JOBS) and {r["status"] for r in runs.values()} == {"ok"}
    for run in runs.values():
        # Bounded: plotly.js once per report, never in the stored notebook.
        assert (reports / run["dir"] / "notebook.ipynb").stat().st_size <= 200_000, run["job"]
        assert (reports / run["dir"] / "report.html").stat().st_size <= 1_500_000, run["job"]
        assert run["figures"] and run["seconds"] > 0
    # The figures two reports both show reconcile: the replay applied what the workload
    # committed (after it, nothing else wrote until the replay ran), row for row.
    workload, replay = dict(runs["workload"]["figures"]), dict(runs["replay"]["figures"])
    assert replay["transactions applied"] - replay["of them without rows"] == workload["transactions committed"]
    assert replay["row changes applied"] == workload["row changes"]
    executed = json.loads((reports / runs["workload"]["dir"] / "notebook.ipynb").read_text())
    injected = [c for c in executed["cells"] if "injected-parameters" in c["metadata"].get("tags", [])]
    assert "duration = 2.0" in "".join(injected[0]["source"])
    for name in ("source", "target"):
        assert not list((root / "sandboxes" / name).glob("*/postmaster.pid")), f"the demo left {name} running"
    assert EmbeddedBroker(root).pid is None, "the demo left the broker running"
    assert "\nSpark: sc://127.0.0.1:" in said and SparkServer(root).pid is None, "the demo left its Spark server running"
    warmed = (root / "logs" / "spark-up-warm.log").read_text()  # `gpcdc spark up --warm`, beside the first stages
    assert "Spark Connect server is warm: an audit ran on it" in warmed, warmed[-2000:]
    assert CaptureGroup(load_config({"work_dir": str(root), "source.sandbox": "source"}, environ={})).pid(-1) is None


@pytest.mark.timeout(DEMO_TIMEOUT + 300)
def test_the_reports_draw_offline_with_their_headline_figures(demo, tmp_path):
    from gpcdc_toolkit.report._headline import format_figure

    _root, reports, _said = demo
    runs = {run["job"]: run for run in read_runs(reports)}
    index = visible_text(page_as_shown(reports / "index.html", tmp_path / "index.png"))
    for job, run in runs.items():
        assert job in index and all(format_figure(v) in index for _label, v in run["figures"])
    # The filters, as a person's link to a filtered view: one job's runs, then none.
    audit_only = page_as_shown(reports / "index.html", tmp_path / "audit.png", "job=audit&status=ok")
    shown = re.findall(r'<section data-job="([^"]+)"(?! hidden)', audit_only)
    assert shown == ["audit"] and "1 shown" in visible_text(audit_only)
    nothing = page_as_shown(reports / "index.html", tmp_path / "none.png", "job=audit&status=failed")
    assert re.findall(r'<section data-job="([^"]+)"(?! hidden)', nothing) == [] and "0 shown" in visible_text(nothing)
    for run in runs.values():
        report_as_shown(reports, run, tmp_path)


def test_a_demo_that_stops_early_stops_what_it_started_and_leaves_what_ran_before(work_dir):
    """A source sandbox already running in the work directory is left running; the
    target the demo made afresh, and the Spark server it began, are stopped. (Kafka is
    named at a closed port: the demo stops there, after its servers' start.)"""
    from gpcdc_toolkit.sandbox import Sandbox

    root = work_dir / "demo-early"
    source = Sandbox("source", root).up(segments=1)
    try:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("GPCDC_")}, "PYTHONUNBUFFERED": "1"}
        done = subprocess.run([sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(root),
                               "--kafka-bootstrap-servers", "127.0.0.1:1", "demo", "--segments", "1"],
                              capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=300)
        assert done.returncode != 0 and "no Kafka broker answers at 127.0.0.1:1" in done.stderr, done.stderr
        assert all(pid is not None for _, pid in source.status())
        target = Sandbox("target", root)
        assert target.exists and all(pid is None for _, pid in target.status())
        assert SparkServer(root).pid is None and EmbeddedBroker(root).pid is None
    finally:
        source.down()
