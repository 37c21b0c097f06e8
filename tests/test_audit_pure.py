"""The audit's pure parts: severities and summaries, fault injection's bookkeeping,
the command's time parsing (no servers)."""

import argparse
import random
from collections import Counter

import pytest

from gpcdc_toolkit.audit import Thresholds, at_or_above, summary_table
from gpcdc_toolkit.audit._faults import FAULTS, NoPlaceForFault, inject, quiet_thresholds
from gpcdc_toolkit.audit._findings import summarize
from gpcdc_toolkit.cli._audit import _time_ms

from ._audit_stream import StreamBuilder


def test_severities_rank_errors_first_and_unknown_ones_are_refused():
    assert at_or_above("error", "warning") and at_or_above("warning", "warning")
    assert not at_or_above("info", "warning")
    with pytest.raises(ValueError, match="unknown severity 'fatal': use one of error, warning, info"):
        at_or_above("fatal", "error")


def test_the_summary_lists_the_most_severe_first():
    rows = summarize([{"rule": "late_part", "severity": "info", "count": 2},
                      {"rule": "missing_part", "severity": "error", "count": 1},
                      {"rule": "legacy_part", "severity": "warning", "count": 5}])
    assert [r[0] for r in rows] == ["missing_part", "legacy_part", "late_part"]
    assert summary_table(rows).splitlines()[1].split() == ["missing_part", "error", "1"]
    assert summary_table([]) == "no findings"


def stream():
    b = StreamBuilder()
    for gxid in range(1, 9):
        b.record(gxid, [0, 1], 10 * gxid, 1000 + 10 * gxid)
        b.part(0, gxid, 100 * gxid, 1001 + 10 * gxid, rows=[("t", gxid)])
        b.part(1, gxid, 100 * gxid, 1001 + 10 * gxid, rows=[("t", 100 + gxid), ("t", 200 + gxid)])
        b.part(2, 100 + gxid, 100 * gxid, 1002 + 10 * gxid, one_phase=True)
        for node in (-1, 0, 1, 2) if gxid % 3 == 0 else ():
            b.watermark(node, 100 * gxid + 50, 1005 + 10 * gxid)
    for node in (-1, 0, 1, 2):
        b.watermark(node, 10_000, 9000, prepared_ts=9000)
    return b.messages()


@pytest.mark.parametrize("fault", FAULTS)
def test_a_faulty_stream_is_numbered_as_a_broker_would_and_says_what_it_raises(fault):
    messages = stream()
    thresholds = quiet_thresholds(messages)
    try:
        faulty, expected, _ = inject(messages, fault, random.Random(3), thresholds)
    except NoPlaceForFault:
        assert fault in ("conflicting_pair", "ddl_out_of_place")  # no shared keys, no DDL here
        return
    assert expected
    by_partition = Counter((m.topic, m.partition) for m in faulty)
    for (topic, partition), count in by_partition.items():
        assert sorted(m.offset for m in faulty if (m.topic, m.partition) == (topic, partition)) == list(range(count))
    assert faulty != messages


def test_faults_refuse_what_they_do_not_know_and_a_stream_with_no_place():
    with pytest.raises(ValueError, match="unknown fault 'flood'"):
        inject(stream(), "flood", random.Random(0), Thresholds())
    with pytest.raises(NoPlaceForFault, match="no place for fault conflicting_pair"):
        inject(stream(), "conflicting_pair", random.Random(0), Thresholds())


def test_times_are_epoch_milliseconds_or_iso_8601_in_utc_unless_said():
    assert _time_ms("1795320000123") == 1795320000123
    assert _time_ms("2026-11-23T00:00:00") == _time_ms("2026-11-23T00:00:00+00:00") == 1795392000000
    assert _time_ms("2026-11-23T01:00:00+01:00") == 1795392000000
    with pytest.raises(argparse.ArgumentTypeError, match="neither epoch milliseconds nor an ISO 8601 time"):
        _time_ms("yesterday")


@pytest.mark.parametrize("args,message", [
    (["audit", "--since-last", "--from", "1"], "argument --from: not allowed with argument --since-last"),
    (["audit", "--from", "yesterday"], "argument --from: 'yesterday' is neither epoch milliseconds"),
    (["audit", "--fail-on", "fatal"], "argument --fail-on: invalid choice: 'fatal'"),
    (["audti"], "argument COMMAND: invalid choice: 'audti'"),
])
def test_usage_errors_are_one_line_naming_the_help(capsys, args, message):
    from gpcdc_toolkit.cli import main

    with pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("gpcdc: error: ") and message in line and line.endswith("--help)")
