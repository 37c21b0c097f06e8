"""The event protocol: pgoutput decoding, transaction assembly, start points (pure)."""

from ._assembler import (
    COORDINATOR,
    PROTOCOL_VERSION,
    UNCHANGED,
    Outbound,
    ProtocolError,
    TransactionAssembler,
    is_pipeline_marker,
    pipeline_marker,
)
from ._pgoutput import UNCHANGED_TOAST, PgoutputError, convert, parse
from ._startpoint import DistributedSnapshot, NodeStart, StartPoint, format_lsn, parse_lsn
from ._topics import Dispatcher, Topics

__all__ = [
    "COORDINATOR", "PROTOCOL_VERSION", "UNCHANGED", "Outbound", "ProtocolError", "TransactionAssembler",
    "is_pipeline_marker", "pipeline_marker",
    "UNCHANGED_TOAST", "PgoutputError", "convert", "parse",
    "DistributedSnapshot", "NodeStart", "StartPoint", "format_lsn", "parse_lsn",
    "Dispatcher", "Topics",
]
