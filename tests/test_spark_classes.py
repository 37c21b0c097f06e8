"""Spark's JVM started from the archive of its classes: recorded once and checked before
it is kept, never handed to a JVM when cut short, and a session that cannot have one
starts without it."""

import fcntl
import json
import pathlib
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpcdc_toolkit.ingest import SparkServer, _classes
from gpcdc_toolkit.ingest._classes import ClassArchiveError, _Place, _run, class_archive, class_archive_options, spark_defaults

# In a process of its own, as a notebook starts it: a session of the toolkit, then
# whether its JVM maps the archive.
_SESSION = textwrap.dedent("""
    import sys
    from pyspark import SparkContext
    from gpcdc_toolkit.config import load_config
    from gpcdc_toolkit.ingest.spark import spark_session
    spark = spark_session(load_config({"work_dir": sys.argv[1], "spark.class_archive": sys.argv[2] == "on"},
                                      environ={}), kafka_connector=False)
    spark.range(0, 2, 1, 2).count()
    with open(f"/proc/{SparkContext._gateway.proc.pid}/maps") as maps:
        print("mapped:" + ",".join(sorted({line.split()[-1] for line in maps if line.rstrip().endswith(".jsa")})))
    spark.stop()
""")


def _failed():
    place = _Place.here()
    return place.failed.read_text() if place.failed.exists() else "no archive and no reason kept"


def _mapped(work_dir, archive_setting):
    done = subprocess.run([sys.executable, "-c", _SESSION, str(work_dir), archive_setting], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("mapped:"))
    return set(filter(None, line.removeprefix("mapped:").split(",")))


def test_a_session_of_the_toolkit_starts_its_jvm_from_the_archive(tmp_path):
    archive = class_archive(wait=True)
    assert archive is not None, _failed()
    assert archive.stat().st_size == int(archive.stem.rsplit("-", 1)[1])
    assert str(archive.resolve()) in _mapped(tmp_path, "on")


@pytest.mark.spark_server  # a fresh session more, in the suite of Spark's own processes
def test_a_session_told_to_go_without_the_archive_does(tmp_path):
    archive = class_archive(wait=True)
    assert archive is not None, _failed()
    assert str(archive.resolve()) not in _mapped(tmp_path, "off")


def test_an_archive_is_handed_on_only_at_the_size_its_name_gives(tmp_path):
    place = _Place(tmp_path, "0123456789abcdef", tmp_path / "java", tmp_path / "spark")
    (tmp_path / f"{place.key}-999.jsa").write_bytes(b"short")  # cut short: never mapped
    (tmp_path / f"{place.key}-x.jsa").write_bytes(b"x")
    (tmp_path / "fedcba9876543210-5.jsa").write_bytes(b"other")  # another installation's
    assert place.archive() is None
    (tmp_path / f"{place.key}-5.jsa").write_bytes(b"whole")
    assert place.archive() == tmp_path / f"{place.key}-5.jsa"


def test_a_recording_removes_what_no_installation_can_use_and_keeps_the_others(tmp_path):
    folder = tmp_path / "spark-classes"
    folder.mkdir()

    def installation(name):
        (tmp_path / name / "bin").mkdir(parents=True)
        (tmp_path / name / "bin" / "java").write_text("")
        (tmp_path / name / "spark").mkdir()
        return tmp_path / name / "bin" / "java", tmp_path / name / "spark"

    def recorded(key, owner, *, failed=False):
        (folder / (f"{key}.failed" if failed else f"{key}-3.jsa")).write_bytes(b"jsa")
        if owner is not None:
            (folder / f"{key}.owner").write_text(owner if isinstance(owner, str) else json.dumps(
                {"java": str(owner[0]), "spark_home": str(owner[1])}))
        return key

    ours, other = installation("ours"), installation("other")
    gone = installation("gone")
    kept = {recorded("a" * 16, other), recorded("b" * 16, other, failed=True)}
    removed = {recorded("c" * 16, gone), recorded("d" * 16, ours), recorded("e" * 16, None),
               recorded("f" * 16, '{"java": '), recorded("1" * 16, '{"java": 1}'), recorded("2" * 16, (ours[0], gone[1]))}
    shutil.rmtree(tmp_path / "gone")  # a virtual environment deleted
    place = _Place(folder, "0" * 16, *ours)
    recorded(place.key, ours)
    (folder / ".lock").write_text("")
    place.prune()
    left = {path.name for path in folder.iterdir()}
    assert {name.split("-")[0].split(".")[0] for name in left} == kept | {place.key, ""}, left
    assert not any(name.startswith(tuple(removed)) for name in left)
    assert place.archive() == folder / f"{place.key}-3.jsa"


def test_an_archive_recorded_before_owners_were_noted_gets_its_owner_when_used(tmp_path, monkeypatch):
    monkeypatch.setenv("GPCDC_JARS_DIR", str(tmp_path))
    place = _Place.here()
    place.folder.mkdir(parents=True)
    (place.folder / f"{place.key}-5.jsa").write_bytes(b"whole")
    assert class_archive() == place.folder / f"{place.key}-5.jsa"
    assert json.loads(place.owner.read_text()) == {"java": str(place.java), "spark_home": str(place.spark_home)}


def test_the_check_refuses_an_archive_cut_short_which_would_crash_a_jvm(tmp_path):
    archive = class_archive(wait=True)
    assert archive is not None, _failed()
    _run("check", archive)  # the whole one passes
    cut = tmp_path / "cut.partial"
    with archive.open("rb") as whole:
        cut.write_bytes(whole.read(1 << 20))
    reports = set(pathlib.Path.cwd().glob("hs_err_pid*.log"))
    with pytest.raises(ClassArchiveError, match="the class archive's check run exited with status") as refused:
        _run("check", cut)
    # The JVM's own words: it crashed on the cut file, or refused it.
    assert "# A fatal error" in refused.value.output or "shared archive" in refused.value.output, refused.value.output
    assert set(pathlib.Path.cwd().glob("hs_err_pid*.log")) == reports  # a crash's report goes beside the archive


def test_a_recording_under_way_elsewhere_is_not_waited_for_by_a_session(tmp_path, monkeypatch):
    monkeypatch.setenv("GPCDC_JARS_DIR", str(tmp_path))
    place = _Place.here()
    place.folder.mkdir(parents=True)
    with (place.folder / ".lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a process recording it holds it
        assert class_archive_options() == ""
    assert list(place.folder.iterdir()) == [place.folder / ".lock"]  # nothing recorded, nothing marked failed


def test_a_failed_recording_is_said_once_kept_and_not_tried_again(tmp_path, monkeypatch, caplog):
    """A Java whose every run fails: sessions would fail too, but the archive's
    recording must leave nothing behind but its reason."""
    runs = tmp_path / "runs"
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\necho run >> {runs}\necho 'Error: no VM here' >&2\nexit 3\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("GPCDC_JARS_DIR", str(tmp_path / "jars"))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert class_archive_options() == ""
    place = _Place.here()
    reason = place.failed.read_text()
    assert reason.startswith("the class archive's record run exited with status 1: ") and runs.exists()
    assert "Error: no VM here" in reason  # the run's own output kept
    assert f"(see {place.failed}; delete it to try again)" in caplog.text
    tried = runs.read_text()
    assert class_archive_options() == "" and runs.read_text() == tried, "tried again"
    assert [r.getMessage() for r in caplog.records].count(caplog.records[-1].getMessage()) == 1  # said once
    assert sorted(p.name for p in place.folder.iterdir()) == [".lock", place.failed.name, place.owner.name]


@pytest.mark.spark_server
def test_an_archive_is_recorded_from_nothing_and_a_session_starts_from_it(tmp_path, monkeypatch):
    monkeypatch.setenv("GPCDC_JARS_DIR", str(tmp_path / "jars"))
    try:
        archive = class_archive()
        assert archive is not None and archive.parent == tmp_path / "jars" / "spark-classes"
        # No partial left; the installation it serves noted.
        assert sorted(p.name for p in archive.parent.iterdir()) == [".lock", archive.name, f"{archive.name.split('-')[0]}.owner"]
        assert class_archive() == archive  # recorded once
        assert str(archive.resolve()) in _mapped(tmp_path, "on")
    finally:
        shutil.rmtree(tmp_path / "jars", ignore_errors=True)  # 150 MB or more


def test_a_folder_it_cannot_write_leaves_sessions_as_they_were(tmp_path, monkeypatch, caplog):
    (tmp_path / "a file").write_text("not a folder")
    monkeypatch.setenv("GPCDC_JARS_DIR", str(tmp_path / "a file"))
    assert class_archive_options() == ""
    assert "Spark's JVM starts without one" in caplog.text


@pytest.mark.spark_server
def test_the_spark_servers_jvm_starts_from_the_archive(tmp_path):
    archive = class_archive(wait=True)
    assert archive is not None, _failed()
    server = SparkServer(tmp_path / "work")
    try:
        pid = server.up("local[1]").pid
        with open(f"/proc/{pid}/maps") as maps:
            assert str(archive.resolve()) in {line.split()[-1] for line in maps if line.rstrip().endswith(".jsa")}
    finally:
        server.down()


# Pieces of a properties file, those that mean something to its reader among them:
# separators, escapes (a malformed one too), continuations, comment marks, each line
# ending, what Java's trim removes and what it keeps. (No surrogates: py4j hands a
# lone one over as "?".)
_PIECES = ["a", "b", "=", ":", " ", "\t", "\f", "\\", "#", "!", "\n", "\r", "\r\n", "é", "t", "n", "\x01", "\u00a0",
           "\\u00e9", "\\u0041", "\\u12"]
_JAVA_TRIMMED = "".join(map(chr, range(0x21)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.lists(st.sampled_from(_PIECES), max_size=40).map("".join))
def test_spark_defaults_are_read_as_javas_properties_reader_reads_them(spark, tmp_path, text):
    """Spark's launcher loads ``spark-defaults.conf`` with java.util.Properties and trims
    each value."""
    from pyspark.errors import IllegalArgumentException

    (tmp_path / "spark-defaults.conf").write_bytes(text.encode())
    jvm = spark.sparkContext._jvm
    properties = jvm.java.util.Properties()
    try:
        properties.load(jvm.java.io.StringReader(text))
    except IllegalArgumentException as e:  # Java's, as PySpark raises it
        assert "Malformed \\uxxxx encoding" in str(e)
        with pytest.raises(ValueError, match="malformed"):
            spark_defaults(tmp_path)
        return
    javas = {name: properties.getProperty(name).strip(_JAVA_TRIMMED) for name in properties.stringPropertyNames()}
    assert spark_defaults(tmp_path) == javas


def test_the_archives_options_follow_the_users_default_java_options(tmp_path, monkeypatch):
    """They are given as spark.driver.defaultJavaOptions: the value Spark's configuration
    file gives it is kept, before them."""
    monkeypatch.setattr(_classes, "class_archive", lambda: tmp_path / "spark-classes-1.jsa")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    ours = class_archive_options()
    assert ours.startswith(f'"-XX:SharedArchiveFile={tmp_path}/spark-classes-1.jsa" -Xshare:auto')
    (tmp_path / "spark-defaults.conf").write_text("# the site's\nspark.driver.defaultJavaOptions  -Dsite.mine=1 \\\n"
                                                  "    -Dsite.face=\\ud83d\\ude00 -Xss4m\nspark.driver.memory 2g\n")
    assert class_archive_options() == f"-Dsite.mine=1 -Dsite.face=\U0001f600 -Xss4m {ours}"
    (tmp_path / "spark-defaults.conf").write_text("spark.driver.defaultJavaOptions -Dsite.mine=\\u12\n")
    assert class_archive_options() == ours  # Java refuses the file: Spark's launcher says why
