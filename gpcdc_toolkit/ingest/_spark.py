"""Spark helpers the notebooks use: a session, and the toolkit's topics as DataFrames.

Every reader takes ``source``: ``"gpcdc"`` (default), the toolkit's own, which reads
Kafka with confluent-kafka on the executors and needs no jars (a batch read planned in
this process when the DataFrame is made, a stream by its Python data source); or
``"kafka"``, Spark's own Kafka source in the JVM (what a Spark cluster usually has), its
values parsed by the same code. Both give the same DataFrame, over the same window.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .._runtime import read_json, write_json
from ..config import Config
from ..connect import kafka_client_settings
from ..errors import ConfigError
from ..protocol import Topics
from ._classes import class_archive_options
from ._release import release_checkpoints, release_outside_the_collector
from ._server import SparkServer, SparkServerError, SparkServerStatus
from ._sessions import take_slot
from ._settings import SESSION_SETTINGS
from ._spark_kafka import connector_jars, kafka_options, parse_kafka_frame
from ._spark_source import NAME, SPLIT, GpcdcDataSource, plan_start, plan_window, read_window

SOURCES = (NAME, "kafka")
log = logging.getLogger(__name__)


def spark_session(config: Config, app_name: str = "gpcdc", *, kafka_connector: bool = True,
                  jvm_log: Path | None = None) -> Any:
    """A Spark session on ``spark.master``, with the gpcdc source registered and, unless
    ``kafka_connector`` is False, Spark's Kafka connector on its classpath (resolved from
    Maven Central the first time). With ``jvm_log``, the JVM writes its own output there
    instead of this process's stderr (for commands whose terminal shows their lines alone).

    While the work directory's Spark Connect server runs (``gpcdc spark up``), a session
    of it instead (one no other process uses now, ``app_name`` aside): no JVM to start,
    and the connector is on its classpath. A process holds one kind or the other
    (PySpark's rule): one that runs a local session keeps it, and one that connected
    before is refused a local one."""
    from pyspark import SparkContext

    server = SparkServer(config.work_dir)
    status = None if SparkContext._active_spark_context is not None else server.status()
    if status is not None and status.answers and status.url is not None:
        return _remote(server, status)
    if os.environ.get("SPARK_CONNECT_MODE_ENABLED") and not os.environ.get("SPARK_REMOTE"):
        raise SparkServerError(f"this process connected to the Spark server of {config.work_dir}, which no longer "
                               "answers, and PySpark allows it no local session now",
                               fix="start the server again (`gpcdc spark up`), or restart the process (the kernel)")
    if jvm_log is None:
        return _session(config, app_name, kafka_connector)
    jvm_log.parent.mkdir(parents=True, exist_ok=True)
    # The JVM inherits file descriptor 2 when it starts: point it at the log meanwhile.
    sys.stderr.flush()
    saved, output = os.dup(2), os.open(jvm_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(output, 2)
    try:
        spark = _session(config, app_name, kafka_connector)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(output)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@contextmanager
def command_session(config: Config, name: str) -> Iterator[Any]:
    """For a command: the active Spark session (a notebook's, left running), or a new one
    whose JVM writes to ``<work_dir>/logs/<name>.log``, stopped after."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    spark = spark_session(config, name, kafka_connector=False, jvm_log=Path(config.work_dir) / "logs" / f"{name}.log")
    try:
        yield spark
    finally:
        spark.stop()


def _remote(server: SparkServer, status: SparkServerStatus) -> Any:
    """A session of the server no other process uses now, reused from an earlier process
    when one gave it back (``_sessions``); stopping it gives it back, tidied."""
    release_outside_the_collector()
    lease = take_slot(server.path / "sessions", f"{status.pid}:{status.url}",
                      release=lambda stale: _release_session(f"{status.url}/;session_id={stale}"))
    try:
        spark = _connect(f"{status.url}/;session_id={lease.session_id}")
        if spark is None:  # the server closed the slot's session, idle too long
            lease.start_anew()
            spark = _connect(f"{status.url}/;session_id={lease.session_id}")
            assert spark is not None  # a session the server never had cannot be closed
        where = (spark.catalog.currentCatalog(), spark.catalog.currentDatabase())
    except BaseException:
        lease.give_back(tidy=False)
        raise
    stop = spark.stop

    def give_back_then_stop() -> None:
        tidy = False
        try:
            tidy = not lease.given_back and _tidy(spark, where)
        finally:
            try:
                lease.give_back(tidy)
            except OSError as e:  # the slot stays marked in use: a later process releases the session
                log.warning("giving back the Spark server's session slot failed: %s", e)
            finally:
                stop()

    spark.stop = give_back_then_stop  # the library's stop, which would release the session: the slot's instead
    return spark


_SESSION_CLOSED = "INVALID_HANDLE.SESSION_CLOSED"


def _connect(url: str) -> Any:
    """A session at ``url`` (which names its id), with the gpcdc source registered; None
    when the server closed that session. (A session handed from process to process has
    no application name of its own: the server has no UI to show one.)"""
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    spark: Any = SparkSession.builder.remote(url).create()  # no options given: no request yet
    spark.release_session_on_close = False  # kept on the server for the slot's next holder
    try:
        register(spark)  # the first request: where a closed session is refused
    except BaseException as e:
        spark.stop()  # not left as the process's active session
        if isinstance(e, PySparkException) and e.getCondition() == _SESSION_CLOSED:
            return None
        raise
    return spark


def _tidy(spark: Any, where: tuple[str, str]) -> bool:
    """Leave the session as a new one is: whether that worked. (Its temporary functions
    and session variables stay: the toolkit makes none.)"""
    try:
        if not release_checkpoints(spark, timeout=60.0):  # before any interruption: a release may be under way
            return False
        spark.interruptAll()
        for query in spark.streams.active:
            query.stop()
        for view in spark.catalog.listTables():
            if view.isTemporary:
                spark.catalog.dropTempView(view.name)
        spark.sql("RESET")  # each setting back to the server's
        spark.catalog.setCurrentCatalog(where[0])
        spark.catalog.setCurrentDatabase(where[1])
        return True
    except Exception:  # noqa: BLE001 (a session that could not be tidied is released by a later process)
        return False


def _release_session(url: str) -> None:
    """Release a session an earlier process left in use, with what it held (of a session
    closed already, or never made, nothing)."""
    from pyspark.sql import SparkSession

    stale: Any = SparkSession.builder.remote(url).create()
    stale.release_session_on_close = False  # released here, or the error raised: no warning
    try:
        stale.client.release_session()
    finally:
        stale.stop()  # so that it is not the process's active or default session


def _session(config: Config, app_name: str, kafka_connector: bool) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(config.spark.master).appName(app_name).config(map=SESSION_SETTINGS)
    # The JVM's default options, which a user's spark.driver.extraJavaOptions adds to.
    # (A JVM already running in this process is the session's: nothing to start.)
    if config.spark.class_archive and SparkContext._active_spark_context is None and (
            java_options := class_archive_options()):
        builder = builder.config("spark.driver.defaultJavaOptions", java_options)
    if kafka_connector:
        builder = builder.config("spark.jars", ",".join(str(jar) for jar in connector_jars()))
    spark = builder.getOrCreate()
    register(spark)
    return spark


def register(spark: Any) -> None:
    spark.dataSource.register(GpcdcDataSource)


def _options(config: Config, topic: str, **options: Any) -> dict[str, str]:
    kafka = {f"kafka.{k}": v for k, v in kafka_client_settings(config).items()}
    out = {**kafka, "topic": topic}
    for name, value in options.items():
        if value is None:
            continue
        out[name] = json.dumps({str(p): o for p, o in value.items()}) if isinstance(value, dict) else str(value)
    return out


_OPTION_NAMES = {"starting_offsets": "startingOffsets", "ending_offsets": "endingOffsets",
                 "starting_timestamp": "startingTimestamp", "ending_timestamp": "endingTimestamp",
                 "max_offsets_per_trigger": "maxOffsetsPerTrigger"}


def _reader(spark: Any, config: Config, topic: str, source: str, streaming: bool, window: dict[str, Any]) -> Any:
    if source not in SOURCES:
        raise ConfigError(f"unknown source {source!r}", fix=f"use one of {', '.join(SOURCES)}")
    reader = spark.readStream if streaming else spark.read
    if source == NAME:
        options = _options(config, topic, **{_OPTION_NAMES[k]: v for k, v in window.items()})
        return reader.format(NAME).options(**options).load() if streaming else read_window(spark, options)
    # The gpcdc source's planning turns the window into offsets for every partition
    # (defaults, "latest", times, offsets lost to retention refused): both read the same.
    options = _options(config, topic, **{_OPTION_NAMES[k]: v for k, v in window.items()
                                         if k != "max_offsets_per_trigger"})
    servers = kafka_client_settings(config)["bootstrap.servers"]
    if streaming:
        kafka = kafka_options(servers, topic, starting_offsets=plan_start(options),
                              max_offsets_per_trigger=window.get("max_offsets_per_trigger"), max_records_per_partition=SPLIT)
    else:
        start, end = plan_window(options)
        kafka = kafka_options(servers, topic, starting_offsets=start, ending_offsets=end, max_records_per_partition=SPLIT)
    return parse_kafka_frame(reader.format("kafka").options(**kafka).load())


def read_changes(spark: Any, config: Config, *, starting_offsets: Any = None, ending_offsets: Any = None,
                 starting_timestamp: int | None = None, ending_timestamp: int | None = None,
                 source: str = NAME) -> Any:
    """The segments' events (row events, BEGIN/END, watermarks) in an offset or time window."""
    window = dict(starting_offsets=starting_offsets, ending_offsets=ending_offsets,
                  starting_timestamp=starting_timestamp, ending_timestamp=ending_timestamp)
    return _reader(spark, config, Topics(config.kafka.topic_prefix).changes, source, False, window)


def read_coordinator(spark: Any, config: Config, *, source: str = NAME, **window: Any) -> Any:
    """The coordinator's topic whole: commit and DDL records, watermarks, its marker."""
    return _reader(spark, config, Topics(config.kafka.topic_prefix).dtx, source, False, window)


def read_transactions(spark: Any, config: Config, *, source: str = NAME, **window: Any) -> Any:
    """The coordinator's distributed commit records and DDL records."""
    df = read_coordinator(spark, config, source=source, **window)
    return df.where(df.kind.isin("commit", "ddl"))


def read_watermarks(spark: Any, config: Config, *, source: str = NAME, **window: Any) -> Any:
    """Every node's resolved watermarks, the coordinator's included."""
    topics = Topics(config.kafka.topic_prefix)
    parts = [_reader(spark, config, t, source, False, window) for t in (topics.changes, topics.dtx)]
    df = parts[0].unionByName(parts[1])
    return df.where(df.kind == "resolved").select("segment", "resolved_lsn", "resolved_ts", "timestamp", "topic",
                                                  "partition", "offset")


def stream_changes(spark: Any, config: Config, *, starting_offsets: Any = None,
                   max_offsets_per_trigger: int | None = None, source: str = NAME) -> Any:
    """The changes topic as a streaming DataFrame (restartable from a checkpoint)."""
    window = dict(starting_offsets=starting_offsets, max_offsets_per_trigger=max_offsets_per_trigger)
    return _reader(spark, config, Topics(config.kafka.topic_prefix).changes, source, True, window)


class IncrementalRead:
    """Batch reads that each start where the previous committed one ended.

    ``df = run.changes()`` reads from the saved position to the current end;
    ``run.commit()`` saves that end once the DataFrame has been processed. A run that
    fails before ``commit()`` is read again next time.
    """

    def __init__(self, spark: Any, config: Config, name: str) -> None:
        self.spark = spark
        self.config = config
        self.position_file = Path(config.work_dir) / "positions" / f"{name}.json"
        self._end: dict[int, int] | None = None

    def saved_position(self) -> dict[int, int]:
        if not self.position_file.is_file():
            return {}
        return {int(p): o for p, o in read_json(self.position_file).items()}

    def changes(self) -> Any:
        from ._consumer import end_offsets

        topic = Topics(self.config.kafka.topic_prefix).changes
        self._end = end_offsets(kafka_client_settings(self.config), topic)
        start = {p: self.saved_position().get(p, -2) for p in self._end}
        return _reader(self.spark, self.config, topic, NAME, False,
                       dict(starting_offsets=start, ending_offsets=self._end))

    def commit(self) -> None:
        if self._end is None:
            raise RuntimeError("nothing to commit: call changes() first")
        self.position_file.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.position_file, {str(p): o for p, o in self._end.items()})
