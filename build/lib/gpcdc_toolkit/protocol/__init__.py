"""The event protocol: pgoutput decoding, transaction assembly, WAL markers, start points,
and the Greenplum DDL syntax the stream carries (pure: no I/O library is imported)."""

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
from ._ddl import CreateTable, DdlError, parse_create_table
from ._markers import CommitRecord, DdlRecord, GxidMarker, MarkerError, OnePhaseMarker
from ._pgoutput import UNCHANGED_TOAST, PgoutputError, convert, parse
from ._startpoint import DistributedSnapshot, NodeStart, StartPoint, format_lsn, parse_lsn
from ._topics import Dispatcher, Topics

__all__ = [
    "COORDINATOR", "PROTOCOL_VERSION", "UNCHANGED", "Outbound", "ProtocolError", "TransactionAssembler",
    "is_pipeline_marker", "pipeline_marker",
    "CreateTable", "DdlError", "parse_create_table",
    "CommitRecord", "DdlRecord", "GxidMarker", "MarkerError", "OnePhaseMarker",
    "UNCHANGED_TOAST", "PgoutputError", "convert", "parse",
    "DistributedSnapshot", "NodeStart", "StartPoint", "format_lsn", "parse_lsn",
    "Dispatcher", "Topics",
]
