"""The main job on the embedded default, end to end, each stage a notebook run into
``reports/``: a sandbox source (coordinator + 3 segments) and target (coordinator + 2),
the broker and a Spark Connect server, then bootstrap, capture, a workload checked
against its ground truth, replay, validation at a sync point taken while the workload
writes and a replayer follows, the audit of the whole stream, and the stream explored.
``gpcdc demo`` runs it; it returns 0 when every run passed, and prints where
``reports/index.html`` is."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .broker import EmbeddedBroker, check_reachable
from .capture import CaptureGroup, child_environment, drop_pipeline
from .config import Config
from .connect import kafka_client_settings
from .errors import ConfigError
from .ingest import SparkServer, SparkServerError
from .replay import Replayer
from .sandbox import Sandbox
from .workload import WorkloadSpec, reset_tables, run_workload

_STOP_TIMEOUT = 120.0  # seconds the workload and the replayer beside a validation have to stop


@dataclass(frozen=True)
class DemoOptions:
    segments: int = 3
    method: str = "snapshot"  # bootstrap method
    keep: bool = False  # leave the sandboxes, the broker, the Spark server and capture running
    workload: WorkloadSpec = dataclasses.field(default_factory=lambda: WorkloadSpec(hot_keys=10, duration=5.0))


def run_demo(config: Config, options: DemoOptions, *, say: Callable[[str], None] = print) -> int:
    from .report import run_notebook

    if config.source.dsn or config.target.dsn:
        raise ConfigError("the demo runs on sandboxes, but source.dsn or target.dsn is set", fix="unset them")
    spec = options.workload
    started = time.monotonic()
    config = config.with_settings({"capture.heartbeat_interval": 0.5})
    sandbox = Sandbox(config.source.sandbox or "source", config.work_dir)
    target = Sandbox(config.target.sandbox or "target", config.work_dir)
    broker = EmbeddedBroker(config.work_dir)
    spark = SparkServer(config.work_dir)
    group = CaptureGroup(config)
    truth = config.work_dir / "workload-ground-truth.jsonl"  # where the workload notebook appends and checks
    runs = []
    # What runs already in the work directory is left running: the demo stops what it started.
    source_ran = sandbox.exists and any(pid for _, pid in sandbox.status())
    broker_ran, spark_ran = broker.pid is not None, spark.pid is not None

    def job(notebook: str, **parameters: Any) -> bool:
        done = run_notebook(config, notebook, parameters)
        runs.append(done)
        say(done.line())
        return done.status == "ok"

    spark_start: _SparkStart | None = None
    try:
        # One warm JVM for the notebooks' Spark work, instead of one started by each.
        spark_start = _SparkStart(config)
        sandbox.up(segments=options.segments)
        say(f"source sandbox {sandbox.name!r}: coordinator + {options.segments} segments ({sandbox.dsn})")
        if target.exists:
            target.down(remove=True)  # a fresh target, as the pipeline is fresh
        target.up(segments=max(1, options.segments - 1))
        say(f"target sandbox {target.name!r}: coordinator + {max(1, options.segments - 1)} segments ({target.dsn})")
        if not config.kafka.bootstrap_servers:
            broker.up()
        kafka = kafka_client_settings(config)
        check_reachable(kafka)
        say(f"Kafka: {kafka['bootstrap.servers']}")
        cluster = sandbox.cluster()
        cluster.check_logical_decoding()
        # A fresh start, so that the checks compare like with like: transactions before
        # the bootstrap belong to the initial snapshot, those after to the stream.
        drop_pipeline(config, cluster, delete_topics=True)
        reset_tables(cluster)
        truth.unlink(missing_ok=True)
        run_workload(cluster, dataclasses.replace(spec, duration=1.0, transactions=None), ground_truth=truth)
        workload = {"duration": spec.duration or 5.0, "threads": spec.threads, "hot_keys": spec.hot_keys,
                    "seed": spec.seed}
        # Capture is watched for 2 s, not 5: nothing writes before the workload's stage.
        # The validation needs no Spark: it runs while the server finishes its start,
        # and the audit then reads the stream with the validation's writes in it.
        passed = (job("bootstrap", method=options.method) and job("capture", watch_seconds=2.0)
                  and job("workload", **workload)
                  and job("replay") and _while_writing(config, cluster, spec, lambda: job("validate"), say)
                  and spark_start.ready(say) and job("audit") and job("explore"))
        say(f"done in {time.monotonic() - started:.1f} s: {sum(r.status == 'ok' for r in runs)} of {len(runs)} runs passed")
        if runs:
            say(f"reports: {runs[-1].directory.parent / 'index.html'}")
        return 0 if passed else 1
    finally:
        if spark_start is not None:
            spark_start.stop()  # before the server: a start under way is not left to finish
        if not options.keep:
            def pipeline() -> None:  # the capture workers first: they flush to the broker as they stop
                group.stop()
                _all_at_once([*([] if broker_ran else [broker.down]),
                              *([sandbox.down] if sandbox.exists and not source_ran else []),
                              *([target.down] if target.exists else [])])  # the demo's own, made afresh

            _all_at_once([*([] if spark_ran else [spark.down]), pipeline])


class _SparkStart:
    """``gpcdc spark up --warm`` in a process of its own from the demo's first step: the
    server starts, and an audit of its own warms it, while the stages before the audit
    run. (A process of its own, because a Spark Connect session marks its process's
    environment, which the notebooks' kernels, started from the demo's, would inherit.)"""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.log = Path(config.work_dir) / "logs" / "spark-up-warm.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("w") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "gpcdc_toolkit", "spark", "up", "--warm"],
                                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=child_environment(config))

    def ready(self, say: Callable[[str], None]) -> bool:
        """Wait for it; raise what failed it."""
        started = time.monotonic()
        try:
            status = self.process.wait(_STOP_TIMEOUT + 180)
        except subprocess.TimeoutExpired:
            say(f"`gpcdc spark up --warm` did not end within {_STOP_TIMEOUT + 180:g} s; the audit runs beside it")
            return True
        if (waited := time.monotonic() - started) >= 1:
            say(f"waited {waited:.1f} s for the Spark server's start and warm-up")
        if status != 0:
            lines = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
            raise SparkServerError(f"`gpcdc spark up --warm` exited with status {status}: "
                                   f"{lines[-1] if lines else 'no output'}", fix=f"see {self.log}")
        say(f"Spark: {SparkServer(self.config.work_dir).url} ({self.config.spark.master}), warmed by an audit of its "
            "own")
        return True

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _all_at_once(stops: list[Callable[[], object]]) -> None:
    """Run every one of ``stops`` side by side (each waits for its servers to shut
    down); then raise the first that failed."""
    with ThreadPoolExecutor(max_workers=max(1, len(stops))) as pool:
        futures = [pool.submit(stop) for stop in stops]
    for future in futures:
        future.result()


def _while_writing(config: Config, cluster: Any, spec: WorkloadSpec, work: Callable[[], bool],
                   say: Callable[[str], None]) -> bool:
    """``work`` (the validation at a new sync point) while the workload writes to the
    source and a replayer follows the pipeline: whether both it and they succeeded."""
    stop = threading.Event()
    failures: list[BaseException] = []

    def guarded(task: Callable[[], object]) -> None:
        try:
            task()
        except BaseException as e:  # noqa: BLE001 (reported below)
            failures.append(e)

    def follow() -> None:
        with Replayer(config) as replayer:
            replayer.run(follow=True, should_stop=stop.is_set)

    # Daemons, so that one that does not stop cannot keep the demo from ending.
    writer = threading.Thread(target=guarded, name="workload", daemon=True, args=(
        lambda: run_workload(cluster, dataclasses.replace(spec, duration=3.0, transactions=None), stop=stop),))
    follower = threading.Thread(target=guarded, args=(follow,), name="replayer", daemon=True)
    writer.start()
    follower.start()
    try:
        passed = work()
    finally:
        stop.set()
        stuck = [t for t in (writer, follower) if not _joined(t, _STOP_TIMEOUT)]
    for failure in failures:
        say(f"the workload or the replayer failed meanwhile: {failure}")
    for thread in stuck:
        frames = sys._current_frames().get(thread.ident or 0)
        where = "".join(traceback.format_stack(frames)[-3:]).strip() if frames else "(no stack)"
        say(f"the {thread.name} did not stop within {_STOP_TIMEOUT:g} s of being told to; it waits at:\n{where}")
    return passed and not failures and not stuck


def _joined(thread: threading.Thread, timeout: float) -> bool:
    thread.join(timeout)
    return not thread.is_alive()
