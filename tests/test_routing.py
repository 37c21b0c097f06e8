import datetime as dt
import decimal
from collections import Counter

import pytest

from gpcdc_toolkit.cluster import jump_consistent_hash, key_hash, segment_for


def test_python_values_and_their_decoded_text_route_alike():
    # Decoded WAL gives text; the workload gives Python values. Both must agree.
    assert segment_for([42], 7) == segment_for(["42"], 7)
    assert segment_for([decimal.Decimal("1.50")], 5) == segment_for(["1.50"], 5)
    assert segment_for([dt.date(2024, 1, 2)], 5) == segment_for(["2024-01-02"], 5)
    assert segment_for([True], 5) == segment_for(["t"], 5)


def test_composite_keys_are_not_concatenations():
    assert key_hash(["1", "23"]) != key_hash(["12", "3"])
    assert key_hash([None]) != key_hash([""])


def test_segments_are_balanced():
    counts = Counter(segment_for([k], 4) for k in range(40_000))
    assert set(counts) == {0, 1, 2, 3}
    assert max(counts.values()) / min(counts.values()) < 1.1


def test_growing_the_cluster_moves_keys_only_to_the_new_segment():
    moved = 0
    for k in range(20_000):
        h = key_hash([k])
        before, after = jump_consistent_hash(h, 3), jump_consistent_hash(h, 4)
        if before != after:
            assert after == 3
            moved += 1
    assert 0.2 < moved / 20_000 < 0.3  # about a quarter, as consistent hashing promises


def test_bad_input():
    with pytest.raises(ValueError, match="at least 1 segment"):
        jump_consistent_hash(1, 0)
    with pytest.raises(TypeError, match="unsupported distribution-key type float"):
        segment_for([1.5], 3)

