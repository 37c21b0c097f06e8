"""A real Prometheus server (Debian's package), started on a free port for a test and
stopped by its process id, whatever the test did."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gpcdc_toolkit._runtime import free_port


def free_ports(count: int, room: int = 1024) -> int:
    """The first of ``count`` consecutive free ports, with ``room`` ports above it (a
    capture metrics port must leave room for 1024 nodes' ports)."""
    for _ in range(100):
        first = free_port(span=count)
        if first + room <= 65535:
            return first
    raise OSError(f"no {count} consecutive free ports with {room} above them after 100 tries")


class PrometheusServer:
    """``jobs``: job name -> its targets (host:port), scraped every second; ``rules``:
    rule files, evaluated every second."""

    def __init__(self, directory: Path, jobs: dict[str, list[str]], rules: list[Path]) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is not installed: ./dev setup installs it (apt-get install prometheus)")
        self.directory = directory
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
                  "rule_files": [str(r) for r in rules],
                  "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}
                                     for job, targets in jobs.items()]}
        (directory / "prometheus.yml").write_text(json.dumps(config))  # YAML reads JSON
        self.command = [binary, f"--config.file={directory / 'prometheus.yml'}",
                        f"--storage.tsdb.path={directory / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
                        "--log.level=warn"]
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrometheusServer:
        log = (self.directory / "prometheus.log").open("ab")
        self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                pytest.fail(f"prometheus did not start: {(self.directory / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.1)  # polling its readiness endpoint
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def _get(self, path: str, **params: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}?{urllib.parse.urlencode(params)}", timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expression: str) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query's samples: their labels (sorted pairs) -> value."""
        return {tuple(sorted(r["metric"].items())): float(r["value"][1])
                for r in self._get("/api/v1/query", query=expression)["result"]}

    def firing(self) -> set[tuple[str, str]]:
        """(alert name, instance) of every alert firing now."""
        return {(a["labels"]["alertname"], a["labels"].get("instance", "")) for a in self._get("/api/v1/alerts")["alerts"]
                if a["state"] == "firing"}

    def wait_for(self, what: str, condition: Any, timeout: float = 60.0) -> Any:
        """Poll ``condition()`` (Prometheus scrapes and evaluates every second) until it
        returns something true; its last value is in the failure."""
        deadline = time.monotonic() + timeout
        while not (value := condition()):
            assert time.monotonic() < deadline, f"{what} within {timeout:g} s; last: {value!r}"
            time.sleep(0.25)  # polling Prometheus, which scrapes on its own clock
        return value
