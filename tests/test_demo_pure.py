"""The demo's validation while writing, with fakes for the workload and the replayer
(no servers): a thread that does not stop when told to is reported, not waited for."""

import threading

from gpcdc_toolkit import demo
from gpcdc_toolkit.workload import WorkloadSpec


class _FollowingReplayer:
    def __init__(self, config):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def run(self, *, follow, should_stop):
        while not should_stop():
            threading.Event().wait(0.01)  # a follower that polls should_stop


def test_a_workload_that_does_not_stop_is_reported_with_where_it_waits(monkeypatch):
    release = threading.Event()

    def stuck_workload(cluster, spec, *, stop):
        release.wait(30)  # ignores stop: as a statement blocked on a lock would

    monkeypatch.setattr(demo, "run_workload", stuck_workload)
    monkeypatch.setattr(demo, "Replayer", _FollowingReplayer)
    monkeypatch.setattr(demo, "_STOP_TIMEOUT", 0.3)
    said = []
    try:
        assert demo._while_writing(None, None, WorkloadSpec(), lambda: True, said.append) is False
    finally:
        release.set()
    (line,) = said
    assert line.startswith("the workload did not stop within 0.3 s of being told to; it waits at:")
    assert "release.wait(30)" in line


def test_both_stop_when_the_validation_ends(monkeypatch):
    told = []

    def workload(cluster, spec, *, stop):
        told.append(stop.wait(30))

    monkeypatch.setattr(demo, "run_workload", workload)
    monkeypatch.setattr(demo, "Replayer", _FollowingReplayer)
    said = []
    assert demo._while_writing(None, None, WorkloadSpec(), lambda: True, said.append) is True
    assert said == [] and told == [True]
    assert demo._while_writing(None, None, WorkloadSpec(), lambda: False, said.append) is False
