"""The bookkeeping that lets a capture worker acknowledge its slot without waiting for
Kafka (``capture/_confirmations.py``), against a model of a producer whose partitions
confirm their events in order, in any interleaving."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from gpcdc_toolkit.capture._confirmations import FIRST_LOOK, LONGEST_LOOK, Confirmations


@dataclass(frozen=True)
class _Message:
    number: int
    at: int = 0  # its offset in the partition
    name: str = "changes"

    def topic(self) -> str:
        return self.name

    def partition(self) -> int:
        return self.number

    def offset(self) -> int:
        return self.at


PARTITIONS = 3
_steps = st.lists(st.one_of(
    st.tuples(st.just("send"), st.integers(0, PARTITIONS - 1)),
    st.tuples(st.just("confirm"), st.integers(0, PARTITIONS - 1)),
    st.tuples(st.just("checkpoint"), st.integers(-3, 5)),  # a step back too: an ack limit that fell
), max_size=80)


@given(_steps)
def test_a_position_is_confirmed_once_every_event_produced_before_it_is_and_not_before(steps):
    confirmations = Confirmations()
    produced = [0] * PARTITIONS  # reported events produced, per partition
    delivered = [0] * PARTITIONS  # of those, confirmed (a partition confirms in order)
    checkpoints: list[tuple[int, list[int]]] = []  # (position, produced by then)
    position, acknowledged = 0, -1
    for step, (action, value) in enumerate(steps):
        if action == "send":
            confirmations.sent("changes", value)
            produced[value] += 1
        elif action == "confirm" and delivered[value] < produced[value]:
            confirmations.on_delivery(None, _Message(value, at=delivered[value]))
            delivered[value] += 1
        elif action == "checkpoint":
            position = max(0, position + value)
            confirmations.checkpoint(position, now=float(step))
            checkpoints.append((position, list(produced)))
        if (got := confirmations.confirmed()) is not None:
            assert got > acknowledged, "a position confirmed twice, or going back"
            acknowledged = got
        proven = [p for p, by_then in checkpoints if all(d >= n for d, n in zip(delivered, by_then))]
        assert acknowledged == max(proven, default=-1)
        assert confirmations.unconfirmed() == sum(produced) - sum(delivered)
        assert [confirmations.offsets.get(("changes", p), -1) for p in range(PARTITIONS)] == \
            [d - 1 for d in delivered], "the offset of each partition's last confirmed event"
    assert confirmations.error is None and confirmations.went_back is None


def test_what_waits_for_kafka_and_since_when():
    confirmations = Confirmations()
    confirmations.checkpoint(10, now=1.0)
    assert confirmations.confirmed() == 10 and confirmations.waiting_since() is None  # nothing produced yet
    confirmations.sent("changes", 0)
    confirmations.checkpoint(10, now=2.0)  # no further, but resting on an event Kafka has not confirmed
    confirmations.checkpoint(10, now=3.0)  # nothing new: the same checkpoint
    confirmations.sent("changes", 1)
    confirmations.checkpoint(20, now=4.0)
    assert confirmations.confirmed() is None and confirmations.waiting_since() == 2.0
    assert confirmations.unconfirmed() == 2
    confirmations.on_delivery(None, _Message(0, name="dtx"))  # another topic's: not the one waited for
    confirmations.on_delivery(None, _Message(1))  # another partition's: partition 0 still waits
    assert confirmations.confirmed() is None and confirmations.waiting_since() == 2.0
    confirmations.on_delivery(None, _Message(0))
    assert confirmations.confirmed() == 20 and confirmations.waiting_since() is None


def test_a_failed_event_is_kept_and_never_counted_as_confirmed():
    confirmations = Confirmations()
    confirmations.sent("changes", 0)
    confirmations.checkpoint(5, now=0.0)
    confirmations.on_delivery("broker: record too large", _Message(0))
    confirmations.on_delivery("a later error", _Message(0))
    assert confirmations.error == "broker: record too large"
    assert confirmations.confirmed() is None and confirmations.unconfirmed() == 1


@given(st.lists(st.integers(0, 50), min_size=2, max_size=20))
def test_a_confirmation_at_or_before_an_earlier_one_of_its_partition_is_kept_as_a_loss(offsets):
    """Kafka confirms a partition's events at growing offsets; one confirmed at or before
    an offset confirmed earlier means the partition lost what came between (a leader
    elected without it). The first such is kept, and the offsets recorded never go back."""
    confirmations = Confirmations()
    for offset in offsets:
        confirmations.on_delivery(None, _Message(0, at=offset))
    first_back = next(((max(offsets[:i]), o) for i, o in enumerate(offsets) if i and o <= max(offsets[:i])), None)
    assert confirmations.went_back == (None if first_back is None else (("changes", 0), *first_back))
    assert confirmations.offsets == {("changes", 0): max(offsets)}


@given(st.floats(0, 1e6), st.lists(st.floats(0, 1e4), min_size=1, max_size=20))
def test_delivery_reports_are_looked_for_soon_then_less_often_never_late_by_more_than_an_eighth(since, waits):
    confirmations = Confirmations()
    assert confirmations.look_again_in(since) is None  # nothing awaited: no looking
    confirmations.sent("changes", 0)
    confirmations.checkpoint(5, now=since)
    looks = [confirmations.look_again_in(since + waited) for waited in sorted(waits)]
    assert looks == sorted(looks)  # never more often as the wait goes on
    for waited, look in zip(sorted(waits), looks, strict=True):
        assert FIRST_LOOK <= look <= LONGEST_LOOK
        # the slot learns of it at most an eighth late (give or take the clock's rounding)
        assert look <= max(FIRST_LOOK, waited / 8) + 1e-9
    confirmations.on_delivery(None, _Message(0))
    assert confirmations.confirmed() == 5 and confirmations.look_again_in(since + max(waits)) is None
