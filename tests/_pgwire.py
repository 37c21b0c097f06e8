"""Build pgoutput messages byte by byte, to test the decoder without a server."""

import struct

from gpcdc_toolkit.protocol._pgoutput import PG_EPOCH_US


def _s(text: str) -> bytes:
    return text.encode() + b"\0"


def _tuple(values) -> bytes:
    out = struct.pack(">h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v == "<toast>":
            out += b"u"
        else:
            data = v.encode()
            out += b"t" + struct.pack(">I", len(data)) + data
    return out


def begin(final_lsn, xid, ts_us=1_700_000_000_000_000):
    return b"B" + struct.pack(">QqI", final_lsn, ts_us - PG_EPOCH_US, xid)


def commit(commit_lsn, end_lsn, ts_us=1_700_000_000_000_000):
    return b"C" + struct.pack(">BQQq", 0, commit_lsn, end_lsn, ts_us - PG_EPOCH_US)


def relation(relid, schema, table, columns, identity="d"):
    """columns: (name, type_oid, is_key)"""
    out = b"R" + struct.pack(">I", relid) + _s(schema) + _s(table) + identity.encode() + struct.pack(">h", len(columns))
    for name, oid, key in columns:
        out += bytes([1 if key else 0]) + _s(name) + struct.pack(">Ii", oid, -1)
    return out


def insert(relid, values):
    return b"I" + struct.pack(">I", relid) + b"N" + _tuple(values)


def update(relid, new, old=None, old_kind="K"):
    out = b"U" + struct.pack(">I", relid)
    if old is not None:
        out += old_kind.encode() + _tuple(old)
    return out + b"N" + _tuple(new)


def delete(relid, old, old_kind="K"):
    return b"D" + struct.pack(">I", relid) + old_kind.encode() + _tuple(old)


def message(prefix, content: str, lsn=0, transactional=True):
    data = content.encode()
    return b"M" + bytes([1 if transactional else 0]) + struct.pack(">Q", lsn) + _s(prefix) + struct.pack(">I", len(data)) + data


def truncate(relids, cascade=False):
    return b"T" + struct.pack(">IB", len(relids), 1 if cascade else 0) + b"".join(struct.pack(">I", r) for r in relids)


def begin_prepare(prepare_lsn, end_lsn, xid, gid, ts_us=1_700_000_000_000_000):
    return b"b" + struct.pack(">QQqI", prepare_lsn, end_lsn, ts_us - PG_EPOCH_US, xid) + _s(gid)


def prepare(prepare_lsn, end_lsn, xid, gid, ts_us=1_700_000_000_000_000):
    return b"P" + struct.pack(">BQQqI", 0, prepare_lsn, end_lsn, ts_us - PG_EPOCH_US, xid) + _s(gid)


def commit_prepared(commit_lsn, end_lsn, xid, gid, ts_us=1_700_000_000_000_000):
    return b"K" + struct.pack(">BQQqI", 0, commit_lsn, end_lsn, ts_us - PG_EPOCH_US, xid) + _s(gid)


def rollback_prepared(prepare_end_lsn, end_lsn, xid, gid, ts_us=1_700_000_000_000_000):
    return b"r" + struct.pack(">BQQqqI", 0, prepare_end_lsn, end_lsn, ts_us - PG_EPOCH_US, ts_us - PG_EPOCH_US,
                              xid) + _s(gid)
