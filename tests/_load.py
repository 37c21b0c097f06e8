"""A workload in a background thread that runs until stopped, and waits measured in
its own commits rather than in seconds (a busy machine commits fewer per second)."""

import threading
import time
from dataclasses import replace
from pathlib import Path

from gpcdc_toolkit.cluster import Cluster
from gpcdc_toolkit.workload import WorkloadResult, WorkloadSpec, run_workload


class BackgroundLoad:
    def __init__(self, cluster: Cluster, spec: WorkloadSpec, *, ground_truth: Path | None = None) -> None:
        self._stop = threading.Event()
        self._live: list[WorkloadResult] = []
        self._outcome: list[WorkloadResult | BaseException] = []
        spec = replace(spec, duration=24 * 3600.0, transactions=None)  # until stopped

        def run() -> None:
            try:
                self._outcome.append(run_workload(cluster, spec, ground_truth=ground_truth, stop=self._stop,
                                                  progress=self._live.append))
            except BaseException as e:
                self._outcome.append(e)

        self._thread = threading.Thread(target=run, name="background-load")

    def __enter__(self) -> "BackgroundLoad":
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            self.stop()
        except BaseException:
            if exc_type is None:  # else the error that ended the block is the one to see
                raise

    @property
    def committed(self) -> int:
        return self._live[0].committed if self._live else 0

    def wait_for_commits(self, count: int, timeout: float = 120.0) -> None:
        """Return once ``count`` more transactions have committed than when called."""
        goal = self.committed + count
        deadline = time.monotonic() + timeout
        while self.committed < goal:
            assert self._thread.is_alive(), ("the workload ended", self._outcome)
            assert time.monotonic() < deadline, f"{self.committed} of {goal} commits after {timeout:g} s"
            self._stop.wait(0.05)  # polling the workload's own count

    def stop(self) -> WorkloadResult:
        """Stop the workload and return its result (raise what ended it)."""
        self._stop.set()
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "the workload did not end when told to"
        (outcome,) = self._outcome
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome
