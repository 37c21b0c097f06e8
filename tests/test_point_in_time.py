"""Targets as of a sync point: an archive's runs checked whole (pure), the stop time
rounded down to a sync point (pure), then on real servers: a source written while
three sync points are cut and recorded, the topics archived run by run, and a target
rebuilt from the archive alone (Kafka unreachable) to each sync point in turn, each
proven equal to the source as it was then; an archive missing a run refused."""

import random
import shutil
import threading
import uuid
from datetime import datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpcdc_toolkit.archive import ArchiveError, check_continuous
from gpcdc_toolkit.archive._layout import RunBounds
from gpcdc_toolkit.errors import ConfigError
from gpcdc_toolkit.replay._until import parse_time, syncpoint_before

from .test_cli import gpcdc


def _chain(ends):
    """Runs 1..n, each starting where the one before it ended."""
    runs, previous = [], {"t.changes": {0: 0, 1: 0}, "t.dtx": {0: 0}}
    for number, end in enumerate(ends, start=1):
        runs.append(RunBounds(number, previous, end))
        previous = end
    return runs


@st.composite
def chains(draw):
    n = draw(st.integers(2, 8))
    ends, at = [], {"t.changes": {0: 0, 1: 0}, "t.dtx": {0: 0}}
    for _ in range(n):
        at = {t: {p: o + draw(st.integers(0, 50)) for p, o in parts.items()} for t, parts in at.items()}
        ends.append(at)
    return _chain(ends)


@given(chains(), st.data())
def test_an_archive_is_whole_only_when_its_runs_chain(runs, data):
    check_continuous("a", runs)
    missing = data.draw(st.integers(0, len(runs) - 2))  # any run but the last: the last one only shortens it
    without = runs[:missing] + runs[missing + 1:]
    with pytest.raises(ArchiveError, match="has a gap: run-0000"):
        check_continuous("a", without)
    # Renumbered to hide the hole, the chain still shows it where messages were skipped
    # (without the first run, the replay finds the partitions starting past their marker).
    renumbered = [RunBounds(i, r.start, r.end) for i, r in enumerate(without, start=1)]
    skipped = missing > 0 and runs[missing].end != runs[missing].start
    if skipped:
        with pytest.raises(ArchiveError, match="has a gap: run-.* starts .* partition .* ended it at offset"):
            check_continuous("a", renumbered)
    else:
        check_continuous("a", renumbered)  # the run held nothing: nothing is lost


def test_runs_written_before_their_start_was_kept_chain_by_number():
    runs = [RunBounds(1, None, {"t": {0: 5}}), RunBounds(2, None, {"t": {0: 9}})]
    check_continuous("a", runs)
    with pytest.raises(ArchiveError, match="run-000002 is missing before run-000003"):
        check_continuous("a", [runs[0], RunBounds(3, None, {"t": {0: 9}})])
    with pytest.raises(ArchiveError, match="holds no archive runs"):
        check_continuous("a", [])


def test_a_time_is_rounded_down_to_the_last_sync_point_committed_by_then():
    points = [(10, 1_000), (12, 2_000), (15, 3_000)]
    assert syncpoint_before(points, 2_999) == (12, 2_000)
    assert syncpoint_before(points, 3_000) == (15, 3_000)
    with pytest.raises(ConfigError, match="no sync point was committed at or before .*; the first is 10"):
        syncpoint_before(points, 999)
    with pytest.raises(ConfigError, match="the stream holds none"):
        syncpoint_before([], 999)
    assert parse_time("1970-01-01T00:00:01Z") == parse_time("1970-01-01 00:00:01") == 1000
    assert parse_time("1970-01-01T01:00:01+01:00") == 1000
    with pytest.raises(ConfigError, match="is not a time"):
        parse_time("yesterday")


TABLE = '"PIT Orders"'


def _writer(source, seed, stop, done):
    """Inserts, updates and deletes, one- and two-phase, until stopped."""
    from gpcdc_toolkit.cluster import Session

    rng = random.Random(seed)
    with Session(source) as session:
        while not stop.is_set():
            with session.transaction() as tx:
                keys = sorted(rng.sample(range(40), rng.choice((1, 2, 3))))
                for key in keys:
                    tx.update(TABLE, {"id": key}, {"n": rng.randint(0, 10**9), "note": f"w{seed} 'quoted' \\ end"})
                fresh = 1000 + seed * 100_000 + done[seed]
                tx.insert(TABLE, [{"id": fresh, "n": -1, "note": "BEGIN"}])
                if done[seed] % 3 == 0:
                    tx.delete(TABLE, {"id": fresh})
            done[seed] += 1


@pytest.mark.changes
def test_a_target_rebuilt_from_the_archive_equals_the_source_at_each_of_three_sync_points(
        source, replay_target, work_dir):
    from gpcdc_toolkit.archive import ArchivedStream, write_archive
    from gpcdc_toolkit.bootstrap import bootstrap
    from gpcdc_toolkit.capture import wait_until_acknowledged
    from gpcdc_toolkit.cluster import Session
    from gpcdc_toolkit.protocol import Topics

    target_box, config, pipeline, group = replay_target
    prefix = config.kafka.topic_prefix
    with Session(source) as session:
        session.ddl(f"DROP TABLE IF EXISTS {TABLE}")
        session.ddl(f"CREATE TABLE {TABLE} (id int PRIMARY KEY, n bigint, note text) DISTRIBUTED BY (id)")
        with session.transaction() as tx:
            tx.insert(TABLE, [{"id": i, "n": 0, "note": "snapshot"} for i in range(40)])
    bootstrap(source, pipeline, "snapshot")
    group.start()
    archive = work_dir / f"archive-{uuid.uuid4().hex[:6]}"
    source_flags = ["--source-sandbox", "source", "--kafka-bootstrap-servers", config.kafka.bootstrap_servers,
                    "--kafka-topic-prefix", prefix]
    stop, done, failures = threading.Event(), {1: 0, 2: 0}, []

    def guarded(seed):
        try:
            _writer(source, seed, stop, done)
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            failures.append(e)

    writers = [threading.Thread(target=guarded, args=(seed,)) for seed in done]
    for t in writers:
        t.start()
    points = []
    try:
        for _ in range(3):
            before = dict(done)
            while any(done[s] < before[s] + 20 for s in done) and not failures:  # the source moves on between them
                stop.wait(0.05)
            taken = gpcdc(work_dir, *source_flags, "syncpoint")
            assert taken.returncode == 0, taken.stderr
            points.append(int(taken.stdout.split()[2].rstrip(":")))
            assert "tables digested as of the cut" in taken.stdout, taken.stdout
            write_archive(config, archive)  # a run per sync point, as a schedule would
    finally:
        stop.set()
        for t in writers:
            t.join(60)
    assert not failures, failures
    wait_until_acknowledged(source, pipeline.slot)
    write_archive(config, archive)
    runs = sorted(p.name for p in archive.glob("run-*"))
    assert runs == [f"run-{n:06d}" for n in range(1, 5)]
    assert [g for g, _ in ArchivedStream(archive, Topics(prefix)).syncpoints()] == points
    assert sorted(p.stem for p in (archive / "capture" / prefix / "syncpoints").glob("*.json")) == sorted(map(str, points))

    # The source has moved on since; Kafka is out of reach: only the archive is read.
    offline = ["--target-sandbox", target_box.name, "--kafka-bootstrap-servers", "127.0.0.1:9",
               "--kafka-topic-prefix", prefix]
    listed = gpcdc(work_dir, *offline, "replay", "--archive", str(archive), "--list-syncpoints")
    assert listed.returncode == 0, listed.stderr
    assert [int(line.split()[0]) for line in listed.stdout.splitlines()[:-1]] == points
    assert all(line.endswith(" recorded") for line in listed.stdout.splitlines()[:-1])
    commit_times = {int(line.split()[0]): line.split()[1] for line in listed.stdout.splitlines()[:-1]}

    def check(gxid):
        return gpcdc(work_dir, *offline, "validate", "--against-syncpoint", str(gxid), "--archive", str(archive))

    for i, gxid in enumerate(points):
        if i < 2:
            rebuilt = gpcdc(work_dir, *offline, "replay", "--archive", str(archive), "--until-syncpoint", str(gxid))
        else:  # a moment after the last sync point's commit: rounded down to it
            a_second_later = datetime.fromisoformat(commit_times[gxid]) + timedelta(seconds=1)
            rebuilt = gpcdc(work_dir, *offline, "replay", "--archive", str(archive), "--until",
                            a_second_later.isoformat())
            assert f"rounded down to sync point {gxid}, committed at {commit_times[gxid]}" in rebuilt.stdout
        assert rebuilt.returncode == 0, rebuilt.stderr
        assert f"stopped at sync point {gxid}" in rebuilt.stdout, rebuilt.stdout
        proven = check(gxid)
        assert proven.returncode == 0, proven.stdout + proven.stderr
        assert f"target equals the source as of sync point {gxid}" in proven.stdout
        assert f"public.{TABLE}: " in proven.stdout and "equal to the source at the sync point" in proven.stdout
        if i < 2:  # ... and not as of the next one, which the writers had moved on to
            later = check(points[i + 1])
            assert later.returncode == 1, later.stdout + later.stderr
            assert f"public.{TABLE}: " in later.stdout and "differ from the source as of sync point" in later.stdout

    # A target past a sync point cannot be taken back to it.
    back = gpcdc(work_dir, *offline, "replay", "--archive", str(archive), "--until-syncpoint", str(points[0]))
    assert back.returncode != 0 and len(back.stderr.splitlines()) == 1, back.stderr
    assert f"has applied sync point {points[0]} already" in back.stderr
    # An archive missing a run is refused, in one line, before anything is applied.
    gapped = work_dir / f"gapped-{uuid.uuid4().hex[:6]}"
    shutil.copytree(archive, gapped)
    shutil.rmtree(gapped / "run-000002")
    refused = gpcdc(work_dir, *offline, "replay", "--archive", str(gapped), "--until-syncpoint", str(points[2]))
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "has a gap: run-000002 is missing before run-000003" in refused.stderr
    # A sync point the archive does not hold: refused before anything is applied.
    missing = gpcdc(work_dir, *offline, "replay", "--archive", str(archive), "--until-syncpoint", str(points[2] + 10**6))
    assert missing.returncode == 4 and len(missing.stderr.splitlines()) == 1, missing.stderr
    assert f"holds no sync point {points[2] + 10**6}" in missing.stderr and str(points[2]) in missing.stderr
    assert check(points[2]).returncode == 0
