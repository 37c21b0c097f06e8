"""The compiled row reader (ingest/_rowevent.c) against the general path in Python:
whatever a message holds, the same row, or the message left to the general path; and
the row events capture writes taken by it."""

import json
from unittest import mock

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpcdc_toolkit.ingest import _rowevent, _rows  # not built: `./dev setup` builds it (a C compiler)
from gpcdc_toolkit.protocol import TransactionAssembler, _events

from . import _pgwire as w

HEAD = ("gpcdc.changes", 2, 41, 1_700_000_000_000)
SOURCE = {"version": 1, "connector": "gpcdc", "name": "s", "db": "d", "schema": "public", "table": "Order Items",
          "segment": 1, "txId": 4, "commit_lsn": 100, "ts_ms": 1_700_000_000_500, "gxid": 9, "seq": 3,
          "one_phase": False}
EVENT = {"before": {"id": 1}, "after": {"id": 2, "ok": True, "x": 1.5, "n": None, "s": "op"}, "source": SOURCE,
         "op": "u", "ts_ms": 1, "transaction": {"id": "1:4", "total_order": 3, "data_collection_order": 1}}


def test_the_row_reader_is_built_where_the_tests_run():
    """The general path alone would pass every other test here, slower: this one says
    that the compiled reader is what Spark's readers run (`./dev setup` builds it)."""
    assert _rows._row_event is _rowevent.row


def general(key, value):
    with mock.patch.object(_rows, "_row_event", None):
        return _rows.to_row(*HEAD, key, value)


def test_a_usual_row_event_is_read_by_the_compiled_reader_as_by_the_general_path():
    value = orjson.dumps(EVENT)
    row = _rowevent.row(*HEAD, b'{"id":2}', orjson.loads(value))
    assert row is not None and repr(row) == repr(general(b'{"id":2}', value))
    assert dict(zip((n for n, _ in _rows.COLUMNS), row))["after"] == {"id": "2", "ok": "true", "x": "1.5", "n": None,
                                                                       "s": "op"}


def test_every_row_event_capture_writes_takes_the_compiled_reader():
    a = TransactionAssembler(0, source_name="s", database="d")
    a.feed(w.relation(1, "public", "t", [("id", 20, True), ("v", 25, False), ("f", 701, False)]))
    out = []
    for payload in (w.begin(100, 7), w.insert(1, ["1", "a", "1.5"]), w.update(1, ["1", "b", "2"]),
                    w.update(1, ["2", "<toast>", "-0"], old=["1", None, None]), w.delete(1, ["2", None, None]),
                    w.commit(100, 140)):
        out += a.feed(payload)
    rows = [o for o in out if o.kind == "row"]
    assert len(rows) == 4 and b'"unchanged":["v"]' in rows[2].value  # an update that left a TOASTed value out
    for o in rows:
        row = _rowevent.row(*HEAD, o.key, orjson.loads(o.value))
        assert row is not None, o.value
        assert repr(row) == repr(general(o.key, o.value))


def test_the_fields_it_passes_unchecked_are_the_protocols_unchecked_ones():
    """The reader takes the envelope's ts_ms and transaction as the protocol does, without
    a look: were the protocol to check them, the reader would have to as well."""
    assert not {"ts_ms", "transaction"} & _events._TYPES.keys()
    assert set(_events._SOURCE_TYPES) == {"segment", "gxid", "txId", "commit_lsn", "ts_ms", "schema", "table", "seq",
                                          "one_phase"}  # the nine the reader checks


BOUNDS = [2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**63 - 1, 2**63, -2**63, -2**63 - 1, 2**64, 0]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from(BOUNDS),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4),
                    st.sampled_from(["row", "BEGIN", "unchanged", "op", "null", '"', "\x00"]))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                          max_size=3), max_leaves=5)
DROP = object()


def altered(base, names, values):
    """``base`` with up to two of ``names`` replaced, added or dropped."""
    return st.lists(st.tuples(st.sampled_from(names), st.just(DROP) | values), max_size=2).map(
        lambda changes: {k: v for k, v in {**base, **dict(changes)}.items() if v is not DROP})


IMAGES = (st.none() | st.dictionaries(st.text(max_size=4), SCALARS, max_size=4)
          | st.dictionaries(st.text(max_size=4), JSON, max_size=2))
MESSAGES = st.builds(
    lambda top, source, before, after: {**top, **{k: v for k, v in (("source", source), ("before", before),
                                                                    ("after", after)) if top.get(k) is EVENT[k]}},
    altered(EVENT, ["op", "source", "before", "after", "unchanged", "ts_ms", "transaction", "segment", "resolved",
                    "status", "type", "segments", "prepared", "x", "ü"], JSON),
    altered(SOURCE, [*_events._SOURCE_TYPES, "version", "Segment", "séq"], JSON), IMAGES, IMAGES)
KEYS = st.none() | st.binary(max_size=6) | st.text(max_size=4).map(str.encode)


@settings(max_examples=500)
@given(message=MESSAGES, key=KEYS)
@example(message=EVENT, key=b"\xff")  # a key that is not UTF-8: a corrupt record, on both paths
@example(message={**EVENT, "unchanged": ["v", 1]}, key=None)
@example(message={**EVENT, "source": {**SOURCE, "segment": 2**31}}, key=None)
@example(message={**EVENT, "source": {**SOURCE, "gxid": True}}, key=None)
@example(message={**EVENT, "after": {"v": [1, {"a": 2}]}}, key=None)
def test_any_message_reads_the_same_on_both_paths(message, key):
    """Compared by repr: 1 and True, 1 and 1.0, an image's key order all tell apart."""
    value = json.dumps(message).encode()  # integers beyond 64 bits too: orjson refuses them, on both paths
    assert repr(_rows.to_row(*HEAD, key, value)) == repr(general(key, value))
