"""Replay: whole distributed transactions, in source order (the ordering core so far)."""

from ._order import Missing, Part, ReassemblyError, Reassembler, Record, Whole

__all__ = ["Missing", "Part", "ReassemblyError", "Reassembler", "Record", "Whole"]
