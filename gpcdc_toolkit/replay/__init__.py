"""Replay: whole distributed transactions, in source order, applied exactly once."""

from ._apply import APPLIED, STATE, Applier, ApplyError, ApplyStats, Checkpoint, DdlRefusedError, ReplayState
from ._ddl_policy import CheckedDdl, DdlRefused, check_ddl
from ._load import create_statement, load_rows, prepare_target
from ._legacy import SegmentOrder
from ._order import Missing, Part, ReassemblyError, Reassembler, Record, Whole, resume_point
from ._progress import ProgressBar, StatusLine
from ._replayer import MissingPartError, Progress, Replayer, ReplaySettings
from ._source import Framer, LegacyStreamError, StreamError, Watermark

__all__ = [
    "APPLIED", "STATE", "Applier", "ApplyError", "ApplyStats", "Checkpoint", "DdlRefusedError", "ReplayState",
    "CheckedDdl", "DdlRefused", "check_ddl",
    "create_statement", "load_rows", "prepare_target",
    "SegmentOrder", "Missing", "Part", "ReassemblyError", "Reassembler", "Record", "Whole", "resume_point",
    "ProgressBar", "StatusLine", "MissingPartError", "Progress", "Replayer", "ReplaySettings",
    "Framer", "LegacyStreamError", "StreamError", "Watermark",
]
