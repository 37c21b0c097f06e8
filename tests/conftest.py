"""Fixtures that start real servers and always stop them.

Every server a test starts lives under one work directory made for the test run; the
session's finalizer stops whatever is still running there (by pid file), even when
tests fail, and removes the directory.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from gpcdc_toolkit._runtime import interrupt_on_sigterm
from gpcdc_toolkit.broker import EmbeddedBroker
from gpcdc_toolkit.cluster import Cluster
from gpcdc_toolkit.ingest import SparkServer
from gpcdc_toolkit.replay._spill import _remove_if_abandoned
from gpcdc_toolkit.sandbox import Sandbox, list_sandboxes

# No per-example deadline: these tests run beside servers, Spark and other suites on a
# busy machine, where one slow example says nothing about the code.
settings.register_profile("gpcdc", deadline=None)
settings.load_profile("gpcdc")

# Fixtures that start servers; a test using any of them is marked `servers`, so that
# `pytest -m "not servers"` runs the pure tests alone, in seconds. (The Spark server's
# suite starts its JVMs itself.)
SERVER_FIXTURES = {"work_dir", "source_sandbox", "source", "broker", "spark", "replay_target"}


def pytest_configure(config: pytest.Config) -> None:
    # A run stopped by SIGTERM (a CI's time limit, `kill`) ends as one stopped by Ctrl-C:
    # the session's finalizers stop every server it started.
    interrupt_on_sigterm()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("spark_server"):
            item.add_marker(pytest.mark.servers)


def _stop_everything(work_dir: Path) -> None:
    for sandbox in list_sandboxes(work_dir):
        try:
            sandbox.down()
        except Exception as e:  # keep stopping the rest
            print(f"could not stop sandbox {sandbox.name}: {e}")
    EmbeddedBroker(work_dir).down()
    # A Spark server of the work directory, or of one a test made inside it (the demo's).
    for directory in [work_dir, *(p for p in work_dir.iterdir() if p.is_dir())]:
        SparkServer(directory).down()
    # Replayers the tests killed left their spill directories: none holds its lock now
    # (a replayer of another run still running does, and keeps its directory).
    for spill in Path(tempfile.gettempdir()).glob("gpcdc-spill+*"):
        _remove_if_abandoned(spill)


@pytest.fixture(scope="session")
def work_dir() -> Iterator[Path]:
    # Not pytest's tmp_path: under root it is mode 0700, which the servers' OS user cannot enter.
    path = Path(tempfile.mkdtemp(prefix="gpcdc-test-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        _stop_everything(path)
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def source_sandbox(work_dir: Path) -> Iterator[Sandbox]:
    sandbox = Sandbox("source", work_dir).up(segments=3)
    try:
        yield sandbox
    finally:
        sandbox.down()


@pytest.fixture(scope="session")
def source(source_sandbox: Sandbox) -> Cluster:
    return source_sandbox.cluster()


@pytest.fixture(scope="session")
def broker(work_dir: Path) -> Iterator[EmbeddedBroker]:
    broker = EmbeddedBroker(work_dir).up()
    try:
        yield broker
    finally:
        broker.down()


@pytest.fixture
def table_name(request: pytest.FixtureRequest) -> str:
    """A table name unique to the test, so tests sharing a sandbox do not collide."""
    name = "".join(c if c.isalnum() else "_" for c in request.node.name).lower()
    digest = hashlib.blake2b(request.node.name.encode(), digest_size=4).hexdigest()
    return f"t_{name[:40]}_{digest}"


@pytest.fixture
def environ_without_gpcdc(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("GPCDC_"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="session")
def spark(work_dir: Path) -> Iterator[object]:
    from gpcdc_toolkit.config import load_config
    from gpcdc_toolkit.ingest.spark import spark_session

    session = spark_session(load_config({"work_dir": str(work_dir), "spark.master": "local[2]"}, environ={}))
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


# The kinds of target a replay writes into, for tests parametrized over them:
# ``@pytest.mark.parametrize("replay_target", TARGETS, indirect=True)``.
TARGETS = ["greenplum", "postgres", pytest.param("citus", marks=pytest.mark.citus)]


@pytest.fixture
def replay_target(request, source, broker, work_dir):
    """A target sandbox and a pipeline of the source to replay into it: (target sandbox,
    config, pipeline, capture group not yet started). All stopped afterwards. The target
    is a 2-segment Greenplum-style sandbox, or (parametrized) a plain PostgreSQL server
    or a Citus coordinator with 2 workers, written at its front door."""
    from gpcdc_toolkit.bootstrap import Pipeline, drop_slots
    from gpcdc_toolkit.capture import CaptureGroup
    from gpcdc_toolkit.config import load_config

    flavour = getattr(request, "param", "greenplum")
    target = Sandbox(f"target-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2, flavour=flavour)
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"r{uuid.uuid4().hex[:8]}", "source.sandbox": "source",
                          "target.sandbox": target.name}, environ={})
    pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
    group = CaptureGroup(config.with_settings({"capture.heartbeat_interval": 0.3}))
    try:
        yield target, config, pipeline, group
    finally:
        group.stop()
        drop_slots(source, pipeline.slot, publication=pipeline.publication)
        target.down(remove=True)


@pytest.fixture(params=["checksum", "spark"])
def compare(request):
    """compare(source, target, table, **options) by one mode or the other."""
    from gpcdc_toolkit.validate._checksum import compare_checksums

    if request.param == "checksum":
        return compare_checksums
    from gpcdc_toolkit.validate._snapshots import Snapshots
    from gpcdc_toolkit.validate._spark import compare_spark

    spark = request.getfixturevalue("spark")

    def by_spark(source, target, table, fetch_rows=None):
        with Snapshots(source) as s, Snapshots(target) as t:
            return compare_spark(spark, s, t, source.table(table), target.table(table))
    return by_spark
