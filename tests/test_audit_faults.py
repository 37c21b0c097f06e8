"""The audit against real capture: a clean stream of a busy workload has no findings,
and each injected fault (alone or mixed) gives exactly its findings, no more, no fewer.

Every case is a Spark audit of its own: a suite of their own (`./dev test-audits`)."""

import random
import threading
import uuid
from collections import Counter

import orjson
import pytest

from gpcdc_toolkit.audit import audit_events, events_frame
from gpcdc_toolkit.audit._faults import FAULTS, Expected, Message, inject, node_of, quiet_thresholds
from gpcdc_toolkit.bootstrap import Pipeline, bootstrap, drop_slots
from gpcdc_toolkit.capture import CaptureGroup, wait_until_acknowledged
from gpcdc_toolkit.cluster import Session
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.connect import kafka_client_settings
from gpcdc_toolkit.errors import StreamError
from gpcdc_toolkit.ingest import located, read_to_end
from gpcdc_toolkit.protocol import Topics
from gpcdc_toolkit.replay._order import Part, Reassembler, Record
from gpcdc_toolkit.replay._source import Framer, Watermark
from gpcdc_toolkit.workload import WorkloadSpec, reset_tables, run_workload, setup_tables

pytestmark = pytest.mark.audits

SKEW_MS = 1000
ERRORS = ("missing_part", "damaged_part", "commit_lsn_backwards", "corrupt_message", "key_order", "unlisted_part",
          "conflicting_duplicate", "orphan_part")


def read_messages(config):
    kafka = kafka_client_settings(config)
    topics = Topics(config.kafka.topic_prefix)
    out = []
    for topic in (topics.changes, topics.dtx):
        for m in read_to_end(kafka, topic):
            partition, offset = located(m)
            out.append(Message(topic, partition, offset, m.timestamp()[1], m.key(), m.value()))
    return out


def settled(messages, nodes=4):
    """Whether every node's latest prepared list was read well past the last commit."""
    last_commit, prepared = 0, {}
    for m in messages:
        v = orjson.loads(m.value)
        if v.get("commit_ts_ms") is not None:
            last_commit = max(last_commit, v["commit_ts_ms"])
        if v.get("prepared_ts_ms") is not None:
            node = node_of(m.topic, m.partition)
            prepared[node] = max(prepared.get(node, 0), v["prepared_ts_ms"])
    return len(prepared) == nodes and min(prepared.values()) > last_commit + 2 * SKEW_MS


@pytest.fixture(scope="module")
def clean(source, broker, work_dir):
    """A settled stream of a busy workload (hot keys, key moves, aborts, DDL), as captured."""
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"a{uuid.uuid4().hex[:8]}", "source.sandbox": "source"}, environ={})
    pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
    reset_tables(source)
    setup_tables(source, hot_keys=3)
    bootstrap(source, pipeline, "snapshot")
    group = CaptureGroup(config.with_settings({"capture.heartbeat_interval": 0.2}))
    group.start()
    try:
        spec = WorkloadSpec(threads=3, duration=5.0, rate=150, hot_keys=3, hot_share=0.5, update_share=0.3,
                            delete_share=0.1, move_share=0.05, abort_share=0.05, abort_after_prepare_share=0.03,
                            seed=5)
        load = threading.Thread(target=run_workload, args=(source, spec))
        load.start()
        try:
            with Session(source) as session:
                session.ddl("ALTER TABLE wl_events ADD COLUMN audit_note text")
        finally:
            load.join()
        wait_until_acknowledged(source, pipeline.slot)
        stop = threading.Event()
        for _ in range(300):  # until the watermarks are past the last commit: a condition on the data, 30 s at most
            messages = read_messages(config)
            if settled(messages):
                break
            stop.wait(0.1)
        assert settled(messages), "the watermarks did not pass the last commit within 30 s"
    finally:
        group.stop()
        drop_slots(source, pipeline.slot, publication=pipeline.publication)
    return messages, quiet_thresholds(messages, SKEW_MS)


def subjects(findings):
    out = Counter()
    for f in findings.collect():
        node = f["segments"][0] if f["segments"] else node_of(f["topic"], f["partition"])
        out[Expected(f["rule"], node, f["gxid"])] += 1
    return out


def replayer_verdict(messages, segments):
    """The replayer's classification of the first transaction it cannot hand out: the
    parts it proves missing and the ones it still waits for; None when it refuses the
    stream outright."""
    framer, reassembler = Framer("audit"), Reassembler(segments, clock_skew_ms=SKEW_MS)
    try:
        for m in sorted(messages, key=lambda m: (m.topic.endswith(".dtx"), m.partition, m.offset)):
            try:
                value = orjson.loads(m.value)
            except orjson.JSONDecodeError:
                continue
            framed = framer.feed(node_of(m.topic, m.partition), m.offset, value)
            if isinstance(framed, Part):
                reassembler.add_part(framed)
            elif isinstance(framed, Record):
                reassembler.add_record(framed)
            elif isinstance(framed, Watermark):
                reassembler.add_watermark(framed.segment, framed.resolved_ts_ms, framed.prepared,
                                          framed.prepared_ts_ms)
            reassembler.ready()
    except StreamError:
        return None
    missing = {(m.gxid, m.segment) for m in reassembler.missing() if m.damage is None}
    return missing, set(reassembler.in_doubt()) - missing


def check(spark, messages, expected, thresholds):
    findings, _ = audit_events(events_frame(spark, messages), thresholds)
    got = subjects(findings)
    want = Counter(expected)
    assert got == want, f"unexpected: {sorted((got - want).elements())}; not found: {sorted((want - got).elements())}"
    return got


def test_a_clean_busy_stream_has_no_findings(spark, clean):
    messages, thresholds = clean
    check(spark, messages, [], thresholds)


def check_one_fault(spark, clean, fault, segments):
    """``fault`` injected into the ``clean`` (messages, thresholds) stream of ``segments``
    segments gives exactly its findings; and the replayer refuses only streams the audit
    finds errors in, stops at a missing part only where the audit finds an error, and
    waits for the parts the audit calls late."""
    messages, thresholds = clean
    faulty, expected, _ = inject(messages, fault, random.Random(fault), thresholds)
    assert expected, f"{fault} should be seen"
    got = check(spark, faulty, expected, thresholds)
    if fault != "strip_markers":
        verdict = replayer_verdict(faulty, segments)
        if verdict is None:
            assert any(e.rule in ERRORS for e in got)
        else:
            missing, late = verdict
            assert missing <= {(e.gxid, e.node) for e in got if e.rule in ERRORS}
            assert late <= {(e.gxid, e.node) for e in got if e.rule == "late_part"}


# Faults that act on one node's messages, and those that act on transactions (any node).
ON_A_NODE = ("drop_part", "reorder_partition", "duplicate_range", "delay_segment", "drop_watermarks", "corrupt_message",
             "flag_one_phase", "early_watermark", "conflicting_duplicate")
ON_TRANSACTIONS = ("conflicting_pair", "drop_record", "unlist_segment")


def check_a_mix(spark, clean, seed, segments):
    """A fault on each segment (a different one each) and one on transactions, drawn by
    ``seed``, give exactly their findings together."""
    messages, thresholds = clean
    rng = random.Random(seed)
    nodes = rng.sample(range(segments), segments)
    mix = sorted(rng.sample(ON_A_NODE, segments), key=lambda f: f != "delay_segment") + [rng.choice(ON_TRANSACTIONS)]
    faulty, expected, touched = messages, [], set()
    for fault, node in zip(mix, [*nodes, None]):
        faulty, more, gxids = inject(faulty, fault, rng, thresholds, touched, node)
        expected += more
        touched |= gxids
    check(spark, faulty, expected, thresholds)


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_gives_exactly_its_findings(spark, clean, fault):
    check_one_fault(spark, clean, fault, 3)


@pytest.mark.parametrize("seed", range(4))
def test_random_mixes_of_faults_give_exactly_their_findings(spark, clean, seed):
    check_a_mix(spark, clean, seed, 3)


def test_a_window_read_from_partway_proves_nothing_it_cannot(spark, clean):
    """Without the partitions' beginnings (a --from window, or retention), what may lie
    before the window is never called missing, damaged, lost or out of order."""
    messages, thresholds = clean
    rng = random.Random(8)
    heads = {}
    for m in messages:
        heads.setdefault((m.topic, m.partition), []).append(m.offset)
    cut = {p: rng.choice(offsets[len(offsets) // 10: len(offsets) // 2]) for p, offsets in heads.items()}
    window = [m for m in messages if m.offset >= cut[(m.topic, m.partition)]]
    findings, _ = audit_events(events_frame(spark, window), thresholds)
    serious = [(f["rule"], f["evidence"]) for f in findings.where("severity != 'info'").collect()]
    assert serious == []
    # Faults inside the window are still found.
    faulty, expected, _ = inject(window, "corrupt_message", random.Random(1), thresholds)
    findings, _ = audit_events(events_frame(spark, faulty), thresholds)
    assert Counter(expected) <= subjects(findings.where("severity != 'info'"))
