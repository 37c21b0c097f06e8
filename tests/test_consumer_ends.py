"""Where a read ends: each partition's high watermark when it began (no servers)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from gpcdc_toolkit.ingest import EndTracker


@given(st.dictionaries(st.integers(0, 5), st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1),
       st.integers(0, 20))
def test_a_partition_ends_at_its_high_watermark_and_later_messages_are_left_out(bounds, later):
    start = {p: min(a, b) for p, (a, b) in bounds.items()}
    ends = {p: max(a, b) for p, (a, b) in bounds.items()}
    tracker = EndTracker(ends, start)
    assert tracker.ended == {p for p in ends if start[p] == ends[p]}, "an empty range is read at once"
    for p in ends:
        for offset in range(start[p], ends[p] + later):
            kept = tracker.message(p, offset)
            assert kept == (offset < ends[p])
            assert (p in tracker.ended) == (offset + 1 >= ends[p])
    assert tracker.ended == set(ends)


def test_an_end_of_partition_event_ends_a_partition():
    tracker = EndTracker({0: 10, 1: 10}, {0: 0, 1: 0})
    tracker.end_of_partition(1)
    assert tracker.ended == {1}


class _SettlingBroker:
    """A consumer whose broker answers NOT_LEADER a few times per partition, then the end."""

    def __init__(self, refusals, error=None):
        self.refusals = dict(refusals)
        self.error = error
        self.asked = 0

    def get_watermark_offsets(self, partition, timeout):
        from confluent_kafka import KafkaError, KafkaException

        self.asked += 1
        if self.refusals.get(partition.partition, 0):
            self.refusals[partition.partition] -= 1
            raise KafkaException(KafkaError(self.error or KafkaError.NOT_LEADER_FOR_PARTITION))
        return 0, 100 + partition.partition


@settings(max_examples=10, deadline=None)  # each refusal waits 0.1 s before asking again
@given(st.dictionaries(st.integers(0, 3), st.integers(0, 2), min_size=1))
def test_a_broker_whose_leadership_settles_is_asked_again(refusals):
    from gpcdc_toolkit.ingest._consumer import high_watermarks

    broker = _SettlingBroker(refusals)
    assert high_watermarks(broker, "t", sorted(refusals), timeout=30) == {p: 100 + p for p in refusals}
    assert broker.asked == len(refusals) + sum(refusals.values())


def test_other_broker_errors_and_a_leadership_that_never_settles_are_one_line():
    import pytest
    from confluent_kafka import KafkaError

    from gpcdc_toolkit.errors import BrokerError
    from gpcdc_toolkit.ingest._consumer import high_watermarks

    with pytest.raises(BrokerError, match=r"Kafka did not say where 't' partition 0 ends \(Broker: Topic authorization"):
        high_watermarks(_SettlingBroker({0: 1}, KafkaError.TOPIC_AUTHORIZATION_FAILED), "t", [0], timeout=30)
    # A partition a restarting broker's metadata lacks for a moment is asked again; so
    # is one whose request was on a cluster node that died (its handle destroyed), or
    # whose new leader's high watermark is not caught up yet.
    for settling in (KafkaError._UNKNOWN_PARTITION, KafkaError._DESTROY_BROKER, KafkaError._ALL_BROKERS_DOWN,
                     KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.FENCED_LEADER_EPOCH):
        assert high_watermarks(_SettlingBroker({0: 2}, settling), "t", [0], timeout=30) == {0: 100}
    with pytest.raises(BrokerError, match="within 0.3 s .*check the broker"):
        high_watermarks(_SettlingBroker({0: 10**6}), "t", [0], timeout=0.3)


def test_a_follower_asks_a_broker_that_stopped_answering_for_as_long_as_it_takes():
    """Without a timeout (a following replayer), a broker that times out (frozen) is asked
    again past any wait given elsewhere; an error that is not the broker's absence still
    ends it at once."""
    import pytest
    from confluent_kafka import KafkaError

    from gpcdc_toolkit.errors import BrokerError
    from gpcdc_toolkit.ingest._consumer import high_watermarks

    frozen = _SettlingBroker({0: 5, 1: 5}, KafkaError._TIMED_OUT)
    assert high_watermarks(frozen, "t", [0, 1], timeout=None) == {0: 100, 1: 101}
    assert frozen.asked == 12
    with pytest.raises(BrokerError, match="partition 0 ends \\(Broker: Topic authorization"):
        high_watermarks(_SettlingBroker({0: 1}, KafkaError.TOPIC_AUTHORIZATION_FAILED), "t", [0], timeout=None)


class _RestartingBroker:
    """A consumer whose metadata requests meet answers in turn: an exception's error, a
    topic's error, or the partitions."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.asked = 0

    def list_topics(self, topic, timeout):
        from types import SimpleNamespace

        from confluent_kafka import KafkaError, KafkaException

        self.asked += 1
        kind, value = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if kind == "raise":
            raise KafkaException(KafkaError(value))
        info = SimpleNamespace(error=KafkaError(value) if kind == "error" else None,
                               partitions={p: None for p in value} if kind == "partitions" else {})
        return SimpleNamespace(topics={} if kind == "absent" else {topic: info})


def test_the_partitions_of_a_topic_are_asked_again_while_the_broker_comes_back():
    from confluent_kafka import KafkaError

    from gpcdc_toolkit.ingest import partitions_of

    broker = _RestartingBroker([("raise", KafkaError._TRANSPORT), ("raise", KafkaError._TIMED_OUT),
                                ("error", KafkaError.LEADER_NOT_AVAILABLE), ("partitions", [2, 0, 1])])
    assert partitions_of(broker, "p.changes", timeout=30) == [0, 1, 2]


def test_a_topic_that_does_not_exist_or_a_broker_that_stays_away_is_one_line():
    import pytest
    from confluent_kafka import KafkaError

    from gpcdc_toolkit.errors import BrokerError
    from gpcdc_toolkit.ingest import partitions_of

    for answer in [("absent", None), ("error", KafkaError.UNKNOWN_TOPIC_OR_PART)]:
        broker = _RestartingBroker([answer])
        with pytest.raises(BrokerError, match="cannot read topic 'p.changes'.*create the pipeline first"):
            partitions_of(broker, "p.changes", timeout=30)
        assert broker.asked == 1, "said at once"
    with pytest.raises(BrokerError, match=r"cannot read topic 'p.changes': .* \(asked for 0.5 s\): check the broker"):
        partitions_of(_RestartingBroker([("raise", KafkaError._TRANSPORT)]), "p.changes", timeout=0.5)
