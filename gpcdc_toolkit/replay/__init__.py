"""Replay: whole distributed transactions, in source order, applied exactly once.

The pure core (framing, ordering, folding, the DDL policy) is imported with the
package; what drives it against Kafka and a target loads on first use, so that the
core can be used, and tested, without psycopg or confluent-kafka.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ..config import ReplaySettings
from ..errors import StreamError
from ._compact import TableChanges, compact
from ._ddl_policy import CheckedDdl, DdlRefused, check_ddl
from ._legacy import SegmentOrder
from ._order import Missing, Part, Reassembler, ReassemblyError, Record, Whole, resume_point
from ._source import Framer, LegacyStreamError, MalformedMessageError, Spill, Watermark

__getattr__ = lazy_exports(__name__, {
    "_apply": ("APPLIED", "STATE", "Applier", "ApplyError", "ApplyStats", "Checkpoint", "DdlRefusedError",
               "ReplayState"),
    "_load": ("create_statement", "load_rows", "prepare_target"),
    "_progress": ("ProgressBar", "StatusLine"),
    "_replayer": ("MissingPartError", "Progress", "Replayer"),
})


if TYPE_CHECKING:
    from ._apply import APPLIED, STATE, Applier, ApplyError, ApplyStats, Checkpoint, DdlRefusedError, ReplayState
    from ._load import create_statement, load_rows, prepare_target
    from ._progress import ProgressBar, StatusLine
    from ._replayer import MissingPartError, Progress, Replayer

__all__ = [
    "TableChanges", "compact", "CheckedDdl", "DdlRefused", "check_ddl",
    "SegmentOrder", "Missing", "Part", "ReassemblyError", "Reassembler", "Record", "Whole", "resume_point",
    "Framer", "LegacyStreamError", "MalformedMessageError", "Spill", "StreamError", "Watermark",
    "APPLIED", "STATE", "Applier", "ApplyError", "ApplyStats", "Checkpoint", "DdlRefusedError", "ReplayState",
    "create_statement", "load_rows", "prepare_target", "ProgressBar", "StatusLine",
    "MissingPartError", "Progress", "Replayer", "ReplaySettings",
]
