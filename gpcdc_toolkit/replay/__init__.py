"""Replay: whole distributed transactions, in source order, applied exactly once."""

from ._apply import APPLIED, Applier, ApplyError, ApplyStats, apply_all
from ._order import Missing, Part, ReassemblyError, Reassembler, Record, Whole
from ._source import feed_from_kafka

__all__ = [
    "APPLIED", "Applier", "ApplyError", "ApplyStats", "apply_all",
    "Missing", "Part", "ReassemblyError", "Reassembler", "Record", "Whole",
    "feed_from_kafka",
]
