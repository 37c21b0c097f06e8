"""Spark's JVM started from an archive of the classes it loads (class data sharing).

A fresh JVM spends seconds finding, verifying and linking Spark's classes before a
session can run its first job. The JVM can map them instead from an archive that an
earlier JVM of the same Java build and classpath wrote at its exit
(``-XX:ArchiveClassesAtExit``, read back with ``-XX:SharedArchiveFile``). The archive is
recorded once per Java and PySpark installation by a short run in a process of its own:
a local session runs the kinds of job the toolkit's sessions run, and its JVM writes
the archive as it exits. A second run must then start a session from it with sharing
required before it is kept.

The JVM maps the file, and one cut short crashes it. So an archive reaches its place
only by a rename once checked, and its name carries its size: a file whose size is not
its name's is never handed to a JVM. A JVM that cannot use an archive (a classpath
changed since) loads its classes as it would without one, silently.

Archives lie beside the Java libraries (``jars_dir()/spark-classes``), one per Java and
PySpark installation, each with a note of the installation it serves (``<key>.owner``).
Where none can be recorded, sessions start without one, and the reason is kept there
(``<key>.failed``) so that later sessions do not try again. Each recording removes what
no installation can use any more: the files of a Java or a Spark that is gone (a
virtual environment deleted), and those this installation had before it changed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .._maven import jars_dir
from .._runtime import stop_group
from ..errors import GpcdcError

log = logging.getLogger(__name__)

RECORD_TIMEOUT = 300.0  # each of the two runs; together about 35 s on two cores
# Whatever a JVM would say of an archive it cannot use: it then starts as without one.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


class ClassArchiveError(GpcdcError):
    """No archive of Spark's classes could be recorded. ``lasting``: not worth trying
    again (unlike a run that took too long on a busy machine)."""

    def __init__(self, message: str, *, lasting: bool = True, output: str = "") -> None:
        super().__init__(message)
        self.lasting = lasting
        self.output = output  # the failed run's last lines


def class_archive_options() -> str:
    """The JVM options that start Spark's JVM from the archive of its classes, recorded
    first when there is none for this Java and PySpark; '' when none can be had (no
    Java, a failed recording, another process recording it now). They are given as
    ``spark.driver.defaultJavaOptions``, and so begin with the value Spark's
    configuration file gives that setting, which they would replace otherwise."""
    archive = class_archive()
    if archive is None:
        return ""
    ours = f"{launcher_quoted(f'-XX:SharedArchiveFile={archive}')} -Xshare:auto {_QUIET}"
    from pyspark.find_spark_home import _find_spark_home

    try:
        theirs = spark_defaults(_conf_dir(Path(_find_spark_home()))).get("spark.driver.defaultJavaOptions", "")
    except ValueError:  # a file Java cannot read either: Spark's launcher says what is wrong with it
        theirs = ""
    return f"{theirs} {ours}" if theirs else ours


def spark_defaults(conf: Path) -> dict[str, str]:
    """The settings of ``conf/spark-defaults.conf`` as Spark's launcher reads them:
    with ``java.util.Properties`` (bytes that are not UTF-8 replaced), each value trimmed
    as Java trims. {} without the file; ValueError for a malformed ``\\uxxxx``, which
    Java refuses."""
    try:
        with (conf / "spark-defaults.conf").open(encoding="utf-8", errors="replace", newline="") as file:
            text = file.read()
    except (FileNotFoundError, NotADirectoryError):
        return {}
    settings = {}
    for line in _logical_lines(text):
        match = _PROPERTY.fullmatch(line)
        assert match is not None  # every line matches: the key may be empty, the value too
        settings[_unescaped(match["key"])] = _unescaped(match["value"]).strip(_JAVA_TRIMMED)
    return settings


def _logical_lines(text: str) -> Iterator[str]:
    """The lines of a properties file as Java's reader of them gives them (its
    ``LineReader``, followed step by step): blank lines and comments left out, leading
    white space dropped, a line ending in an odd number of backslashes joined to the
    next without them, that next line's leading white space dropped."""
    line: list[str] = []
    skip_blank, joined, escaping = True, False, False
    i, end = 0, len(text)
    while i < end:
        c = text[i]
        i += 1
        if skip_blank:
            if c in _BLANK or (not joined and c in "\r\n"):
                continue
            skip_blank = joined = False
        if not line and c in "#!":  # a comment, even on a line joined to an empty one
            while i < end and text[i] not in "\r\n":
                i += 1
            skip_blank = True
        elif c not in "\r\n":
            line.append(c)
            escaping = c == "\\" and not escaping
        elif not line:
            skip_blank = True
        elif i == end:  # the file's last line ending
            break
        elif escaping:  # the line goes on
            line.pop()
            skip_blank, joined, escaping = True, True, False
            if c == "\r" and text[i] == "\n":
                i += 1
        else:
            yield "".join(line)
            line, skip_blank, escaping = [], True, False
    if line:
        yield "".join(line[:-1] if escaping else line)


_BLANK = " \t\f"  # a properties file's white space
_PROPERTY = re.compile(r"(?P<key>(?:[^\\ \t\f=:]|\\.)*)(?:[ \t\f]*[=:][ \t\f]*|[ \t\f]*)(?P<value>.*)", re.DOTALL)
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_JAVA_TRIMMED = "".join(map(chr, range(0x21)))  # what Java's String.trim() removes


def _unescaped(text: str) -> str:
    """A key's or value's text with its escapes read, as ``Properties.load`` reads them."""
    def escape(match: re.Match[str]) -> str:
        code = match[1]
        if code == "u":
            raise ValueError(f"malformed \\uxxxx escape in {text!r}")
        return chr(int(code[1:], 16)) if code[0] == "u" else _ESCAPES.get(code, code)

    unescaped = re.sub(r"\\(u(?:[0-9a-fA-F]{4})?|.)", escape, text, flags=re.DOTALL)
    # Java's strings are UTF-16: the escapes of a surrogate pair make one character.
    return unescaped.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _conf_dir(spark_home: Path) -> Path:
    """The folder of Spark's configuration, as its launcher finds it."""
    return Path(os.environ.get("SPARK_CONF_DIR") or spark_home / "conf")


def class_archive(*, wait: bool = False) -> Path | None:
    """The archive of Spark's classes for this Java and PySpark, recorded now when
    there is none (about 35 s, once); None when none can be had. Another process
    recording it is waited for only with ``wait``."""
    place = _Place.here()
    if place is None:
        return None
    found = place.archive()
    if found is not None and not place.owner.exists():
        place.note_owner()  # recorded before owners were noted: kept from being pruned as unknown
    if found is not None or place.failed.exists():
        return found
    try:
        place.folder.mkdir(parents=True, exist_ok=True)
        with place.lock(wait) as held:
            if not held:  # another process records it: this session starts without one
                return None
            found = place.archive()
            if found is not None or place.failed.exists():
                return found
            log.warning("recording the classes Spark's JVM loads, so that it starts faster from now on "
                        "(once per Java and PySpark installation)")
            place.prune()
            try:
                return place.record()
            except ClassArchiveError as e:
                if not e.lasting:
                    log.warning("%s; Spark's JVM starts without a class archive this time", e)
                    return None
                place.failed.write_text(f"{e}\n\n{e.output}")
                log.warning("%s; Spark's JVM starts without a class archive (see %s; delete it to try again)",
                            e, place.failed)
                return None
    except OSError as e:  # a folder it cannot write: an archive is a speed-up, never a reason to fail
        log.warning("no archive of Spark's classes in %s (%s); Spark's JVM starts without one", place.folder, e)
        return None


@dataclass(frozen=True)
class _Place:
    """Where the archive of one Java and PySpark installation lies."""

    folder: Path
    key: str  # of the Java build and the classpath Spark's launcher gives the JVM
    java: Path
    spark_home: Path

    @classmethod
    def here(cls) -> _Place | None:
        from pyspark.find_spark_home import _find_spark_home

        java = _java()
        if java is None:
            return None  # Spark's own launcher says what is missing
        identity = hashlib.sha256()
        server = java.parent.parent / "lib" / "server"  # the JVM and the JDK's own archive, which this one extends
        home = Path(_find_spark_home())
        jars = sorted((home / "jars").glob("*.jar"))
        for path in [java, *(p for p in (server / "libjvm.so", server / "classes.jsa") if p.exists()), *jars]:
            stat = path.stat()
            identity.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        # The launcher puts the configuration's folder first on the classpath: what it holds counts.
        conf = _conf_dir(home)
        identity.update(f"{conf}\0{sorted(p.name for p in conf.iterdir()) if conf.is_dir() else None}\n".encode())
        return cls(jars_dir() / "spark-classes", identity.hexdigest()[:16], java, home)

    @property
    def failed(self) -> Path:
        return self.folder / f"{self.key}.failed"

    @property
    def owner(self) -> Path:
        return self.folder / f"{self.key}.owner"

    def note_owner(self) -> None:
        """Notes the installation this key's files serve (an archive is a speed-up: a
        note that cannot be written only leaves it to be recorded again some day)."""
        try:
            self.owner.write_text(json.dumps({"java": str(self.java), "spark_home": str(self.spark_home)}) + "\n")
        except OSError as e:
            log.debug("could not note the owner of %s: %s", self.key, e)

    def prune(self) -> None:
        """Called with the folder's lock held: removes the files of every other key
        whose installation is gone or is this one before it changed, or whose owner is
        not known (a JVM that has one mapped keeps its mapping; one about to start
        from it starts without it)."""
        keys = {path.name.split("-", 1)[0].split(".", 1)[0] for path in self.folder.iterdir()
                if path.suffix in (".jsa", ".failed", ".owner")}
        for key in keys - {self.key}:
            if self._serves_another(key):
                continue
            for path in self.folder.glob(f"{key}[-.]*"):
                if path.suffix in (".jsa", ".failed", ".owner"):
                    path.unlink(missing_ok=True)

    def _serves_another(self, key: str) -> bool:
        """Whether ``key``'s files serve another installation that is still there."""
        try:
            owner = json.loads((self.folder / f"{key}.owner").read_text())
            java, spark_home = Path(owner["java"]), Path(owner["spark_home"])
        except (OSError, ValueError, KeyError, TypeError):
            return False  # unknown: recorded before owners were noted, or its note damaged
        return java.exists() and spark_home.is_dir() and (java, spark_home) != (self.java, self.spark_home)

    def archive(self) -> Path | None:
        """The recorded archive, if its size is still the one its name gives."""
        for path in self.folder.glob(f"{self.key}-*.jsa"):
            size = path.stem.removeprefix(f"{self.key}-")
            try:
                if size.isdigit() and path.stat().st_size == int(size):
                    return path
            except FileNotFoundError:
                continue
        return None

    @contextmanager
    def lock(self, wait: bool) -> Iterator[bool]:
        """Whether this process holds the folder's lock (waited for only with ``wait``)."""
        with (self.folder / ".lock").open("w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True

    def record(self) -> Path:
        """Called with the folder's lock held: any partial archive left there is stale
        (its recording's process was killed)."""
        for stale in self.folder.glob("*.partial"):
            stale.unlink(missing_ok=True)
        partial = self.folder / f"{self.key}.{os.getpid()}.partial"
        self.note_owner()
        try:
            output = _run("record", partial)
            if not partial.is_file():
                raise ClassArchiveError("Spark's JVM exited without writing its class archive", output=output)
            _run("check", partial)
            with partial.open("rb") as written:  # on disk whole before its name says so
                os.fsync(written.fileno())
            archive = self.folder / f"{self.key}-{partial.stat().st_size}.jsa"
            partial.rename(archive)
            folder = os.open(self.folder, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
            return archive
        finally:
            partial.unlink(missing_ok=True)


def _java() -> Path | None:
    """The java Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def launcher_quoted(option: str) -> str:
    """One option as Spark's launcher splits ``extraJavaOptions``: whole, in double quotes."""
    return '"' + option.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _run(step: str, archive: Path) -> str:
    """One run of this module in a process of its own (its own process group, stopped
    whole should it overrun), in the archive's folder (where a crashed JVM writes its
    report); its output's last lines."""
    command = [sys.executable, "-m", __name__, step, str(archive)]
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=archive.parent, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=RECORD_TIMEOUT)
    except subprocess.TimeoutExpired:
        stop_group(proc.pid)
        proc.communicate()
        raise ClassArchiveError(f"the class archive's {step} run took longer than {RECORD_TIMEOUT:g} s",
                                lasting=False) from None
    except BaseException:
        stop_group(proc.pid)
        raise
    lines = [line for line in output.decode(errors="replace").splitlines() if line.strip() and "[Stage " not in line]
    if proc.returncode != 0:
        # The JVM's own words first (a crash, a refused archive), then Python's.
        said = next((line for line in lines if line.startswith(("# A fatal error", "Error occurred during", "[error]"))
                     or "[error]" in line), None)
        said = said or next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else "")
        raise ClassArchiveError(f"the class archive's {step} run exited with status {proc.returncode}: {said.strip()}",
                                output="\n".join(lines[-40:]))
    return "\n".join(lines[-40:])


def _exercise(spark: object) -> None:
    """The kinds of job the toolkit's sessions run: Arrow batches through Python workers,
    pandas in and out, aggregates, windows, joins and sorts."""
    import pandas as pd
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    def identity(batches: Iterator[object]) -> Iterator[object]:
        yield from batches

    frame: object = spark.range(0, 20_000, 1, 2)  # type: ignore[attr-defined]
    rows = frame.mapInArrow(identity, "id long").select(  # type: ignore[attr-defined]
        "id", (F.col("id") % 7).alias("k"), F.concat_ws("-", F.lit("v"), F.col("id").cast("string")).alias("v"),
        F.to_json(F.struct("id")).alias("j"))
    rows.groupBy("k").agg(F.count("*"), F.max("id"), F.collect_set("v")).collect()
    rows.withColumn("previous", F.lag("id").over(Window.partitionBy("k").orderBy("id"))).where("previous IS NULL").count()
    rows.join(rows.select("k").distinct(), "k", "left_anti").count()
    keys = spark.createDataFrame(pd.DataFrame({"k": list(range(7)), "name": [f"n{i}" for i in range(7)]}))  # type: ignore[attr-defined]
    rows.join(F.broadcast(keys), "k").orderBy(F.desc("id")).limit(100).toPandas()
    rows.select(F.from_json("j", "id long").alias("parsed")).where("parsed.id > 5").unionByName(
        rows.select(F.from_json("j", "id long").alias("parsed"))).dropDuplicates().count()


def _main(step: str, archive: str) -> None:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from ._settings import SESSION_SETTINGS

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # ``check`` requires sharing: a JVM that cannot map the archive fails to start.
    options = [f"-XX:ArchiveClassesAtExit={archive}"] if step == "record" else [
        f"-XX:SharedArchiveFile={archive}", "-Xshare:on", "-XX:-CreateCoredumpOnCrash"]
    spark = (SparkSession.builder.master("local[2]").appName(f"gpcdc-classes-{step}").config(map=SESSION_SETTINGS)
             .config("spark.driver.extraJavaOptions", " ".join(map(launcher_quoted, options))).getOrCreate())
    if step == "record":
        _exercise(spark)
    else:
        spark.range(0, 2, 1, 2).count()
    jvm = SparkContext._gateway.proc  # type: ignore[union-attr]
    spark.stop()
    # The JVM exits when its standard input closes, writing the archive as it does.
    jvm.stdin.close()
    if jvm.wait(timeout=RECORD_TIMEOUT) != 0:
        sys.exit(f"Spark's JVM exited with status {jvm.returncode}")


if __name__ == "__main__":
    _main(*sys.argv[1:])
