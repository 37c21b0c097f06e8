"""The ground-truth check of a capture, on hand-made data (no servers)."""

from gpcdc_toolkit.validate import Captured, check_against_truth


def truth(gxid, segments, outcome="committed"):
    return {"gxid": gxid, "segments": segments, "one_phase": len(segments) == 1, "outcome": outcome}


def test_whole_transactions_pass():
    captured = Captured()
    captured.parts.update({10: {0, 1}, 11: {2}})
    captured.records[10] = (0, 1)
    check = check_against_truth(captured, [truth(9, [0, 2]), truth(10, [0, 1]), truth(11, [2])], lambda g: g < 10)
    assert check.ok and (check.after, check.before) == (2, 1)


def test_a_split_transaction_and_a_leak_are_reported():
    captured = Captured()
    captured.parts.update({9: {0}, 10: {0}, 12: {1}})
    captured.records[10] = (0, 1)
    check = check_against_truth(captured, [truth(9, [0, 2]), truth(10, [0, 1]), truth(12, [1], "aborted")],
                                lambda g: g < 10)
    assert not check.ok
    assert any("gxid 10 touched segments [0, 1], captured on [0]" in p for p in check.problems)
    assert any("gxid 9 is before the start point" in p for p in check.problems)
    assert any("gxid 12 was aborted" in p for p in check.problems)


def test_a_missing_commit_record_is_reported():
    captured = Captured()
    captured.parts.update({10: {0, 1}})
    check = check_against_truth(captured, [truth(10, [0, 1])], lambda g: False)
    assert check.problems == ["gxid 10: commit record None, expected [0, 1]"]


def test_a_transaction_in_doubt_is_captured_whole_or_not_at_all():
    captured = Captured()
    captured.parts.update({10: {0, 1}, 11: {0}})
    captured.records.update({10: (0, 1), 11: (0, 1)})
    doubts = [truth(g, [0, 1], "in_doubt") for g in (10, 11, 12)]  # committed, split, absent
    check = check_against_truth(captured, doubts, lambda g: False)
    assert check.in_doubt == 3 and check.after == 2
    assert check.problems == ["gxid 11 touched segments [0, 1], captured on [0]"]


def test_a_pid_file_naming_another_process_is_not_a_worker(tmp_path):
    import os

    from gpcdc_toolkit.capture import CaptureGroup
    from gpcdc_toolkit.config import load_config

    group = CaptureGroup(load_config({"work_dir": str(tmp_path)}, environ={}))
    group.pipeline.directory.mkdir(parents=True)
    group.pid_file(0).write_text(str(os.getpid()))  # alive, but not a capture worker
    assert group.pid(0) is None
