"""The reports' pure parts (no servers): notebook parameters checked against the
parameters cell, secrets refused and redacted, headlines read back from a notebook's
outputs, the index page, and the transaction browser over frames."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpcdc_toolkit.audit import ADVICE, advice
from gpcdc_toolkit.errors import ConfigError
from gpcdc_toolkit.report import (
    NOTEBOOKS,
    Headline,
    TransactionBrowser,
    cell_error,
    check_parameters,
    declared_parameters,
    external_references,
    find_notebook,
    for_report,
    for_schedule,
    has_points,
    index_html,
    read_headline,
    read_runs,
    redact,
    run_banner,
    runs_to_prune,
    sql_names,
    syncpoint_choice,
    to_html,
    update_index,
)

ROOT = Path(__file__).parent.parent
JOBS = ("bootstrap", "capture", "workload", "replay", "audit", "validate", "explore", "investigate")


def notebook_with(source, outputs=()):
    return {"cells": [{"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": source, "outputs": []},
                      {"cell_type": "code", "metadata": {}, "source": "", "outputs": list(outputs)}],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


@pytest.mark.parametrize("job", JOBS)
def test_every_notebook_declares_typed_parameters_and_shows_a_headline(job):
    stored = json.loads(find_notebook(job).read_text())
    declared = declared_parameters(stored)
    assert declared and all(p.types for p in declared.values())
    code = "".join("".join(c["source"]) for c in stored["cells"] if c["cell_type"] == "code")
    assert f'headline("{job}"' in code and "notebook_config(" in code
    # Stored as a scheduler runs them: no outputs, no widget state.
    assert all(not c.get("outputs") for c in stored["cells"] if c["cell_type"] == "code")
    assert "widgets" not in stored["metadata"]


def test_parameters_are_converted_by_their_declared_type():
    declared = declared_parameters(notebook_with(
        'a: int | None = None  # count\nb = 1.5\nc = True\nd = "x"\ne: str | None = None\n'))
    assert declared["a"].help == "count"
    got = check_parameters(declared, {"a": "7", "b": "2", "c": "no", "d": "3", "e": "None"}, "nb")
    assert got == {"a": 7, "b": 2.0, "c": False, "d": "3", "e": None}
    assert check_parameters(declared, {"a": None, "b": 3, "c": True}, "nb") == {"a": None, "b": 3, "c": True}


@pytest.mark.parametrize("given_, message", [
    ({"nope": "1"}, "notebook nb has no parameter 'nope': its parameters: a, b"),
    ({"a": "seven"}, "parameter a takes int or None, not 'seven'"),
    ({"b": "yes"}, "parameter b takes float, not 'yes'"),
    ({"b": True}, "parameter b takes float, not bool True"),
    ({"a": 1.5}, "parameter a takes int or None, not float 1.5"),
])
def test_an_unknown_parameter_or_a_wrong_type_is_one_line_naming_the_fix(given_, message):
    declared = declared_parameters(notebook_with("a: int | None = None\nb = 1.0\n"))
    with pytest.raises(ConfigError) as e:
        check_parameters(declared, given_, "nb")
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_notebook_without_a_parameters_cell_or_with_an_unknown_annotation_is_refused():
    with pytest.raises(ConfigError, match="no cell tagged 'parameters'"):
        declared_parameters({"cells": []})
    with pytest.raises(ConfigError, match="annotates with list"):
        declared_parameters(notebook_with("a: list = []\n"))


def test_an_unknown_notebook_names_the_known_ones():
    with pytest.raises(ConfigError) as e:
        find_notebook("no-such-job")
    assert all(job in str(e.value) for job in JOBS)
    assert find_notebook("audit") == NOTEBOOKS / "audit.ipynb"


password = st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=20)


@given(password, st.sampled_from(["host=db password={} user=u", "postgresql://u:{}@db/x", "password = '{}'"]))
def test_a_parameter_holding_a_password_is_refused(secret, form):
    declared = declared_parameters(notebook_with("ground_truth: str | None = None\n"))
    with pytest.raises(ConfigError, match="holds a password"):
        check_parameters(declared, {"ground_truth": form.format(secret)}, "nb")


@pytest.mark.parametrize("dsn", ["postgresql://u@h/db?password=hunter22", "postgres://:hunter22@h/db",
                                 "postgresql://u@h/db?sslmode=require&password=hunter22", "host=h PASSWORD=x"])
def test_every_dsn_form_with_a_password_is_refused(dsn):
    with pytest.raises(ConfigError, match="holds a password"):
        check_parameters(declared_parameters(notebook_with('path = ""\n')), {"path": dsn}, "nb")


def test_parameters_named_like_secrets_are_refused_and_innocent_ones_pass():
    declared = declared_parameters(notebook_with('sasl_password = ""\npath = ""\nmax_passes = 1\n'
                                                 'tokens_per_batch = 1\nbypass_cache = False\n'))
    with pytest.raises(ConfigError, match="sasl_password holds a password"):
        check_parameters(declared, {"sasl_password": "x"}, "nb")
    innocent = {"path": "postgresql://db/x", "max_passes": 2, "tokens_per_batch": 3, "bypass_cache": True}
    assert check_parameters(declared, innocent, "nb") == innocent


@pytest.mark.parametrize("cell, said", [
    ("timeout = 60 * 5\n", "parameter timeout's default '60 * 5' is not a literal"),
    ("%load_ext foo\nx = 1\n", "the parameters cell is not Python"),
    ("items = [1]\n", "a parameter's default [1] is a list"),
])
def test_a_parameters_cell_the_runner_cannot_read_is_a_one_line_error(cell, said):
    with pytest.raises(ConfigError) as e:
        declared_parameters(notebook_with(cell))
    assert str(e.value).startswith(said) and "\n" not in str(e.value)


def test_a_help_comment_is_what_follows_the_value():
    declared = declared_parameters(notebook_with("x = '#foo'  # the help\ny: int | None = None\n"))
    assert declared["x"].default == "#foo" and declared["x"].help == "the help" and declared["y"].help == ""


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=30),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                                       max_size=4), max_leaves=20)


def strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)


@given(json_values, st.text(min_size=3, max_size=12).filter(lambda s: "*" not in s))
def test_redaction_leaves_no_copy_of_a_secret(value, secret):
    planted = {"a": [value, f"dsn password={secret} x"], f"k{secret}": secret}
    assert not any(secret in text for text in strings(redact(planted, [secret])))


def test_a_report_leaves_out_interactive_cells_and_widget_state_but_not_an_error():
    error = {"output_type": "error", "ename": "RuntimeError", "evalue": "in the widget", "traceback": []}
    notebook = {"cells": [{"cell_type": "code", "metadata": {"tags": ["interactive"]}, "source": "w", "outputs": []},
                          {"cell_type": "markdown", "metadata": {}, "source": "kept"},
                          {"cell_type": "code", "metadata": {"tags": ["interactive"]}, "source": "f", "outputs": [error]}],
                "metadata": {"widgets": {"state": {}}}}
    shown = for_report(notebook)
    assert [c["source"] for c in shown["cells"]] == ["kept", "f"] and "widgets" not in shown["metadata"]
    assert "tags" in notebook["cells"][0]["metadata"]  # the original is untouched
    assert [c["source"] for c in for_schedule(notebook)["cells"]] == ["kept"]  # a scheduled run runs none of them


def test_a_report_inlines_plotly_once_and_the_notebook_keeps_only_each_figures_data():
    import plotly.express as px

    figures = [px.bar(x=["a", "b"], y=[1, 2], title="first").to_plotly_json(),
               px.line(x=[1, 2, 3], y=[3, 1, 2], title="second").to_plotly_json()]
    outputs = [{"output_type": "display_data", "metadata": {}, "data": {"application/vnd.plotly.v1+json": f}}
               for f in json.loads(json.dumps(figures, default=list))]
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                "cells": [{"cell_type": "code", "metadata": {}, "source": "fig.show()", "execution_count": 1,
                           "outputs": outputs, "id": "c1"}]}
    assert len(json.dumps(notebook)) < 50_000  # the figures' data, no plotly.js
    page = to_html(for_report(notebook), "t")
    # Bars and lines: the basic bundle, once, before the figures.
    assert page.count("* plotly.js") == 1 and page.index("* plotly.js (basic") < page.index("Plotly.newPlot(")
    assert page.count("Plotly.newPlot(") == 2 and external_references(page) == []
    assert len(page) < 1_500_000
    assert "text/html" not in notebook["cells"][0]["outputs"][0]["data"]  # the original is untouched
    # A trace type the basic bundle does not draw: the full one.
    outputs[1]["data"]["application/vnd.plotly.v1+json"]["data"][0]["type"] = "scattergl"
    page = to_html(for_report(notebook), "t")
    assert page.count("* plotly.js") == 1 and "* plotly.js v" in page and len(page) > 4_000_000


def test_a_figure_has_points_when_some_trace_has_one():
    import plotly.graph_objects as go

    assert not has_points(go.Figure()) and not has_points(go.Figure([go.Bar(x=[], y=[]), go.Scatter(x=[], y=[])]))
    assert has_points(go.Figure([go.Bar(x=[], y=[]), go.Scatter(x=["a"], y=[0])]))
    assert has_points(go.Figure([go.Pie(values=[1])])) and not has_points(go.Figure([go.Pie(values=[])]))


def test_a_report_opens_with_its_run_and_a_link_back_to_the_index():
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                "cells": [{"cell_type": "markdown", "metadata": {}, "source": "body", "id": "m"}]}
    banner = run_banner({"job": "audit", "started": "2026-01-01 00:00:00", "status": "findings", "seconds": 2.5,
                         "parameters": {"tables": '<b>"x"</b>', "since_last": True}})
    page = to_html(notebook, "t", banner=banner)
    assert page.index('<a href="../index.html">') < page.index("<p>body</p>")
    assert "started 2026-01-01 00:00:00 UTC" in page and ">findings</span> in 2.5 s" in page
    assert "since_last = True" in page and "<b>&quot;x&quot;</b>" not in page and "&lt;b&gt;" in page


def test_external_references_are_what_a_page_would_load():
    page = ('<script src="https://cdn.example/x.js"></script><link href="//cdn.example/y.css">'
            '<a href="https://example.org">a link loads nothing</a><script>var s = "https://x";</script>')
    assert external_references(page) == ["https://cdn.example/x.js", "//cdn.example/y.css"]


@given(st.dictionaries(st.text(min_size=1, max_size=20), st.integers() | st.floats(allow_nan=False) | st.text(max_size=9),
                       max_size=6), st.booleans(), st.text(max_size=40))
def test_a_headline_reads_back_from_the_notebook_in_order(figures, passed, verdict):
    bundle = Headline("audit", figures, passed, verdict).bundle()
    output = {"output_type": "display_data", "data": json.loads(json.dumps(bundle)), "metadata": {}}
    got = read_headline(notebook_with("", [output]))
    assert got is not None and got.passed == passed and got.verdict == verdict
    assert list(got.figures) == list(figures)


def test_no_headline_and_the_first_cell_error():
    error = {"output_type": "error", "ename": "ClusterError", "evalue": "no table x on the coordinator\nmore",
             "traceback": []}
    notebook = notebook_with("", [error])
    assert read_headline(notebook) is None
    assert cell_error(notebook) == "ClusterError: no table x on the coordinator"
    assert cell_error(notebook_with("")) is None


hostile = st.text(alphabet=st.sampled_from(list("<>&\"' ab/script=")), min_size=1, max_size=20)


@given(st.lists(st.tuples(hostile, hostile, st.sampled_from(["ok", "findings", "failed", "running"])), max_size=5))
def test_the_index_lists_every_run_newest_first_and_escapes_what_it_shows(runs):
    records = [{"job": job, "started": f"2026-01-0{i + 1} 00:00:00", "status": status, "seconds": 1.5,
                "figures": [[label, 3]], "verdict": label, "dir": f"{i}", "files": ["report.html"]}
               for i, (job, label, status) in enumerate(runs)]
    page = index_html(records)
    assert page.lower().count("<script") == 1  # the filters' own, nothing from a name
    assert f"{len(runs)} runs" in page
    # Grouped by job (the job of the newest run first), each job's runs newest first.
    listed = [int(d) for d in re.findall(r'href="(\d+)/report.html"', page)]
    assert sorted(listed) == list(range(len(runs)))
    jobs = list(dict.fromkeys(runs[i][0] for i in reversed(range(len(runs)))))
    assert listed == [i for job in jobs for i in reversed(range(len(runs))) if runs[i][0] == job]


def test_the_index_draws_each_jobs_figures_as_trends_and_shows_parameters():
    records = [{"job": "audit", "started": f"2026-01-0{i + 1} 00:00:00", "status": "ok", "seconds": 10.0 + i,
                "figures": [["errors", i % 2], ["verdict text", "no"]], "parameters": {"since_last": True},
                "dir": f"a{i}", "files": []} for i in range(4)]
    page = index_html(records + [{"job": "validate", "started": "2026-01-09 00:00:00", "status": "findings",
                                  "seconds": 3.0, "figures": [["rows differing", 2]], "dir": "v", "files": []}])
    assert page.count("<polyline") == 2  # audit: duration and errors; validate's single run draws none
    assert "<title>errors: 0, 1, 0, 1</title>" in page and "duration (s): <b>13</b> (10 to 13)" in page
    assert page.index('data-job="validate"') < page.index('data-job="audit"')
    assert "since_last=True" in page and 'data-status="findings"' in page


def test_the_index_tolerates_damaged_records(tmp_path):
    page = index_html([{"figures": {"not": "pairs"}, "seconds": "x"}, {}])
    assert "2 runs" in page
    for name, text in [("a", '{"job": "a", "files": null}'), ("b", '{"files": 5}'), ("c", "[" * 100_000),
                       ("d", "not json"), ("e", '{"job": "e", "status": "running", "pid": 999999999}')]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(text)
    update_index(tmp_path)
    runs = {r["dir"]: r for r in read_runs(tmp_path)}
    assert sorted(runs) == ["a", "b", "e"] and runs["a"]["files"] == []
    assert runs["e"]["status"] == "failed" and "killed" in runs["e"]["error"]
    assert (tmp_path / "index.html").is_file()


runs_strategy = st.lists(st.fixed_dictionaries({
    "job": st.sampled_from(["audit", "validate", "replay"]),
    "started_at": st.floats(0, 100 * 86400),
    "status": st.sampled_from(["ok", "findings", "failed", "running"])}), max_size=40)


@given(runs_strategy, st.integers(0, 6), st.sampled_from([0.0, 0.5, 3.0, 30.0]))
def test_a_retention_keeps_each_jobs_last_run_and_removes_only_what_its_limits_name(runs, keep_runs, keep_days):
    now = 100 * 86400
    runs = [{**r, "started": f"{r['started_at']:020.6f}", "dir": str(i)} for i, r in enumerate(runs)]
    pruned = {r["dir"] for r in runs_to_prune(runs, keep_runs=keep_runs, keep_days=keep_days, now=now)}
    for job in {r["job"] for r in runs}:
        mine = sorted((r for r in runs if r["job"] == job), key=lambda r: r["started_at"], reverse=True)
        assert mine[0]["dir"] not in pruned  # a job's last run stays
        for rank, run in enumerate(mine[1:], 1):
            beyond = keep_runs > 0 and rank >= keep_runs
            old = keep_days > 0 and run["started_at"] < now - keep_days * 86400
            assert (run["dir"] in pruned) == ((beyond or old) and run["status"] != "running"), (rank, run)


def test_gpcdc_reports_prune_removes_old_runs_and_rewrites_the_index(tmp_path, environ_without_gpcdc):
    reports = tmp_path / "reports"
    for i in range(5):
        for job in ("audit", "validate"):
            directory = reports / f"{job}-{i}"
            directory.mkdir(parents=True)
            (directory / "run.json").write_text(json.dumps(
                {"job": job, "started": f"2026-11-2{i} 00:00:00", "started_at": 1795000000 + i * 86400,
                 "status": "ok", "files": ["report.html"]}))
            (directory / "report.html").write_text("<html></html>")
    command = [sys.executable, "-m", "gpcdc_toolkit", "--report-dir", str(reports), "reports", "prune"]
    dry = subprocess.run([*command, "--report-keep-runs", "2", "--dry-run"], capture_output=True, text=True,
                         env=environ_without_gpcdc, stdin=subprocess.DEVNULL)
    assert dry.returncode == 0 and "6 runs to remove" in dry.stdout and len(list(reports.iterdir())) == 10
    done = subprocess.run([*command, "--report-keep-runs", "2"], capture_output=True, text=True,
                          env=environ_without_gpcdc, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in reports.iterdir()) == ["audit-3", "audit-4", "index.html", "validate-3", "validate-4"]
    assert "4 runs" in (reports / "index.html").read_text()
    bad = subprocess.run([*command, "--report-keep-runs", "-1"], capture_output=True, text=True,
                         env=environ_without_gpcdc, stdin=subprocess.DEVNULL)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "keep_runs" in bad.stderr


@given(st.lists(st.text(st.characters(blacklist_categories=["Cs", "Cc"]), min_size=1, max_size=12), min_size=1,
                max_size=4))
def test_table_names_split_at_commas_outside_double_quotes(names):
    quoted = ['"' + n.replace('"', '""') + '"' for n in names]
    assert sql_names(" , ".join(quoted)) == quoted


def test_table_names_and_sync_points_refused_in_one_line():
    assert sql_names(None) is None and sql_names("a, s.b") == ["a", "s.b"]
    for bad in ('"open', "a,,b", ""):
        with pytest.raises(ConfigError):
            sql_names(bad)
    assert syncpoint_choice("new") is True and syncpoint_choice("None") is False and syncpoint_choice("42") == 42
    with pytest.raises(ConfigError, match="neither 'new', 'none' nor"):
        syncpoint_choice("-3")


def test_every_documented_audit_rule_says_what_to_do():
    documented = set(re.findall(r"^\| `([a-z_]+)` \| (?:error|warning|info) \|", (ROOT / "docs" / "audit.md").read_text(),
                                re.MULTILINE))
    assert documented and documented <= set(ADVICE)
    assert all(advice(rule) for rule in documented) and "expectation suite" in advice("expect_column_x")


def stream(syncpoint=False):
    """Two distributed transactions (gxid 10 on segments 0 and 1, gxid 11 whose part on
    segment 1 is missing) and a one-phase one (gxid 12), as the ingest frames hold them;
    and (``syncpoint``) a sync point's transaction after them: on every segment, no rows."""
    ts = pd.Timestamp("2026-01-01 12:00:00")
    changes = []

    def part(gxid, segment, offset, rows, table="public.t", one_phase=False, at=ts):
        schema, name = table.split(".")
        changes.append({"kind": "begin", "gxid": gxid, "segment": segment, "xid": gxid * 10 + segment, "partition":
                        segment, "offset": offset, "commit_ts": at, "commit_lsn": 100 + offset, "one_phase": one_phase})
        for seq in range(1, rows + 1):
            changes.append({"kind": "row", "gxid": gxid, "segment": segment, "seq": seq, "table_schema": schema,
                            "table_name": name, "op": "c", "key": f'{{"id":{seq}}}', "partition": segment,
                            "offset": offset + seq, "commit_ts": at, "one_phase": one_phase})
        changes.append({"kind": "end", "gxid": gxid, "segment": segment, "partition": segment,
                        "offset": offset + rows + 1, "commit_ts": at, "event_count": rows})

    part(10, 0, 0, 2)
    part(10, 1, 0, 1)
    part(11, 0, 10, 1, table="sales.orders", at=ts + pd.Timedelta(seconds=5))
    part(12, 1, 10, 3, one_phase=True, at=ts + pd.Timedelta(seconds=9))
    records = pd.DataFrame([{"kind": "commit", "gxid": 10, "segments": [0, 1], "partition": 0, "offset": 0,
                             "commit_ts": ts},
                            {"kind": "pipeline", "gxid": None, "segments": None, "partition": 0, "offset": 1,
                             "commit_ts": None},
                            {"kind": "commit", "gxid": 11, "segments": [0, 1], "partition": 0, "offset": 2,
                             "commit_ts": ts + pd.Timedelta(seconds=5)}])
    if syncpoint:
        part(13, 0, 20, 0, at=ts + pd.Timedelta(seconds=12))
        part(13, 1, 20, 0, at=ts + pd.Timedelta(seconds=12))
        records = pd.concat([records, pd.DataFrame([{"kind": "commit", "gxid": 13, "segments": [0, 1], "partition": 0,
                                                     "offset": 3, "commit_ts": ts + pd.Timedelta(seconds=12)}])],
                            ignore_index=True)
    findings = pd.DataFrame([{"rule": "missing_part", "severity": "error", "gxid": 11}])
    return TransactionBrowser(pd.DataFrame(changes), records, findings)


def test_the_browser_shows_a_transaction_whole_and_where_it_sits():
    view = stream().view(10)
    assert view.position == 1 and view.of == 2 and view.previous is None and view.following == 11
    assert view.parts[["segment", "rows", "declared_rows", "begin_offset", "end_offset"]].values.tolist() == \
        [[0, 2, 2, 0, 3], [1, 1, 1, 0, 2]]
    assert len(view.rows) == 3 and view.findings.empty
    assert "MISSING" not in " ".join(view.lines())


def test_the_browser_names_a_missing_part_and_the_findings_about_it():
    view = stream().view(11)
    assert view.position == 2 and view.previous == 10
    assert "MISSING on [1]" in " ".join(view.lines()) and view.findings["rule"].tolist() == ["missing_part"]
    one_phase = stream().view(12)
    assert one_phase.record is None and one_phase.position is None and one_phase.parts["one_phase"].tolist() == [True]
    assert "<table" in one_phase._repr_html_()


def test_the_browser_lists_transactions_to_search_and_names_their_neighbours():
    browser = stream()
    catalog = browser.catalog()
    assert catalog["gxid"].tolist() == [10, 11, 12]
    assert catalog[["segments", "rows", "findings"]].values.tolist() == [[2, 3, 0], [1, 1, 1], [1, 3, 0]]
    assert catalog["tables"].tolist() == ["public.t", "sales.orders", "public.t"]
    label = browser.label(catalog.iloc[1])
    assert label.startswith("11 · 2026-01-01 12:00:05 · 1 segments · 1 rows · sales.orders") and "1 findings" in label
    assert "in source order after gxid 10 and before nothing in the window" in browser.view(11).lines()
    assert "in source order after nothing in the window and before gxid 11" in browser.view(10).lines()


def test_the_browser_filters_by_time_table_and_finding():
    browser = stream()
    assert browser.gxids() == [10, 11, 12]
    assert browser.gxids(start="2026-01-01 12:00:04") == [11, 12]
    assert browser.gxids(end="2026-01-01 12:00:04") == [10]
    assert browser.gxids(table="sales.orders") == [11]
    assert browser.gxids(rule="missing_part") == [11]
    assert browser.tables == ["public.t", "sales.orders"] and browser.rules == ["missing_part"]
    assert browser.widest() == 11
    assert stream(syncpoint=True).widest() == 11  # the latest wide one that wrote rows, not a sync point


CLASSES = ["jp-Cell", "jp-OutputArea", "dataframe", "jp-Dialog", "lm-Menu", "a_b"]
selector = st.lists(st.sampled_from([*(f".{c}" for c in CLASSES), "div", "table tr", ":root"]), min_size=1, max_size=3)


@given(st.lists(st.lists(selector, min_size=1, max_size=3), max_size=8), st.sets(st.sampled_from(CLASSES)))
def test_a_style_rule_is_kept_when_one_of_its_selectors_can_match(rules, used):
    from gpcdc_toolkit.report._export import used_rules

    css = "\n".join(", ".join(" ".join(s) for s in selectors) + " { color: red; }" for selectors in rules)
    kept = used_rules(css, used)
    expected = [selectors for selectors in rules
                if any({p[1:] for p in s if p.startswith(".")} <= used for s in selectors)]
    assert kept.count("color: red") == len(expected)


def test_style_rules_inside_media_and_parentheses_are_judged_without_dropping_what_can_match():
    from gpcdc_toolkit.report._export import used_rules

    css = """:root { --x: 1px; }
    @media print { .jp-Dialog { display: none; } .jp-Cell { break-inside: avoid; } }
    @media screen { .lm-Menu { color: blue; } }
    .jp-Cell:not(.jp-mod-noOutputs) > .jp-OutputArea { margin: 0; }
    :is(.lm-Menu, .jp-Cell) { color: green; }
    @font-face { font-family: x; src: local(x); }"""
    kept = used_rules(css, {"jp-Cell", "jp-OutputArea"})
    assert "--x" in kept and "break-inside" in kept and "@font-face" in kept
    assert "margin: 0" in kept  # the class under :not() need not be there
    assert ".jp-Dialog { display" not in kept and "@media screen" not in kept
    assert "color: green" in kept  # :is() matches where any of its classes is


def _validation_run(runs, name, *, verified, rows=()):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gpcdc_toolkit.validate._run import _rows_schema

    run = runs / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"verified": verified, "differing": sorted({r["table"] for r in rows})}))
    full = [{**dict.fromkeys(_rows_schema().names), "changed_columns": [], **r} for r in rows]
    pq.write_table(pa.Table.from_pylist(full, schema=_rows_schema()), run / "rows.parquet")
    (run / "fix.sql").write_text("-- node: seg0\nBEGIN;\nDELETE FROM t WHERE id = 9;\nCOMMIT;\n")
    return run


def test_an_investigation_starts_from_the_latest_failed_run_and_groups_rows_by_cause(tmp_path):
    from gpcdc_toolkit.config import load_config
    from gpcdc_toolkit.report import find_run, investigate
    from gpcdc_toolkit.validate._causes import REMEDIES

    config = load_config({"work_dir": str(tmp_path), "kafka.topic_prefix": "p"}, environ={})
    runs = tmp_path / "validate" / "p" / "runs"
    assert find_run(config, "validate") is None and investigate(config).verdict() == "no failed validate run to investigate"
    behind = json.dumps([{"gxid": 7, "segment": 1, "offset": 3, "commit_ts_ms": 1_000, "applied": False}])
    failed = _validation_run(runs, "20261126T000001Z", verified=False, rows=[
        {"table": "public.t", "kind": "changed", "key_text": "id=1", "cause": "not_replayed", "events": behind},
        {"table": "public.t", "kind": "extra", "key_text": "id=9", "cause": "outside_pipeline", "events": "[]"},
        {"table": 'public."U v"', "kind": "missing", "key_text": "id=2", "cause": "not_replayed", "events": behind}])
    _validation_run(runs, "20261126T000002Z", verified=True)  # a later run that passed is not the one
    assert find_run(config, "validate") == failed
    found = investigate(config)
    causes = found.causes()
    assert causes.to_dict("records") == [
        {"cause": "not_replayed", "rows": 2, "tables": 'public."U v", public.t', "what to do": REMEDIES["not_replayed"]},
        {"cause": "outside_pipeline", "rows": 1, "tables": "public.t", "what to do": REMEDIES["outside_pipeline"]}]
    assert found.unexplained == 0 and found.verdict() == "every one of the 3 differing rows is explained: 2 causes"
    assert found.events()[["key_text", "gxid", "applied"]].to_dict("records") == [
        {"key_text": "id=1", "gxid": 7, "applied": False}, {"key_text": "id=2", "gxid": 7, "applied": False}]
    assert "DELETE FROM t WHERE id = 9" in found.fix()
    # A row the record cannot account for, or could not read, is what fails the investigation.
    odd = _validation_run(runs, "20261126T000003Z", verified=False, rows=[
        {"table": "public.t", "kind": "changed", "key_text": "id=3", "cause": "unexplained", "events": "[]"},
        {"table": "public.t", "kind": "changed", "key_text": "id=4", "cause": None, "events": None}])
    found = investigate(config)
    assert found.run == odd and found.unexplained == 2
    assert set(found.causes()["cause"]) == {"unexplained", "not classified"}
    assert investigate(config, run="20261126T000001Z").run == failed
    with pytest.raises(ConfigError, match="is not a validate run .*: give a directory under"):
        investigate(config, run="nosuch")
    with pytest.raises(ConfigError, match="start 'replay' is neither of validate, audit"):
        investigate(config, "replay")


def test_every_cause_says_what_to_do():
    from gpcdc_toolkit.validate._causes import CAUSES, REMEDIES

    assert set(REMEDIES) == {*CAUSES, None} and all(len(text) > 40 for text in REMEDIES.values())


def test_only_an_ipython_kernel_loads_the_toolkits_extension():
    from gpcdc_toolkit.report._runner import kernel_arguments

    for argv in (["/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                 ["python", "/opt/venv/lib/python3.11/site-packages/ipykernel_launcher.py", "-f", "{connection_file}"]):
        assert kernel_arguments(argv) == ["--IPKernelApp.extra_extensions=gpcdc_toolkit._kernel"]
    assert kernel_arguments(["R", "--slave", "-e", "IRkernel::main()", "--args", "{connection_file}"]) == []
    assert kernel_arguments(["xpython", "-f", "{connection_file}"]) == []


EXITING_KERNEL = """
import atexit, gc
from gpcdc_toolkit import _kernel

class Shell:
    def atexit_operations(self):
        print("ipython", gc.get_freeze_count(), flush=True)

shell = Shell()
atexit.register(lambda: print("before ipython", gc.get_freeze_count(), flush=True))
atexit.register(shell.atexit_operations)  # as IPython does, before any extension loads
_kernel.load_ipython_extension(shell)
atexit.register(lambda: print("notebook", gc.get_freeze_count(), flush=True))
"""


def test_the_kernel_extension_freezes_after_the_notebooks_exit_handlers():
    """Exit handlers run last registered first: the notebook's own, then the freeze,
    then those registered as the kernel started (IPython's, ipykernel's)."""
    done = subprocess.run([sys.executable, "-c", EXITING_KERNEL], capture_output=True, text=True, check=True)
    lines = [line.rsplit(" ", 1) for line in done.stdout.splitlines()]
    assert [who for who, _ in lines] == ["notebook", "ipython", "before ipython"], done.stdout
    assert [int(frozen) > 0 for _, frozen in lines] == [False, True, True], done.stdout
