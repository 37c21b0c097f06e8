import pytest

from gpcdc_toolkit.protocol import CommitRecord, DdlRecord, GxidMarker, MarkerError, OnePhaseMarker
from gpcdc_toolkit.protocol import _markers as markers


@pytest.mark.parametrize("marker", [
    GxidMarker(7), OnePhaseMarker(8), CommitRecord(9, (0, 2)), CommitRecord(10, None),
    CommitRecord(12, (0, 1), syncpoint=((-1, 900), (0, 1 << 40), (1, 7))),
    DdlRecord(11, "CREATE TABLE t (id int) DISTRIBUTED BY (id)"),
])
def test_round_trip(marker):
    prefix, content = markers.encode(marker)
    assert markers.decode(prefix, content.encode()) == marker


def test_legacy_commit_record_has_no_segment_list():
    prefix, content = markers.encode(CommitRecord(5, None))
    assert "segments" not in content


def test_foreign_prefix_is_not_a_marker():
    assert markers.decode("someone.else", "x") is None


@pytest.mark.parametrize("prefix,content,message", [
    ("gpcdc.gxid", "abc", "not a gxid"),
    ("gpcdc.commit", "{", "not JSON"),
    ("gpcdc.commit", "[1]", "not a JSON object"),
    ("gpcdc.commit", '{"gxid": 0}', "positive integer gxid"),
    ("gpcdc.commit", '{"gxid": 3, "segments": [0, "x"]}', "malformed segment list"),
    ("gpcdc.commit", '{"gxid": 3, "segments": [true]}', "malformed segment list"),
    ("gpcdc.commit", '{"gxid": 3, "segments": [0], "syncpoint": {}}', "malformed sync point"),
    ("gpcdc.commit", '{"gxid": 3, "segments": [0], "syncpoint": {"--1": 5}}', "malformed sync point"),
    ("gpcdc.commit", '{"gxid": 3, "segments": [0], "syncpoint": {"0": -5}}', "malformed sync point"),
    ("gpcdc.commit", '{"gxid": 3, "segments": [0], "syncpoint": [1]}', "malformed sync point"),
    ("gpcdc.ddl", '{"gxid": 3}', "no statement"),
])
def test_malformed_markers_are_named(prefix, content, message):
    with pytest.raises(MarkerError, match=message):
        markers.decode(prefix, content)
