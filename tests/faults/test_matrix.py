"""The fault matrix: while a workload writes (hot keys, key moves, updates, deletes,
aborts, also after PREPARE), inject a fault at random moments, recover, and check that
nothing was lost, nothing applied partly or twice, the target equals the source row for
row, and the audit finds nothing wrong with the stream.

The default run has one reduced scenario (each fault once, in one run); the full
matrix, every fault repeated in several runs, is `./dev faults` (marker `faults`)."""

import collections
import contextlib
import datetime
import json
import os
import random
import re
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field

import pytest

from gpcdc_toolkit.audit import run_audit
from gpcdc_toolkit.bootstrap import Pipeline, bootstrap, drop_slots
from gpcdc_toolkit.broker import EmbeddedBroker, EmbeddedCluster
from gpcdc_toolkit.capture import CaptureGroup, drop_pipeline, repair_segment, wait_until_acknowledged
from gpcdc_toolkit.cluster import Session, resolve_in_doubt
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.connect import kafka_client_settings
from gpcdc_toolkit.errors import ClusterError
from gpcdc_toolkit.replay import Applier, Replayer
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.validate import check_against_truth, compare_tables, read_captured
from gpcdc_toolkit.workload import ACCOUNTS, EVENTS, WorkloadSpec, read_ground_truth, reset_tables, run_workload

from ..test_cluster_changes import failed_state, invalidate_slot
from ..test_replay_faults import ENV, applied_count, replay_command, wait_for_first_commit


@dataclass
class Pipeline_:
    config: object
    pipeline: Pipeline
    group: CaptureGroup
    broker: EmbeddedBroker
    target: Sandbox
    log: object = None
    replayer: subprocess.Popen | None = None
    recoveries: dict = field(default_factory=dict)  # fault -> seconds to recover, each time
    extra: int = 0  # transactions written outside the workload (negative account ids)
    outages: list = field(default_factory=list)  # (from, to) in epoch seconds: Kafka away, until the slot moved again
    silences: list = field(default_factory=list)  # the audit's watermark gaps the outages account for

    def start_replayer(self, work_dir):
        self.replayer = subprocess.Popen(replay_command(work_dir, self.target, self.config), env=ENV,
                                         stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, text=True)

    def stop_replayer(self):
        if self.replayer is not None and self.replayer.poll() is None:
            self.replayer.kill()
            self.replayer.wait()

    def said(self):
        self.log.seek(0)
        return self.log.read()[-3000:]


@contextlib.contextmanager
def pipeline_of(source_sandbox, work_dir, kafka=EmbeddedBroker, replicas=1):
    """A pipeline of ``source_sandbox`` with its own Kafka (which the faults kill: made
    by ``kafka(directory)``, topics with ``replicas`` replicas) and target, capture and
    a following replayer (a process of its own) running; all stopped after."""
    source = source_sandbox.cluster()
    tag = uuid.uuid4().hex[:6]
    broker = kafka(work_dir / f"faults-{tag}")
    target = Sandbox(f"target-{tag}", work_dir)
    with contextlib.ExitStack() as cleanup:  # what started is stopped, in reverse
        cleanup.callback(broker.remove)
        broker.up()
        cleanup.callback(target.down, remove=True)
        target.up(segments=2)
        config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                              "kafka.topic_prefix": f"f{tag}", "kafka.replication_factor": replicas,
                              "source.sandbox": source_sandbox.name, "target.sandbox": target.name,
                              "capture.heartbeat_interval": 0.3}, environ={})
        pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
        env = Pipeline_(config, pipeline, CaptureGroup(config), broker, target,
                        log=cleanup.enter_context((work_dir / f"replay-{tag}.log").open("w+")))
        env.source_sandbox = source_sandbox
        # The source as its catalog lists it then: a segment may have failed over.
        cleanup.callback(lambda: drop_slots(source_sandbox.cluster(), pipeline.slot, publication=pipeline.publication))
        cleanup.callback(env.group.stop)
        cleanup.callback(env.stop_replayer)
        reset_tables(source)
        run_workload(source, WorkloadSpec(threads=1, transactions=20, hot_keys=3, seed=5))
        env.start = bootstrap(source, pipeline, "snapshot")
        env.group.start()
        env.start_replayer(work_dir)
        wait_until_following(env)
        yield env


def wait_until_following(env, timeout=120):
    """Until the replayer has found its topics and begun (its state row written in the
    target): a following replayer gives up on topics it cannot find at its start, so
    faults come after that."""
    applier = Applier(env.target.cluster(), env.config.kafka.topic_prefix)
    try:
        deadline = time.monotonic() + timeout
        while applier.state() is None:
            assert env.replayer.poll() is None, env.said()
            assert time.monotonic() < deadline, f"the replayer had not begun within {timeout} s: {env.said()}"
            threading.Event().wait(0.1)  # polling the target for the replayer's state row
    finally:
        applier.close()


@pytest.fixture
def running(source_sandbox, work_dir):
    with pipeline_of(source_sandbox, work_dir) as env:
        yield env


@pytest.fixture
def own_source(work_dir):
    """A source of its own, for faults that could leave the shared one in doubt."""
    sandbox = Sandbox(f"src-{uuid.uuid4().hex[:6]}", work_dir).up(segments=2)
    try:
        yield sandbox
    finally:
        sandbox.down(remove=True)


def kill_capture(env, source, work_dir):
    content = random.choice([-1, *range(source.segment_count)])
    env.group.kill(content)
    began = time.monotonic()
    env.group.start()  # waits until the new worker streams
    return time.monotonic() - began


def kill_replayer(env, source, work_dir):
    env.replayer.send_signal(signal.SIGKILL)
    env.replayer.wait()
    before = applied_count(env.target.cluster())
    # Something for the new replayer to apply, even when the workload has ended (as it
    # may have on a busy machine) and the old one had applied everything.
    env.extra += 1
    with Session(source) as session, session.transaction() as tx:
        tx.insert(EVENTS, [{"account_id": -env.extra, "seq": 0, "payload": "after a replayer kill"}])
    began = time.monotonic()
    env.start_replayer(work_dir)
    wait_for_first_commit(env.target.cluster(), env.replayer, before)
    return time.monotonic() - began


@contextlib.contextmanager
def kafka_away(env):
    """The block's time, from the fault to the slot acknowledged again, recorded as an
    outage of Kafka (see ``audit_findings``)."""
    away = time.time()
    try:
        yield
    finally:
        env.outages.append((away, time.time()))


def kill_broker(env, source, work_dir):
    with kafka_away(env):
        env.broker.kill()
        threading.Event().wait(random.uniform(0.5, 2.0))  # the outage: how long the broker stays away
        began = time.monotonic()
        env.broker.up()
        wait_until_acknowledged(source, env.pipeline.slot, timeout=120)
    return time.monotonic() - began


FROZEN_FOR = 75.0  # seconds: past librdkafka's request timeout (30 s) and what was capture's message timeout (60 s)


def freeze_broker(env, source, work_dir):
    """The broker stops answering (SIGSTOP: its connections stay open) for longer than
    any of the producer's timeouts. Requests time out in flight and are sent again; no
    message may time out while later ones of its partition get through (a gap)."""
    with kafka_away(env):
        os.kill(env.broker.pid, signal.SIGSTOP)
        try:
            threading.Event().wait(FROZEN_FOR)  # the outage itself
        finally:
            os.kill(env.broker.pid, signal.SIGCONT)
        began = time.monotonic()
        wait_until_acknowledged(source, env.pipeline.slot, timeout=120)
    return time.monotonic() - began


def restarting(node, mode):
    """A node of the source stopped (fast, or immediate: as a crash) and started again;
    then what Greenplum's coordinator does on recovery: in-doubt parts finished."""
    def fault(env, source, work_dir):
        content = random.choice(range(source.segment_count)) if node == "segment" else -1
        began = time.monotonic()
        env.source_sandbox.restart(content, mode)
        resolve_in_doubt(source)
        return time.monotonic() - began
    return fault


def kill_leader_then_a_second_broker(env, source, work_dir):
    """Kafka as a cluster of three: the node leading most of the pipeline's partitions
    SIGKILLed; once capture has written through the new leaders, a second node
    SIGKILLed for a while (one node left: below min.insync.replicas, no controller
    quorum); then both started again."""
    cluster = env.broker
    with kafka_away(env):  # the new leaders' election
        cluster.node(most_leading(env.config)).kill()
        wait_until_acknowledged(source, env.pipeline.slot, timeout=120)  # written with two replicas in sync
    with kafka_away(env):
        cluster.node(random.choice([node for node in range(1, 4) if cluster.node(node).pid is not None])).kill()
        threading.Event().wait(random.uniform(2.0, 5.0))  # the outage: how long the cluster stays below its minimum
        began = time.monotonic()
        cluster.up()
        wait_until_acknowledged(source, env.pipeline.slot, timeout=180)
    return time.monotonic() - began


def topic_partitions(config):
    """The pipeline's partitions as Kafka's metadata lists them."""
    from confluent_kafka.admin import AdminClient

    from gpcdc_toolkit.protocol import Topics

    topics = Topics(config.kafka.topic_prefix)
    listed = AdminClient({"bootstrap.servers": config.kafka.bootstrap_servers}).list_topics(timeout=30).topics
    return [p for name in (topics.changes, topics.dtx) for p in listed[name].partitions.values()]


def most_leading(config):
    leaders = collections.Counter(p.leader for p in topic_partitions(config))
    return leaders.most_common(1)[0][0]


FAULTS = {"capture worker SIGKILL": kill_capture, "replayer SIGKILL": kill_replayer, "broker SIGKILL": kill_broker}
FREEZES = {f"broker frozen for {FROZEN_FOR:g} s": freeze_broker}
# Faults of a Kafka cluster (three nodes); on a pipeline whose Kafka is one.
KAFKA_CLUSTER_FAULTS = {"Kafka leader, then a second broker, SIGKILL": kill_leader_then_a_second_broker}
# Faults whose writers see errors (the workload reconnects; a transaction cut at its
# commit is in doubt until the recovery finishes it); on a source of their own.
RESTARTS = {"segment restart (fast)": restarting("segment", "fast"),
            "segment restart (immediate)": restarting("segment", "immediate"),
            "coordinator restart (immediate)": restarting("coordinator", "immediate")}


def run_scenario(env, source, work_dir, faults, *, seconds=6.0, seed=0):
    """The workload for ``seconds`` with ``faults`` injected in turn at random moments
    during it; then everything checked. Returns the figures of the run."""
    rng = random.Random(seed)
    truth = work_dir / f"truth-{env.config.kafka.topic_prefix}-{seed}.jsonl"
    spec = WorkloadSpec(threads=2, duration=seconds, rate=60, hot_keys=3, update_share=0.3, delete_share=0.1,
                        move_share=0.05, abort_share=0.05, abort_after_prepare_share=0.03, seed=seed)
    load = threading.Thread(target=run_workload, args=(source, spec), kwargs={"ground_truth": truth})
    load.start()
    try:
        for fault in faults:
            threading.Event().wait(rng.uniform(0.2, seconds / (len(faults) + 1)))  # a random moment
            recovery = {**FAULTS, **RESTARTS, **KAFKA_CLUSTER_FAULTS, **FREEZES}[fault](env, source, work_dir)
            env.recoveries.setdefault(fault, []).append(round(recovery, 2))
    finally:
        load.join()
    wait_until_acknowledged(source, env.pipeline.slot, timeout=120)
    target = env.target.cluster()
    deadline = time.monotonic() + 120

    def differences():
        try:
            return [d.line() for d in compare_tables(source, target, [ACCOUNTS, EVENTS]) if not d.equal]
        except ClusterError as e:  # the initial load has not made the table yet
            return [str(e)]

    while differences():
        assert env.replayer.poll() is None, env.said()
        assert time.monotonic() < deadline, f"{differences()}\n{env.said()}"
        threading.Event().wait(0.2)  # polling the target while the replayer follows
    # Whole in Kafka: every transaction after the start point on each segment it touched
    # (one in doubt, whole or not at all).
    check = check_against_truth(read_captured(env.config), read_ground_truth(truth), env.start.snapshot.sees)
    assert check.ok, check.problems[:5]
    return {"faults": list(faults), "transactions": check.after, "in_doubt": check.in_doubt,
            "lost": len(check.problems)}


def applied_once_each(env, figures):
    """Every source transaction after the start point recorded applied, once (the
    record's key is the gxid; a second apply of a hot-key increment would also have
    made the tables differ)."""
    return applied_count(env.target.cluster()) >= figures["transactions"]


def audit_findings(spark, env):
    """The audit's warnings and errors: (rule, severity, evidence); none on a clean stream
    but for the silences the faults made. While Kafka is away a capture worker waits for
    it and sends no watermark, so a node's watermarks may rightly show a gap across an
    outage (how long depends on how fast Kafka comes back). A gap is left out (kept in
    ``env.silences``) when the outages account for it: without the time they cover, it
    would not have been long enough to be a finding. Any other finding is kept."""
    result = run_audit(spark, env.config, write=False)
    findings = [(r.rule, r.severity, r.evidence) for r in result.findings.where("severity != 'info'").collect()]
    silence = env.config.audit.silence_ms / 1000
    explained = [f for f in findings if f[0] == "watermark_gap" and silent_beyond(env.outages, f[2]) <= silence]
    env.silences += [evidence for _rule, _severity, evidence in explained]
    return [f for f in findings if f not in explained]


def silent_beyond(outages, evidence):
    """Seconds of a watermark gap's evidence ("... (from T to T)") outside ``outages``."""
    times = re.search(r"\(from (.+) to (.+)\)$", evidence)
    assert times, f"a watermark gap's evidence names no times: {evidence!r}"
    since, until = (datetime.datetime.fromisoformat(t).replace(tzinfo=datetime.UTC).timestamp() for t in times.groups())
    covered, start = 0.0, since
    for away, to in sorted(outages):  # the gap's time within the union of the outages
        away, to = max(away, start), min(to, until)
        if to > away:
            covered, start = covered + to - away, to
    return until - since - covered


def test_each_fault_once_while_writing_loses_nothing(spark, source, work_dir, running):
    figures = run_scenario(running, source, work_dir, list(FAULTS), seconds=8.0, seed=11)
    assert figures["lost"] == 0 and figures["transactions"] > 100
    assert applied_once_each(running, figures)
    assert audit_findings(spark, running) == []
    running.replayer.terminate()
    assert running.replayer.wait(60) == 0, running.said()


@pytest.mark.faults
@pytest.mark.parametrize("run", range(3))
@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_matrix(spark, source, work_dir, running, fault, run):
    check_fault(spark, running.source_sandbox.cluster(), work_dir, running, fault, run)


@pytest.mark.faults
@pytest.mark.parametrize("run", range(3))
@pytest.mark.parametrize("fault", list(RESTARTS))
def test_fault_matrix_restarts(spark, own_source, work_dir, fault, run):
    with pipeline_of(own_source, work_dir) as env:
        check_fault(spark, own_source.cluster(), work_dir, env, fault, run)


@pytest.mark.changes
def test_a_kafka_cluster_losing_the_leader_then_a_second_broker_loses_nothing(spark, source_sandbox, work_dir):
    """Three Kafka nodes, topics of replication factor 3 and min.insync.replicas 2:
    the leader dies under a workload, then a second node for a while. Nothing
    acknowledged to a slot is lost, nothing applied twice, the target equals the
    source, the audit finds nothing but the nodes' silence while Kafka was away."""
    with pipeline_of(source_sandbox, work_dir, kafka=EmbeddedCluster, replicas=3) as env:
        assert {len(p.replicas) for p in topic_partitions(env.config)} == {3}
        figures = run_scenario(env, source_sandbox.cluster(), work_dir, list(KAFKA_CLUSTER_FAULTS), seconds=10.0,
                               seed=31)
        assert figures["lost"] == 0 and figures["transactions"] > 100
        assert applied_once_each(env, figures)
        assert audit_findings(spark, env) == []
        env.replayer.terminate()
        assert env.replayer.wait(60) == 0, env.said()
        print("KAFKA-CLUSTER", json.dumps({**figures, "recovery_s": env.recoveries, "silences": env.silences}))


@pytest.mark.changes
def test_a_broker_frozen_past_every_client_timeout_loses_nothing_and_no_worker_starts_over(
        spark, source_sandbox, work_dir):
    """Capture waits for a broker that does not answer, however long: a worker that gave
    up on a message and started over from its slot would write that message's
    transaction after later ones, which the replayer refuses."""
    with pipeline_of(source_sandbox, work_dir) as env:
        source = source_sandbox.cluster()
        figures = run_scenario(env, source, work_dir, list(FREEZES), seconds=6.0, seed=41)
        assert figures["lost"] == 0 and figures["transactions"] > 50
        restarts = {node.content: env.group.status(node.content)["restarts"] for node in source.nodes}
        assert set(restarts.values()) == {0}, restarts
        assert applied_once_each(env, figures)
        # The nodes' watermarks may show them silent, but only across the freeze.
        assert audit_findings(spark, env) == []
        env.replayer.terminate()
        assert env.replayer.wait(60) == 0, env.said()
        print("FROZEN-BROKER", json.dumps({**figures, "recovery_s": env.recoveries, "silences": env.silences}))


@pytest.mark.changes
def test_a_segment_failing_over_under_a_workload_stops_the_replay_at_the_gap_and_a_new_bootstrap_recovers(
        spark, work_dir):
    """A segment's mirror promoted while the workload writes: capture of that segment
    stops for good; the rest goes on. What can be proven is kept (the capture misses only
    the failed segment's parts, and only after its last acknowledgement: a suffix of its
    order), the replayer stops at the first transaction it cannot complete, the audit
    finds exactly that gap, and the documented recovery (a new bootstrap, replayed into
    a fresh target) ends with the target equal to the source."""
    mirrored = Sandbox(f"fo-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2, mirrors=True)
    try:
        with pipeline_of(mirrored, work_dir) as env:
            spec = WorkloadSpec(threads=2, duration=8.0, rate=60, hot_keys=3, update_share=0.3, delete_share=0.1,
                                move_share=0.05, abort_share=0.05, abort_after_prepare_share=0.03, seed=41)
            truths = [work_dir / f"truth-{env.config.kafka.topic_prefix}-{n}.jsonl" for n in (1, 2)]
            load = threading.Thread(target=run_workload, args=(mirrored.cluster(), spec),
                                    kwargs={"ground_truth": truths[0]})
            load.start()
            try:
                threading.Event().wait(random.uniform(1.0, 5.0))  # a random moment in the workload
                mirrored.failover(1)
            finally:
                load.join()  # its writers to the failed primary fail until its end
            source = mirrored.cluster()
            # The workload settled the parts its writers left prepared on the nodes the
            # catalog lists now: those of the old primary are on its mirror.
            assert source.prepared_transactions() == []
            # Written through the new primary: its part of these is never captured.
            run_workload(source, WorkloadSpec(threads=1, transactions=30, hot_keys=3, seed=42),
                         ground_truth=truths[1])
            assert "is on timeline 2, not 1" in failed_state(env.group, 1)
            wait_until_acknowledged(source, env.pipeline.slot, contents=[-1, 0])
            assert env.replayer.wait(120) == 4, env.said()
            assert "segment 1 is lost to the pipeline" in env.said()

            truth = [r for path in truths for r in read_ground_truth(path)]
            check = check_against_truth(read_captured(env.config), truth, env.start.snapshot.sees)
            assert check.problems, "transactions written after the failover touched segment 1"
            distributed = set()  # gxids of the distributed transactions whose part on segment 1 never came
            for problem in check.problems:  # each one is a part of segment 1 that never came, and only that
                gxid, touched, captured = re.fullmatch(
                    r"gxid (\d+) touched segments \[(.*)\], captured on \[(.*)\]", problem).groups()
                touched = {int(s) for s in touched.split(", ")}
                assert {int(s) for s in captured.split(", ") if captured} == touched - {1}
                if len(touched) > 1:
                    distributed.add(int(gxid))
            # The audit finds exactly that gap: the lost node, and each distributed
            # transaction missing its part there (one on segment 1 alone has no record to
            # name it: the lost mark stands for those).
            result = run_audit(spark, env.config, write=False)
            assert {(rule, severity) for rule, severity, _n in result.summary if severity != "info"} == {
                ("lost_node", "error"), ("missing_part", "error")}
            assert ("lost_node", "error", 1) in result.summary
            missing = result.findings.where("rule = 'missing_part'").select("gxid", "segments").collect()
            assert {row.gxid for row in missing} == distributed and {tuple(row.segments) for row in missing} == {(1,)}

            # The recovery docs/reliability.md names: bootstrap again, replay into a fresh target.
            drop_pipeline(env.config, source, delete_topics=True)
            env.start = bootstrap(source, env.pipeline, "snapshot")
            env.group.start()
            run_workload(source, WorkloadSpec(threads=1, transactions=20, hot_keys=3, seed=43))
            wait_until_acknowledged(source, env.pipeline.slot, timeout=120)
            fresh = Sandbox(f"fresh-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2)
            try:
                with Replayer(env.config.with_settings({"target.sandbox": fresh.name})) as replayer:
                    replayer.run()
                assert [d.line() for d in compare_tables(source, fresh.cluster(), [ACCOUNTS, EVENTS]) if not d.equal] == []
            finally:
                fresh.down(remove=True)
    finally:
        mirrored.down(remove=True)


def writing(cluster, seed, seconds, truth):
    """A workload of ``seconds`` in a thread of its own, started; its record in ``truth``."""
    spec = WorkloadSpec(threads=2, duration=seconds, rate=60, hot_keys=3, update_share=0.3, delete_share=0.1,
                        move_share=0.05, abort_share=0.05, abort_after_prepare_share=0.03, seed=seed)
    load = threading.Thread(target=run_workload, args=(cluster, spec), kwargs={"ground_truth": truth})
    load.start()
    return load


def until_the_target_equals(env, source, timeout=120):
    """Poll the target while the replayer follows, until it equals the source."""
    target, deadline = env.target.cluster(), time.monotonic() + timeout
    while differing := [d.line() for d in compare_tables(source, target, [ACCOUNTS, EVENTS]) if not d.equal]:
        assert env.replayer.poll() is None, env.said()
        assert time.monotonic() < deadline, f"{differing}\n{env.said()}"
        threading.Event().wait(0.2)  # polling the target while the replayer follows


@pytest.mark.changes
@pytest.mark.parametrize("loss", ["failover", "slot_invalidated"])
def test_a_segment_lost_under_a_workload_and_repaired_while_it_writes_ends_with_the_target_equal(
        spark, work_dir, loss):
    """The documented recovery without capturing again what was not lost: segment 1's
    capture is lost mid-workload (its mirror promoted, or its slot invalidated by
    max_slot_wal_keep_size while its worker was down), the replayer stops at the gap;
    while the workload writes on, `repair_segment` (`gpcdc bootstrap repair`) captures
    the segment again from a new consistent cut, its worker and the replayer start
    again. What capture missed is exactly segment 1's part of transactions the repair's
    cut saw (its copy holds them), the target ends equal to the source, and the audit
    reports the repaired loss."""
    mirrored = Sandbox(f"fr-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2, mirrors=True)

    try:
        with pipeline_of(mirrored, work_dir) as env:
            truths = [work_dir / f"truth-{env.config.kafka.topic_prefix}-{n}.jsonl" for n in (1, 2)]
            load = writing(mirrored.cluster(), 51, 6.0, truths[0])
            try:
                threading.Event().wait(random.uniform(1.0, 4.0))  # a random moment in the workload
                if loss == "failover":
                    mirrored.failover(1)
                else:
                    cluster = mirrored.cluster()
                    env.group.kill(1)
                    invalidate_slot(cluster, cluster.segments[1], env.pipeline.slot)
                    env.group.start_node(1, env.group.log_file(1))
            finally:
                load.join()
            assert ("is on timeline 2, not 1" if loss == "failover" else "was invalidated") in failed_state(
                env.group, 1)
            source = mirrored.cluster()
            resolve_in_doubt(source)
            load = writing(source, 52, 8.0, truths[1])  # through the new primary
            try:
                threading.Event().wait(random.uniform(0.5, 3.0))  # a random moment in the workload
                repair = repair_segment(source, env.pipeline, 1, kafka_client_settings(env.config))
                env.group.start()
                # A replayer that met the gap has stopped there; one that had not goes on.
                if env.replayer.poll() is not None:
                    assert env.replayer.returncode == 4, env.said()
                    env.start_replayer(work_dir)
            finally:
                load.join()
            resolve_in_doubt(source)
            wait_until_acknowledged(source, env.pipeline.slot, timeout=120)
            until_the_target_equals(env, source)

            truth = [r for path in truths for r in read_ground_truth(path)]
            check = check_against_truth(read_captured(env.config), truth, env.start.snapshot.sees)
            assert check.after > 100
            for problem in check.problems:  # only segment 1's parts the repair's copy holds
                gxid, touched, captured = re.fullmatch(
                    r"gxid (\d+) touched segments \[(.*)\], captured on \[(.*)\]", problem).groups()
                touched = {int(s) for s in touched.split(", ")}
                assert {int(s) for s in captured.split(", ") if captured} == touched - {1}
                assert repair.snapshot.sees(int(gxid)), problem
            result = run_audit(spark, env.config, write=False)
            assert [(rule, severity) for rule, severity, _n in result.summary if severity != "info"] == [
                ("lost_node", "warning")], result.summary
            env.replayer.terminate()
            assert env.replayer.wait(60) == 0, env.said()
            print("REPAIR", loss, json.dumps({"transactions": check.after, "covered": len(check.problems)}))
    finally:
        mirrored.down(remove=True)


@pytest.mark.changes
def test_a_source_expanded_under_a_workload_and_extended_while_it_writes_ends_with_the_target_equal(spark, work_dir):
    """gpexpand's two steps while the workload writes: two segments added and rows moved
    to them at a random moment (the writers wait, then route over four), then at a
    random moment of a second workload, capture stopped, `extend_pipeline` (`gpcdc
    bootstrap extend`) and capture started again. The replayer following from before
    stops at the first record naming a new segment and, run again, goes on. What capture
    missed is exactly the new segments' parts of transactions their cut saw (the copies
    hold them), the target ends equal to the source, and the audit finds nothing wrong
    beyond capture's pause."""
    from gpcdc_toolkit.capture import extend_pipeline

    sandbox = Sandbox(f"fx-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2)

    try:
        with pipeline_of(sandbox, work_dir) as env:
            truths = [work_dir / f"truth-{env.config.kafka.topic_prefix}-{n}.jsonl" for n in (1, 2)]
            load = writing(sandbox.cluster(), 61, 6.0, truths[0])
            try:
                threading.Event().wait(random.uniform(1.0, 4.0))  # a random moment in the workload
                expansion = sandbox.expand(2)
            finally:
                load.join()
            assert expansion.rows_moved > 0
            assert "which the pipeline's start point does not list" in failed_state(env.group, -1)
            source = sandbox.cluster()
            load = writing(source, 62, 8.0, truths[1])
            try:
                threading.Event().wait(random.uniform(0.5, 3.0))  # a random moment in the workload
                env.group.stop()
                joined = {r.node.content: r for r in extend_pipeline(source, env.pipeline,
                                                                     kafka_client_settings(env.config),
                                                                     dispatcher="segment")}
                env.group.start()
                # The replayer reads two segments' partitions: it stops at the first record naming more.
                assert env.replayer.wait(120) == 5, env.said()
                env.start_replayer(work_dir)
            finally:
                load.join()
            assert sorted(joined) == [2, 3]
            resolve_in_doubt(source)
            wait_until_acknowledged(source, env.pipeline.slot, timeout=120)
            until_the_target_equals(env, source)

            truth = [r for path in truths for r in read_ground_truth(path)]
            check = check_against_truth(read_captured(env.config), truth, env.start.snapshot.sees)
            assert check.after > 100 and check.problems, "transactions before the cut touched the new segments"
            for problem in check.problems:  # only new segments' parts that their copies hold
                gxid, touched, captured = re.fullmatch(
                    r"gxid (\d+) touched segments \[(.*)\], captured on \[(.*)\]", problem).groups()
                touched = {int(s) for s in touched.split(", ")}
                uncaptured = touched - {int(s) for s in captured.split(", ") if captured}
                assert uncaptured and uncaptured <= {2, 3}, problem
                assert all(joined[s].snapshot.sees(int(gxid)) for s in uncaptured), problem
            result = run_audit(spark, env.config, write=False)
            # Capture stood still from the first record naming a new segment until the
            # extension started it again: a pause longer than audit.silence_ms is a
            # watermark gap, and nothing else is worth more than information.
            assert {(rule, severity) for rule, severity, _n in result.summary if severity != "info"} <= {
                ("watermark_gap", "warning")}, result.summary
            env.replayer.terminate()
            assert env.replayer.wait(60) == 0, env.said()
            print("EXTEND", json.dumps({"transactions": check.after, "covered": len(check.problems),
                                        "moved": expansion.rows_moved}))
    finally:
        sandbox.down(remove=True)


@pytest.mark.faults
def test_a_replayer_started_while_the_broker_is_away_follows_once_it_is_back(source, work_dir, running):
    """Found under load: a replayer whose first metadata request met a broker that was
    away gave up at once. It asks again (for up to 30 s when following)."""
    running.replayer.kill()
    running.replayer.wait()
    target = running.target.cluster()
    before = applied_count(target)
    running.broker.kill()
    running.start_replayer(work_dir)
    threading.Event().wait(12.0)  # the outage the new replayer starts into: longer than a metadata request waits
    assert running.replayer.poll() is None, running.said()
    running.broker.up()
    run_workload(source, WorkloadSpec(threads=1, transactions=20, hot_keys=3, seed=21))
    wait_for_first_commit(target, running.replayer, before)
    wait_until_acknowledged(source, running.pipeline.slot, timeout=120)
    deadline = time.monotonic() + 120
    while not all(d.equal for d in compare_tables(source, target, [ACCOUNTS, EVENTS])):
        assert running.replayer.poll() is None and time.monotonic() < deadline, running.said()
        threading.Event().wait(0.2)  # polling the target while the replayer follows
    running.replayer.terminate()
    assert running.replayer.wait(60) == 0, running.said()


def check_fault(spark, source, work_dir, running, fault, run):
    figures = run_scenario(running, source, work_dir, [fault] * 3, seconds=8.0, seed=100 + run)
    assert figures["lost"] == 0
    assert applied_once_each(running, figures)
    assert audit_findings(spark, running) == []
    running.replayer.terminate()
    assert running.replayer.wait(60) == 0, running.said()
    print("FAULT-MATRIX", json.dumps({**figures, "run": run, "recovery_s": running.recoveries}))
