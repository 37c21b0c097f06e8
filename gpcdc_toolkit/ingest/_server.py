"""A Spark Connect server of the work directory: one warm JVM the commands and the
notebooks share, instead of a JVM started (and its code compiled) by each of them.

``gpcdc spark up`` starts it (PySpark's own ``spark-submit``, ``spark.master`` of the
configuration, Spark's Kafka connector on its classpath, its Python workers on this
Python), ``gpcdc spark down`` stops it. While it runs, :func:`spark_session` and
:func:`command_session` (``ingest/_spark.py``) connect to it (``sc://``); otherwise
they start a session of their own, as before. ``spark/spark.json`` keeps its port,
``spark/spark.pid`` which process runs it now, ``spark/tmp/`` its temporary files
(the JVM's temporary directory, and so Spark's local directories unless
``SPARK_LOCAL_DIRS`` names others): a server killed, or stopped as it starts, leaves
them there rather than in ``/tmp``, and the next start or stop removes them.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .._runtime import free_port, port_in_use, read_json, running_pid, stop_group, write_atomic, write_json
from ..errors import GpcdcError
from ._classes import class_archive_options, launcher_quoted
from ._settings import SESSION_SETTINGS

MAIN = "org.apache.spark.sql.connect.service.SparkConnectServer"
# Warnings and errors only (at Spark's default every request of every session is a line),
# and the line that says where it listens.
_LOG4J = f"""rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n
logger.server.name = {MAIN}
logger.server.level = info
"""


class SparkServerError(GpcdcError):
    """The Spark Connect server cannot be started, or is not running."""


@dataclass(frozen=True)
class SparkServerStatus:
    running: bool
    pid: int | None
    url: str | None  # where it listens (or listened)
    answers: bool


class SparkServer:
    """The Spark Connect server of a work directory."""

    def __init__(self, work_dir: str | os.PathLike[str]) -> None:
        self.path = Path(work_dir).absolute() / "spark"
        self._state_file = self.path / "spark.json"
        self._pid_file = self.path / "spark.pid"
        self.log_file = self.path / "logs" / "server.log"
        self.scratch = self.path / "tmp"

    @property
    def pid(self) -> int | None:
        return running_pid(self._pid_file, MAIN, str(self.path))

    @property
    def port(self) -> int | None:
        if not self._state_file.is_file():
            return None
        return int(read_json(self._state_file)["port"])

    @property
    def url(self) -> str | None:
        """``sc://`` where it listens, while it runs and answers; None otherwise."""
        status = self.status()
        return status.url if status.answers else None

    def status(self) -> SparkServerStatus:
        pid, port = self.pid, self.port
        url = f"sc://127.0.0.1:{port}" if port else None
        return SparkServerStatus(pid is not None, pid, url, pid is not None and port is not None and _answers(port))

    def up(self, master: str, *, port: int | None = None, timeout: float = 180.0,
           class_archive: bool = True) -> SparkServer:
        """Start the server unless it runs already; return once it answers. Starts of one
        work directory's server take turns (one starts it, the others find it). With
        ``class_archive``, its JVM starts from the archive of Spark's classes (``_classes``)."""
        self.path.mkdir(parents=True, exist_ok=True)
        with (self.path / "start.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (running := self.pid) is not None:
                if port is not None and port != self.port:
                    raise SparkServerError(f"the Spark Connect server already runs on port {self.port}",
                                           fix="stop it first (`gpcdc spark down`) to move it to another port")
                self._await(running, self.port or 0, timeout)  # it may still be starting
                return self
            if port is not None and port_in_use(port):
                raise SparkServerError(f"port {port} is taken by another process",
                                       fix="choose another --port, or omit it to use a free one")
            port = port or free_port()
            self._await(self._launch(master, port, class_archive_options() if class_archive else ""), port, timeout)
        return self

    def _launch(self, master: str, port: int, java_options: str) -> subprocess.Popen[bytes]:
        from pyspark.find_spark_home import _find_spark_home

        from ._spark_kafka import connector_jars

        write_json(self._state_file, {"port": port, "master": master})
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log_start = self.log_file.stat().st_size if self.log_file.exists() else 0
        logging = self.path / "log4j2.properties"
        logging.write_text(_LOG4J)
        submit = Path(_find_spark_home()) / "bin" / "spark-submit"
        shutil.rmtree(self.scratch, ignore_errors=True)  # a server killed before this one left them
        self.scratch.mkdir(exist_ok=True)
        settings = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
            **SESSION_SETTINGS,
            # Sessions pass from process to process (``_sessions``), and those a process left
            # in use are released by the next. Spark keeps a closed session's Python worker
            # daemons: with its default of an hour, a pipeline audited less often would leave
            # one more set on the server at each audit.
            "spark.connect.session.manager.defaultSessionTimeout": "24h",
            "spark.gpcdc.server": str(self.path),  # so that its command line names this work directory
            # Spark's local directories are the JVM's temporary directory, read as a list
            # split at commas: with a comma in its path, they stay in the system's.
            **({"spark.local.dir": tempfile.gettempdir()} if "," in str(self.scratch) else {}),
            **({"spark.driver.defaultJavaOptions": java_options} if java_options else {}),
        }
        command = [str(submit), "--master", master, "--class", MAIN, "--name", "gpcdc-spark-server",
                   "--driver-java-options", " ".join(map(launcher_quoted, [f"-Dlog4j2.configurationFile=file:{logging}",
                                                                           f"-Djava.io.tmpdir={self.scratch}"])),
                   "--jars", ",".join(str(jar) for jar in connector_jars()),
                   *[a for name, value in settings.items() for a in ("--conf", f"{name}={value}")], "spark-internal"]
        # Its Python workers (mapInArrow, the gpcdc data source) run this Python, as a local session's do.
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        with self.log_file.open("ab") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        try:
            write_atomic(self._pid_file, str(proc.pid))  # spark-submit execs the JVM: the same process
        except BaseException:  # an interrupt, a full disk: a server no pid file names would be left running
            stop_group(proc.pid)
            raise
        return proc

    def _await(self, process: subprocess.Popen[bytes] | int, port: int, timeout: float) -> None:
        """Return once the server (``process``, or the pid of one started before) answers
        on ``port``; stop it and raise if it exits first or does not answer in time."""
        deadline = time.monotonic() + timeout
        pid = process if isinstance(process, int) else process.pid
        while not _answers(port):
            exited = (self.pid is None) if isinstance(process, int) else (process.poll() is not None)
            if exited:
                self._pid_file.unlink(missing_ok=True)
                status = "" if isinstance(process, int) else f" with status {process.returncode}"
                raise SparkServerError(f"the Spark Connect server exited{status}: {self._last_words()}",
                                       fix=f"see {self.log_file}")
            if time.monotonic() > deadline:
                stop_group(pid)
                self._pid_file.unlink(missing_ok=True)
                raise SparkServerError(f"the Spark Connect server did not answer within {timeout:g} s",
                                       fix=f"see {self.log_file}")
            time.sleep(0.1)  # polling the process's port; nothing to wait on instead

    def down(self, timeout: float = 60.0) -> bool:
        """Stop the server; whether it was running. Waits for a start under way."""
        if not self.path.is_dir():
            return False
        with (self.path / "start.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            pid = self.pid
            if pid is not None:
                stop_group(pid, timeout=timeout)  # the JVM, then its Python workers
            self._pid_file.unlink(missing_ok=True)
            shutil.rmtree(self.scratch, ignore_errors=True)
        return pid is not None

    def _last_words(self) -> str:
        try:
            with self.log_file.open("rb") as log:
                log.seek(getattr(self, "_log_start", 0))
                lines = [line for line in log.read().decode(errors="replace").splitlines() if line.strip()]
        except OSError:
            return "no log"
        errors = [line for line in lines if "ERROR" in line or "Exception" in line]
        return (errors or lines or ["no output"])[-1].strip()


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
        return True
    except OSError:
        return False
