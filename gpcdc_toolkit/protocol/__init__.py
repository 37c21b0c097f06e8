"""The event protocol: the wire format (``_events``: the one place the message kinds and
their constants are defined), pgoutput decoding, transaction assembly, WAL markers, start
points, and the Greenplum DDL syntax the stream carries (pure: no I/O library is imported)."""

from ._assembler import (
    Outbound,
    ProtocolError,
    TransactionAssembler,
    UnknownNodesError,
    encoder_built,
    lost_marker,
    numbering_of,
    pipeline_marker,
    repaired_marker,
    shows_unnumbered,
)
from ._ddl import CreateTable, DdlError, parse_create_table
from ._events import (
    COORDINATOR,
    KINDS,
    PROTOCOL_VERSION,
    UNCHANGED,
    CoordinatorRecord,
    Kind,
    PipelineMarker,
    RowEvent,
    Source,
    TransactionEvent,
    Watermark,
    is_pipeline_marker,
    kind_of,
    lost_reason,
    problem_of,
)
from ._markers import CommitRecord, DdlRecord, GxidMarker, MarkerError, OnePhaseMarker
from ._pgoutput import DECODING_SETTINGS, READING_SETTINGS, UNCHANGED_TOAST, PgoutputError, convert, parse
from ._startpoint import DistributedSnapshot, LocalSnapshot, NodeStart, Repair, StartPoint, format_lsn, parse_lsn
from ._topics import Dispatcher, Topics

__all__ = [
    "COORDINATOR", "PROTOCOL_VERSION", "UNCHANGED", "Outbound", "ProtocolError", "TransactionAssembler", "UnknownNodesError",
    "encoder_built", "pipeline_marker", "lost_marker", "numbering_of", "repaired_marker", "shows_unnumbered",
    "KINDS", "CoordinatorRecord", "Kind", "PipelineMarker", "RowEvent", "Source",
    "TransactionEvent", "Watermark", "is_pipeline_marker", "kind_of", "lost_reason", "problem_of",
    "CreateTable", "DdlError", "parse_create_table",
    "CommitRecord", "DdlRecord", "GxidMarker", "MarkerError", "OnePhaseMarker",
    "DECODING_SETTINGS", "READING_SETTINGS", "UNCHANGED_TOAST", "PgoutputError", "convert", "parse",
    "DistributedSnapshot", "LocalSnapshot", "NodeStart", "Repair", "StartPoint", "format_lsn", "parse_lsn",
    "Dispatcher", "Topics",
]
