"""The compiled row encoder (protocol/_rowjson.c) against the general path in Python:
whatever a tuple holds, it gives the same values or leaves the tuple to the general
path; and it takes the usual case itself."""

import math
import struct
from unittest import mock

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gpcdc_toolkit.protocol import (  # not built: `./dev setup` builds it (a C compiler)
    TransactionAssembler,
    _assembler,
    _rowjson,
    encoder_built,
)
from gpcdc_toolkit.protocol import _pgoutput as pg

from . import _pgwire as w

OIDS = {"t": 25, "i": 20, "b": 16, "f": 701}


def test_the_row_encoder_is_built_where_the_tests_run():
    """The general path alone would pass every other test here, slower: this one says
    that the compiled encoder is what capture runs (`./dev setup` builds it)."""
    assert _assembler._encode_tuple is _rowjson.encode and encoder_built()


def tuple_bytes(cells) -> bytes:
    """TupleData: cells are None ('n'), b"<u>" ('u'), or the value's bytes ('t')."""
    out = struct.pack(">h", len(cells))
    for cell in cells:
        out += b"n" if cell is None else b"u" if cell == b"<u>" else b"t" + struct.pack(">I", len(cell)) + cell
    return out


def general(kinds: str, names: list[str], payload: bytes, pos: int):
    """What the general path makes of the tuple: (image, key, end), or the error it raises."""
    try:
        values, end = pg._tuple(payload, pos)
    except (struct.error, IndexError, ValueError, pg.PgoutputError) as e:
        return e
    if len(values) != len(names) or pg.UNCHANGED_TOAST in values:
        return None
    try:
        image = {n: pg.convert(OIDS[k.lower()], v) for n, k, v in zip(names, kinds, values)}
    except ValueError as e:  # the assembler says it as a ProtocolError
        return e
    keys = [n for n, k in zip(names, kinds) if k.isupper()]
    return image, ({n: image[n] for n in keys} if keys else None), end


def same(a, b) -> bool:
    """Equal as JSON values, floats and their signs included."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) or isinstance(b, float):
        return type(a) is type(b) and (a == b and math.copysign(1, a) == math.copysign(1, b) or a != a and b != b)
    return type(a) is type(b) and a == b


_TEXTS = {
    "i": st.one_of(st.integers(-2**63, 2**63 - 1).map(str), st.sampled_from(["-0", "007", "+1", " 1", "1_0", "", "-",
                                                                           "12345678901234567890", "1e3"])),
    "f": st.one_of(st.floats(allow_nan=False).map(repr), st.floats(width=32, allow_nan=False).map(str),
                   st.sampled_from(["NaN", "Infinity", "-Infinity", "-0", "0", "1e+100", "1.5e-05", "1e400", "-1e-400",
                                    "01.5", "1.", ".5", "1e", "nan", "inf", "1_0.5", "0x10", "", "-", "1E5"])),
    "b": st.sampled_from(["t", "f", "x", "", "true", "T"]),
    "t": st.one_of(st.text(st.characters(codec="utf-8"), max_size=30),
                   st.sampled_from(['"', "\\", "\x00", "\x1f\x7f", "\u2028", '{"op":"c"}', "<toast>", "null"])),
}
_CELL = st.sampled_from("tifbTIFB").flatmap(lambda kind: st.tuples(st.just(kind), st.one_of(
    st.none(), _TEXTS[kind.lower()].map(str.encode),
    st.binary(max_size=12),  # bytes that may not be UTF-8, or not a number
    st.just(b"<u>"))))


@given(cells=st.lists(_CELL, min_size=1, max_size=6),
       names=st.lists(st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=8),
                      min_size=6, max_size=6, unique=True),
       damage=st.one_of(st.none(), st.integers(0, 200)), count=st.one_of(st.none(), st.integers(-2, 8)))
@example(cells=[("I", b"1"), ("t", b"\xed\xa0\x80")], names=list("abcdef"), damage=None, count=None)  # a surrogate
@example(cells=[("F", b"1e400")], names=list("abcdef"), damage=None, count=None)
def test_the_encoder_gives_the_general_paths_values_or_leaves_the_tuple_to_it(cells, names, damage, count):
    kinds = "".join(kind for kind, _ in cells)
    names = names[:len(cells)]
    body = tuple_bytes([cell for _, cell in cells])
    if count is not None:
        body = struct.pack(">h", count) + body[2:]
    if damage is not None:
        body = body[:damage]  # truncated anywhere
    payload = b"I\x00\x00\x00\x01N" + body + b"trailing"
    encoded = _rowjson.encode(payload, 6, tuple(orjson.dumps(n) + b":" for n in names), kinds.encode())
    expected = general(kinds, names, payload, 6)
    if encoded is None:
        return  # the general path's to decide
    assert not isinstance(expected, Exception) and expected is not None, (encoded, expected)
    image, key, end = encoded
    assert same(orjson.loads(image), expected[0])
    assert (key is None) == (expected[1] is None) and (key is None or same(orjson.loads(key), expected[1]))
    assert end == expected[2]


@given(st.lists(st.sampled_from("tifbTIB").flatmap(lambda kind: st.tuples(st.just(kind), st.one_of(
    st.none(), {"t": st.text(st.characters(codec="utf-8"), max_size=30), "i": st.integers(-2**63, 2**63 - 1).map(str),
                "b": st.sampled_from(["t", "f"]),
                "f": st.one_of(st.floats(allow_nan=False, allow_infinity=False).map(repr),
                               st.sampled_from(["NaN", "Infinity", "-0", "1e+100", "1.5e-05"]))}[kind.lower()]))),
    min_size=1, max_size=6))
def test_the_encoder_takes_every_value_a_server_prints(cells):
    """PostgreSQL's own output of these types never leaves the encoder's hands: else
    capture would run the general path without anyone noticing. (A float in the key
    does: see the next test.)"""
    kinds = "".join(kind for kind, _ in cells)
    names = [f"c{i}" for i in range(len(cells))]
    payload = b"I\x00\x00\x00\x01N" + tuple_bytes([None if v is None else v.encode() for _, v in cells])
    encoded = _rowjson.encode(payload, 6, tuple(orjson.dumps(n) + b":" for n in names), kinds.encode())
    assert encoded is not None
    assert same(orjson.loads(encoded[0]), general(kinds, names, payload, 6)[0])


def test_text_is_escaped_as_orjson_escapes_it():
    text = "".join(map(chr, range(0x20))) + '\x7f"\\/\u2028\U0010ffff é'
    payload = b"I\x00\x00\x00\x01N" + tuple_bytes([text.encode()])
    assert _rowjson.encode(payload, 6, (b'"v":',), b"t")[0] == b'{"v":' + orjson.dumps(text) + b"}"


def test_wrong_arguments_are_named():
    with pytest.raises(TypeError, match="encode"):
        _rowjson.encode("not bytes", 6, (), b"")
    with pytest.raises(ValueError, match="2 names but 1 kinds"):
        _rowjson.encode(b"I\x00\x00\x00\x01N\x00\x02", 6, (b'"a":', b'"b":'), b"t")


@pytest.mark.parametrize("values,error", [
    (["1"], "has 1 values, but its RELATION message 2 columns"),
    (["1", "x", "3"], "has 3 values, but its RELATION message 2 columns"),
    (["1e3", "x"], "a change of public.t: column 'id' holds '1e3', not a value of its type"),
])
def test_a_damaged_tuple_stops_the_general_path_with_what_is_wrong(values, error):
    a = TransactionAssembler(0, source_name="s", database="d")
    a.feed(w.relation(1, "public", "t", [("id", 20, True), ("v", 25, False)]))
    a.feed(w.begin(100, 7))
    with pytest.raises(_assembler.ProtocolError, match=error):
        a.feed(w.insert(1, values))


def test_the_assembler_hands_every_usual_row_change_to_the_encoder():
    calls = []
    real = _rowjson.encode

    def counted(*args):
        calls.append(args[1])
        return real(*args)

    with mock.patch.object(_assembler, "_encode_tuple", counted), \
            mock.patch.object(TransactionAssembler, "_row", side_effect=AssertionError("the general path")):
        a = TransactionAssembler(0, source_name="s", database="d")
        a.feed(w.relation(1, "public", "t", [("id", 20, True), ("v", 25, False), ("f", 701, False)]))
        out = []
        for payload in (w.begin(100, 7), w.insert(1, ["1", "a", "1.5"]), w.update(1, ["1", "b", "2"]),
                        w.update(1, ["2", "c", "-0"], old=["1", None, None]), w.delete(1, ["2", None, None]),
                        w.commit(100, 140)):
            out += a.feed(payload)
    assert len(calls) == 5  # the update with its old key: two tuples
    rows = [orjson.loads(o.value) for o in out if o.kind == "row"]
    assert [(r["op"], r["before"], r["after"]) for r in rows] == [
        ("c", None, {"id": 1, "v": "a", "f": 1.5}), ("u", None, {"id": 1, "v": "b", "f": 2.0}),
        ("u", {"id": 1, "v": None, "f": None}, {"id": 2, "v": "c", "f": -0.0}),
        ("d", {"id": 2, "v": None, "f": None}, None)]
    assert [type(r["after"]["f"]) for r in rows[:3]] == [float] * 3


@given(key=st.one_of(st.floats(allow_nan=False, allow_infinity=False).map(repr),
                     st.sampled_from(["1.5e-05", "1e-07", "1e+100", "-0", "2", "NaN", "-Infinity"])),
       number=st.integers(-2**63, 2**63 - 1).map(str))
def test_a_keys_bytes_are_the_same_on_both_paths(key, number):
    """Kafka partitions (the key dispatcher) and compacts by a key's bytes, and the
    audit groups by them: the rows of one key, whichever path encodes them (an update
    leaving a TOASTed value out takes the general one), carry the same key."""
    columns = [("f", 701, True), ("n", 20, True), ("v", 25, False)]
    keys = {}
    for compiled in (True, False):
        with mock.patch.object(_assembler, "_encode_tuple", _rowjson.encode if compiled else None):
            a = TransactionAssembler(0, source_name="s", database="d")
            a.feed(w.relation(1, "public", "t", columns))
        out = a.feed(w.begin(100, 7)) + a.feed(w.insert(1, [key, number, "x"])) + a.feed(w.commit(100, 140))
        keys[compiled] = [o.key for o in out if o.kind == "row"]
    assert keys[True] == keys[False] == [orjson.dumps({"f": pg.convert(701, key), "n": int(number)})]
