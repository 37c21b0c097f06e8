"""The notebooks and their reports, against real servers: a person's browser, with no
network, draws a run's charts and shows its headline figures, its findings and its
differences; the notebooks as stored pass nbval; a failing notebook still gives its
HTML and exit status 2; no secret reaches a report. (The demo's run and reports:
``test_demo.py``.)"""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from urllib.parse import quote

import plotly.graph_objects as go
import pytest

from gpcdc_toolkit.audit import ADVICE
from gpcdc_toolkit.bootstrap import Pipeline, drop_slots
from gpcdc_toolkit.capture import CaptureGroup, child_environment, ensure_topics
from gpcdc_toolkit.cluster import Session
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.connect import kafka_client_settings
from gpcdc_toolkit.protocol import Topics
from gpcdc_toolkit.replay import Replayer
from gpcdc_toolkit.report import NOTEBOOKS, external_references, has_points, read_runs, run_notebook
from gpcdc_toolkit.report._export import PLOTLY_MIME
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.workload import reset_tables

from ._audit_stream import StreamBuilder

pytestmark = pytest.mark.reports  # long: `./dev test-reports`, not the default run

JOBS = ["bootstrap", "capture", "workload", "replay", "audit", "validate", "explore"]
CHARTS = {"bootstrap": 1, "capture": 2, "workload": 1, "replay": 3, "audit": 3, "validate": 2, "explore": 2,
          "investigate": 2}
GPCDC = str(Path(sys.executable).parent / "gpcdc")


def browser_command(*arguments):
    """Debian's chromium, headless, with no network: in a network namespace of its own
    when this process may make one, and with every host name unresolvable anyway."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("chromium is not installed: ./dev setup installs it (apt-get install chromium)")
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=15000", *arguments]
    isolated = subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0
    return ["unshare", "-n", *command] if isolated else command


def page_as_shown(path: Path, screenshot: Path, fragment: str = "") -> str:
    address = path.as_uri() + (f"#{fragment}" if fragment else "")
    done = subprocess.run(browser_command("--dump-dom", address), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    shot = subprocess.run(browser_command("--window-size=1280,2000", f"--screenshot={screenshot}", address),
                          capture_output=True, text=True, timeout=120)
    assert shot.returncode == 0 and screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", shot.stderr[-2000:]
    return done.stdout


def visible_text(dom: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)))


def report_as_shown(reports: Path, run: dict, tmp_path: Path) -> tuple[str, int]:
    """A run's report opened offline in Chromium, checked: no external reference, every
    chart drawn with something to show (a figure with no point is an empty state, a
    sentence saying why, never empty axes), its headline figures, verdict and run line
    with the link back. Returns its visible text and how many charts drew."""
    from gpcdc_toolkit.report._headline import format_figure

    job = run["job"]
    page = (reports / run["dir"] / "report.html").read_text()
    assert external_references(page) == [], job
    dom = page_as_shown(reports / run["dir"] / "report.html", tmp_path / f"{run['dir']}.png")
    figures = [output["data"][PLOTLY_MIME] for cell in json.loads((reports / run["dir"] / "notebook.ipynb").read_text())
               ["cells"] for output in cell.get("outputs", []) if PLOTLY_MIME in output.get("data", {})]
    assert all(has_points(go.Figure(f)) for f in figures), f"{job}: a chart with nothing to draw"
    drawn, empty = len(re.findall(r'class="[^"]*\bjs-plotly-plot\b', dom)), dom.count('class="gpcdc-empty"')
    assert drawn == len(figures) and drawn + empty == CHARTS[job], (job, drawn, empty)
    text = visible_text(dom)
    assert all(f"{format_figure(v)} {label}" in text for label, v in run["figures"]), job
    assert run["verdict"] in text
    assert re.search(rf"← all runs · {job} ?, started {run['started']} UTC · {run['status']} in ", text), job
    return text, drawn


def test_reports_with_findings_and_differences_draw_them_and_list_every_check(source, broker, work_dir, tmp_path):
    """The other side of a healthy run: an audit of a stream with a damaged and a missing
    part, and a validation of a target whose table differs from the source's by hand."""
    tag = uuid.uuid4().hex[:6]
    reports = tmp_path / "reports"
    target = Sandbox(f"rt-{tag}", work_dir).up(segments=2)
    table = f'"Diff {tag}"'
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"rf{tag}", "source.sandbox": "source", "target.sandbox": target.name,
                          "report.dir": str(reports)}, environ={})
    try:
        stream = StreamBuilder(config.kafka.topic_prefix)
        stream.record(1, [0, 1], 10, 1000).part(0, 1, 100, 1001).part(1, 1, 100, 1001, count=2)  # damaged
        stream.record(2, [0, 2], 20, 1010).part(0, 2, 110, 1011)  # segment 2's part missing
        for node in (-1, 0, 1, 2):
            stream.watermark(node, 50, 5000)
        ensure_topics(kafka_client_settings(config), Topics(config.kafka.topic_prefix), 3)
        stream.produce(kafka_client_settings(config))
        audit = run_notebook(config, "audit", {"fail_on": "error"})
        for cluster in (source, target.cluster()):
            with Session(cluster) as session:
                session.ddl(f"CREATE TABLE {table} (id int PRIMARY KEY, v text) DISTRIBUTED BY (id)")
                with session.transaction() as tx:
                    tx.insert(("public", f"Diff {tag}"), [{"id": i, "v": f"v{i}"} for i in range(200)])
        with Session(target.cluster()) as session, session.transaction() as tx:  # by hand, on the target
            tx.update(("public", f"Diff {tag}"), {"id": 7}, {"v": "changed"})
            tx.delete(("public", f"Diff {tag}"), {"id": 8})
            tx.insert(("public", f"Diff {tag}"), [{"id": 500, "v": "extra"}])
        validation = run_notebook(config, "validate", {"tables": f"public.{table}", "syncpoint": "none"})
        investigated = run_notebook(config, "investigate", {"start": "audit"})
    finally:
        with Session(source) as session:
            session.ddl(f"DROP TABLE IF EXISTS {table}")
        target.down(remove=True)
    assert (audit.status, validation.status) == ("findings", "findings"), (audit.error, validation.error)
    runs = {run["job"]: run for run in read_runs(reports)}
    text, drawn = report_as_shown(reports, runs["audit"], tmp_path)
    assert drawn == CHARTS["audit"]  # findings over time, watermarks, parts per segment: each with its points
    figures = dict(runs["audit"]["figures"])
    assert (figures["errors"], figures["warnings"]) == (2, 0), figures
    # Every check that ran, those that found nothing too, with its count.
    assert re.search(r"\d+ rules and \d+ expectation suites \(\d+ expectations\) ran: \d+ found something", text)
    for rule in ("damaged_part", "missing_part", "commit_lsn_backwards", "key_order", "silent_node"):
        assert rule in text, rule
    text, drawn = report_as_shown(reports, runs["validate"], tmp_path)
    assert drawn == CHARTS["validate"]  # chunks differing by level, rows by kind
    assert dict(runs["validate"]["figures"])["rows differing"] == 3
    assert "changed" in text and "fix" in text
    # The audit investigated: each rule's findings with what to do about them.
    assert investigated.status == "ok", investigated.error
    text, drawn = report_as_shown(reports, runs["investigate"], tmp_path)
    assert dict(runs["investigate"]["figures"]) == {"findings": 2, "rules": 2, "errors": 2}
    assert drawn == 1 and all(ADVICE[rule][:60] in text for rule in ("damaged_part", "missing_part"))


@pytest.fixture
def fresh_pipeline(source, broker, work_dir):
    """The configuration of a pipeline not yet bootstrapped, of the source with its
    workload tables emptied, and a target of its own; everything stopped after."""
    tag = uuid.uuid4().hex[:6]
    target = Sandbox(f"target-{tag}", work_dir).up(segments=2)
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"nb{tag}", "source.sandbox": "source", "target.sandbox": target.name,
                          "report.dir": str(work_dir / f"reports-{tag}")}, environ={})
    # The workload notebook checks the tables against its ground-truth log: both start empty.
    (work_dir / "workload-ground-truth.jsonl").unlink(missing_ok=True)
    reset_tables(source)
    try:
        yield config
    finally:
        CaptureGroup(config).stop()
        pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
        drop_slots(source, pipeline.slot, publication=pipeline.publication)
        target.down(remove=True)


def test_the_notebooks_as_stored_pass_nbval(fresh_pipeline):
    config = fresh_pipeline
    environment = {**child_environment(config), "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax", "--rootdir",
               str(NOTEBOOKS)]
    notebooks = [str(NOTEBOOKS / f"{job}.ipynb") for job in [*JOBS, "investigate"] if job != "validate"]
    done = subprocess.run([*command, *notebooks], env=environment, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:]
    # As stored, validate cuts a new sync point, which a replayer following the pipeline must reach.
    stop = threading.Event()

    def follow():
        with Replayer(config) as replayer:
            replayer.run(follow=True, should_stop=stop.is_set)

    follower = threading.Thread(target=follow)
    follower.start()
    try:
        done = subprocess.run([*command, str(NOTEBOOKS / "validate.ipynb")], env=environment, capture_output=True,
                              text=True, timeout=900)
    finally:
        stop.set()
        follower.join()
    assert done.returncode == 0, done.stdout[-4000:]


def test_a_failing_notebook_still_gives_its_report_and_exit_status_2(source, work_dir, environ_without_gpcdc):
    reports = work_dir / f"reports-{uuid.uuid4().hex[:6]}"
    config = load_config({"work_dir": str(work_dir), "source.sandbox": "source", "target.sandbox": "source",
                          "report.dir": str(reports)}, environ={})
    done = subprocess.run([GPCDC, "run", "validate", "-p", "tables", "public.no_such_table", "-p", "syncpoint", "none"],
                          env=child_environment(config), capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stdout + done.stderr
    (failed,) = read_runs(reports)
    assert failed["status"] == "failed" and "no table" in failed["error"] and "validate: failed" in done.stdout
    report = (reports / failed["dir"] / "report.html").read_text()
    assert "ClusterError" in report and "no table" in report
    assert 'class="status failed"' in (reports / "index.html").read_text()


def test_no_secret_reaches_an_executed_notebook_its_report_or_the_index(tmp_path, environ_without_gpcdc, monkeypatch,
                                                                        capfd):
    secret = f"S3c@r&t-{uuid.uuid4().hex[:8]}"
    cells = ["import os, sys\nimport pandas as pd\ndsn, pw = os.environ['GPCDC_SOURCE_DSN'], os.environ['PGPASSWORD']",
             "print(dsn)\nprint(pw[:4], end='')\nsys.stdout.flush()\nprint(pw[4:])",
             # What the kernel's children print (a Spark JVM does): in the kernel's log too.
             "import subprocess\nsubprocess.run(['sh', '-c', 'echo from the kernel process: $PGPASSWORD >&2'])",
             "pd.DataFrame({'password': [pw], 'dsn': [dsn]})",
             "from gpcdc_toolkit.report import headline, notebook_config\nnotebook_config()",
             "headline('leaky', {dsn: 1}, verdict=pw)"]
    notebook = tmp_path / "leaky.ipynb"
    notebook.write_text(json.dumps({
        "cells": [{"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": "x = 1", "outputs": [],
                   "execution_count": None, "id": "p"}]
                 + [{"cell_type": "code", "metadata": {}, "execution_count": None, "id": f"c{i}", "outputs": [],
                     "source": source} for i, source in enumerate(cells)],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}))
    config = load_config({"work_dir": str(tmp_path), "source.dsn": f"postgresql://u:{quote(secret, safe='')}@db.invalid/x",
                          "target.sandbox": "t", "report.dir": str(tmp_path / "reports")}, environ={})
    monkeypatch.setenv("PGPASSWORD", secret)
    # Inherited, it would keep ipykernel from capturing its children's output as it does
    # outside pytest (the cell's subprocess then prints to the notebook and the log alike).
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    done = run_notebook(config, notebook, {"x": "2"})
    assert done.status == "ok", done.error
    written = [p for p in (tmp_path / "reports").rglob("*") if p.is_file()]
    assert len(written) >= 4  # the notebook, its report, run.json, the index
    for path in written:
        text = path.read_text()
        for form in (secret, quote(secret, safe=""), secret.replace("&", "&amp;"), secret[4:]):
            assert form not in text, (path, form)
    assert "u:***@db.invalid" in (done.directory / "notebook.ipynb").read_text()
    assert "from the kernel process: ***\n" in (done.directory / "kernel.log").read_text()
    assert "kernel.log" in json.loads((done.directory / "run.json").read_text())["files"]
    assert "from the kernel process" not in capfd.readouterr().err  # in the run's directory, not the terminal


def test_bad_parameters_are_refused_in_one_line_before_any_run(tmp_path, environ_without_gpcdc):
    environment = {**os.environ, "GPCDC_WORK_DIR": str(tmp_path), "GPCDC_REPORT_DIR": str(tmp_path / "r"),
                   "GPCDC_SOURCE_SANDBOX": "s", "GPCDC_TARGET_SANDBOX": "t"}
    for arguments, said in [(["audit", "-p", "since_lats", "true"], "notebook audit has no parameter 'since_lats'"),
                            (["replay", "-p", "batch", "many"], "parameter batch takes int, not 'many'"),
                            (["workload", "-p", "ground_truth", "postgresql://u:pw@h/db"], "holds a password"),
                            (["nosuch"], "no notebook 'nosuch'")]:
        done = subprocess.run([GPCDC, "run", *arguments], env=environment, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and said in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "r").exists()
