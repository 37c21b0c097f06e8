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
    """``base`` with up to two fields (of the strategy ``names``) replaced, added or dropped."""
    return st.lists(st.tuples(names, st.just(DROP) | values), max_size=2).map(
        lambda changes: {k: v for k, v in {**base, **dict(changes)}.items() if v is not DROP})


IMAGES = (st.none() | st.dictionaries(st.text(max_size=4), SCALARS, max_size=4)
          | st.dictionaries(st.text(max_size=4), JSON, max_size=2))
UNCHANGED = st.lists(st.text(max_size=3), max_size=3) | st.lists(st.text(max_size=3) | SCALARS, max_size=3)


def assembled(top, source, before, after, order):
    """``top`` with the source and images it kept as they were replaced by ``source``,
    ``before`` and ``after``, its fields in ``order``."""
    inner = {"source": source, "before": before, "after": after}
    return dict(order([(k, inner[k] if k in inner and v is EVENT[k] else v) for k, v in top.items()]))


MESSAGES = st.builds(
    assembled,
    # The row event's own fields half the time; else any the protocol knows, or not.
    altered(EVENT, st.sampled_from([*EVENT, "unchanged"]) | st.sampled_from([*_events._TYPES, "status", "x", "Op"]),
            JSON | UNCHANGED),
    altered(SOURCE, st.sampled_from(list(_events._SOURCE_TYPES)) | st.sampled_from([*_events._TYPES, "Segment", "ü"]),
            JSON),
    IMAGES, IMAGES, st.sampled_from([list, reversed, sorted]))
KEYS = st.none() | st.binary(max_size=6) | st.text(max_size=4).map(str.encode)


def test_a_value_of_a_subclass_is_left_to_the_general_path():
    """orjson makes no subclasses; converting one to text could run Python code that
    changes the message under the reader, which leaves it alone."""

    class Odd(int):
        def __str__(self):
            message["source"] = None
            return "odd"

    message = {**orjson.loads(orjson.dumps(EVENT)), "before": {"a": Odd(1)}}
    assert _rowevent.row(*HEAD, None, message) is None
    message = {**orjson.loads(orjson.dumps(EVENT)), "after": {"a": type("Text", (str,), {})("x")}}
    assert _rowevent.row(*HEAD, None, message) is None


TYPED = [None, True, False, 0, -1, 1.0, -0.0, "", "1", [], ["v"], [1], {}, {"a": 1}, 2**31 - 1, 2**31, -2**31,
         -2**31 - 1, 2**63 - 1, 2**63, -2**63, -2**63 - 1]


def test_every_field_holding_a_value_of_every_kind_reads_the_same_on_both_paths():
    """Each field of the row event and of its source, in turn, given a value of each
    JSON type and each integer bound the protocol draws, the rest of the event as usual:
    the combinations a generated message meets only by chance."""
    differ = []
    for holder, names in ((EVENT, [*EVENT, "unchanged", "xid", "segments"]), (SOURCE, [*SOURCE, "xid", "number"])):
        for name in names:
            for value in TYPED:
                changed = {**holder, name: value}
                message = changed if holder is EVENT else {**EVENT, "source": changed}
                encoded = json.dumps(message).encode()
                if repr(_rows.to_row(*HEAD, b"{}", encoded)) != repr(general(b"{}", encoded)):
                    differ.append((name, value))
    assert differ == []


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
