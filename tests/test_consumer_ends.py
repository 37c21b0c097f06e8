"""Where a read ends: each partition's high watermark when it began (no servers)."""

from hypothesis import given
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
