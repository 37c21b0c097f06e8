"""The transaction browser: one distributed transaction whole, as the stream holds it.

:class:`TransactionBrowser` works on pandas frames (the columns of
``gpcdc_toolkit.ingest``'s rows; findings in the audit's schema) and does no I/O, so
that it is tested without servers; ``from_spark`` reads them from Spark DataFrames, and
:func:`browse` is the widget over it: pick a gxid, a time window, a table or a finding's
rule, and see the transaction's record, its parts per segment with offsets and commit
times, its rows, where it sits in source order, and the findings that name it."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

PART_COLUMNS = ["segment", "xid", "one_phase", "commit_ts", "commit_lsn", "partition", "begin_offset",
                "end_offset", "rows", "declared_rows"]
ROW_COLUMNS = ["segment", "seq", "table", "op", "key", "before", "after", "partition", "offset"]


@dataclass(frozen=True)
class TransactionView:
    gxid: int
    record: dict[str, Any] | None  # the coordinator's commit record; None: one-phase, or not (yet) captured
    position: int | None  # 1-based, in source order (the commit records' order); None without a record
    of: int  # commit records in the window
    previous: int | None  # the gxids committed just before and after, in source order
    following: int | None
    parts: Any  # pandas, PART_COLUMNS: one row per segment part
    rows: Any  # pandas, ROW_COLUMNS
    findings: Any  # pandas, the audit's findings that name this gxid

    def lines(self) -> list[str]:
        if self.record is None:
            where = "no distributed commit record (a one-phase transaction, or its record is not in the window)"
        else:
            where = (f"commit record at offset {self.record['offset']} of partition {self.record['partition']}, "
                     f"number {self.position} of {self.of} in source order, committed {self.record['commit_ts']}")
        declared = sorted(int(s) for s in self.record["segments"]) \
            if self.record is not None and self.record.get("segments") is not None else None
        present = sorted(int(s) for s in self.parts["segment"])
        missing = sorted(set(declared) - set(present)) if declared is not None else []
        out = [f"gxid {self.gxid}: {where}",
               f"parts on segments {present}" + (f" of {declared}" if declared is not None else "")
               + (f"; MISSING on {missing}" if missing else "") + f"; {len(self.rows)} row events",
               f"findings naming it: {len(self.findings)}"]
        if self.position is not None:
            out.append("in source order after " + (f"gxid {self.previous}" if self.previous is not None else
                                                    "nothing in the window")
                       + " and before " + (f"gxid {self.following}" if self.following is not None else
                                           "nothing in the window"))
        return out

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in self.lines())
        tables = [("Parts per segment", self.parts), ("Rows", self.rows.head(200)), ("Findings", self.findings)]
        body = "".join(f"<h4>{title}</h4>{frame.to_html(index=False)}" for title, frame in tables if len(frame))
        return f"<div><ul>{items}</ul>{body}</div>"


class TransactionBrowser:
    """The transactions of a window of the stream.

    ``changes``: the changes topic's messages (row, begin and end events matter);
    ``records``: the coordinator's commit records; ``findings``: an audit's findings."""

    def __init__(self, changes: Any, records: Any, findings: Any = None) -> None:
        import pandas as pd

        needed = ["kind", "gxid", "xid", "commit_ts", "commit_lsn", "one_phase", "event_count", "table_schema",
                  "table_name", *ROW_COLUMNS]
        changes = changes.reindex(columns=list(dict.fromkeys([*changes.columns, *needed])))
        self.changes = changes[changes["kind"].isin(["row", "begin", "end"])].copy()
        self.changes["table"] = self.changes["table_schema"].fillna("") + "." + self.changes["table_name"].fillna("")
        commits = records[records["kind"] == "commit"]
        self.records = commits.sort_values(["partition", "offset"]).drop_duplicates("gxid").reset_index(drop=True)
        self.findings = findings if findings is not None else pd.DataFrame(columns=["rule", "severity", "gxid"])
        self._order = {int(g): i for i, g in enumerate(self.records["gxid"])}

    def with_findings(self, more: Any) -> TransactionBrowser:
        """The browser with ``more`` findings (pandas, the same columns: e.g. a
        validation's differences, ``gpcdc_toolkit.validate.latest_differences``)."""
        import pandas as pd

        if len(more):
            self.findings = pd.concat([self.findings, more], ignore_index=True)
        return self

    @classmethod
    def from_spark(cls, changes: Any, transactions: Any, findings: Any = None, *,
                   minutes: float | None = 15.0) -> TransactionBrowser:
        """From Spark DataFrames, read into the driver: the last ``minutes`` of source
        commit time the stream holds (None: all of it, which must fit in the driver)."""
        from pyspark.sql import functions as F

        events = changes.where(changes.kind.isin("row", "begin", "end"))
        if minutes is not None:
            (latest,) = events.agg(F.max("commit_ts")).first() or (None,)
            if latest is not None:
                since = F.lit(latest) - F.expr(f"make_dt_interval(0, 0, 0, {float(minutes) * 60})")
                events = events.where(F.col("commit_ts") >= since)
                transactions = transactions.where(F.col("commit_ts") >= since)
        return cls(events.toPandas(), transactions.toPandas(), findings.toPandas() if findings is not None else None)

    def catalog(self) -> Any:
        """One row per transaction in the window, for finding one: gxid, first commit,
        segments, rows, tables, findings naming it; in source order, then by commit time."""
        import pandas as pd

        parts = self.changes[self.changes["gxid"].notna()]
        rows = parts[parts["kind"] == "row"]
        out = pd.DataFrame({"gxid": self.gxids()})
        if not len(out):
            return out.assign(committed=[], segments=[], rows=[], tables=[], findings=[])
        out["committed"] = out["gxid"].map(parts.groupby("gxid")["commit_ts"].min())
        out["segments"] = out["gxid"].map(parts.groupby("gxid")["segment"].nunique()).fillna(0).astype(int)
        out["rows"] = out["gxid"].map(rows.groupby("gxid").size()).fillna(0).astype(int)
        out["tables"] = out["gxid"].map(rows.groupby("gxid")["table"].agg(lambda t: ", ".join(sorted(set(t))))).fillna("")
        out["findings"] = out["gxid"].map(self.findings.groupby("gxid").size()).fillna(0).astype(int)
        return out

    @staticmethod
    def label(entry: Any) -> str:
        """A catalog row as the gxid list shows it."""
        committed = str(entry["committed"])[:23] if entry["committed"] is not None and str(entry["committed"]) != "NaT" \
            else "no part yet"
        return (f"{entry['gxid']} · {committed} · {entry['segments']} segments · {entry['rows']} rows"
                + (f" · {entry['tables']}" if entry["tables"] else "")
                + (f" · {entry['findings']} findings" if entry["findings"] else ""))

    @property
    def tables(self) -> list[str]:
        rows = self.changes[self.changes["kind"] == "row"]
        return sorted(rows["table"].dropna().unique().tolist())

    @property
    def rules(self) -> list[str]:
        return sorted(self.findings["rule"].dropna().unique().tolist())

    def gxids(self, *, start: Any = None, end: Any = None, table: str | None = None,
              rule: str | None = None) -> list[int]:
        """The gxids in the window (source commit time ``start`` <= t < ``end``), touching
        ``table``, named by a finding of ``rule``: those with a record in source order,
        then the others by commit time."""
        import pandas as pd

        parts = self.changes[self.changes["gxid"].notna()]
        if start is not None:
            parts = parts[parts["commit_ts"] >= pd.Timestamp(start)]
        if end is not None:
            parts = parts[parts["commit_ts"] < pd.Timestamp(end)]
        if table:
            parts = parts[parts["gxid"].isin(parts.loc[parts["table"] == table, "gxid"])]
        chosen = {int(g) for g in parts["gxid"].unique()}
        if start is None and end is None and not table:
            chosen |= set(self._order)
        if rule:
            named = self.findings.loc[self.findings["rule"] == rule, "gxid"].dropna()
            chosen &= {int(g) for g in named}
        first_commit = {int(g): str(t) for g, t in parts.groupby("gxid")["commit_ts"].min().items() if pd.notna(t)}
        return sorted(chosen, key=lambda g: (g not in self._order, self._order.get(g, 0), first_commit.get(g, ""), g))

    def widest(self) -> int | None:
        """The latest committed transaction among those that wrote rows with parts on the
        most segments (a sync point's lists every segment and writes nothing)."""
        wrote = self.changes.loc[self.changes["kind"] == "row", "gxid"].dropna().unique()
        records = self.records[self.records["gxid"].isin(wrote)]
        if not len(records):
            return None
        spans = records["segments"].map(lambda s: len(s) if s is not None else 0)
        widest = records[spans == spans.max()]
        return int(widest["gxid"].iloc[-1])

    def view(self, gxid: int) -> TransactionView:
        import pandas as pd

        mine = self.changes[self.changes["gxid"] == gxid]
        position = self._order.get(gxid)
        record = self.records.iloc[position].to_dict() if position is not None else None
        parts = []
        for segment, events in mine.groupby("segment"):
            begin, end = events[events["kind"] == "begin"], events[events["kind"] == "end"]
            rows = events[events["kind"] == "row"]
            first = begin.iloc[0] if len(begin) else events.iloc[0]
            flags = events["one_phase"].dropna()
            parts.append({"segment": int(segment), "xid": first["xid"],
                          "one_phase": bool(flags.iloc[0]) if len(flags) else None,
                          "commit_ts": first["commit_ts"], "commit_lsn": first["commit_lsn"],
                          "partition": int(first["partition"]),
                          "begin_offset": int(begin["offset"].min()) if len(begin) else None,
                          "end_offset": int(end["offset"].max()) if len(end) else None, "rows": len(rows),
                          "declared_rows": int(end["event_count"].iloc[0]) if len(end) and
                          pd.notna(end["event_count"].iloc[0]) else None})
        rows = mine[mine["kind"] == "row"].sort_values(["segment", "seq"])[ROW_COLUMNS].reset_index(drop=True)
        rows = rows.astype({"segment": "Int64", "seq": "Int64", "partition": "Int64", "offset": "Int64"})
        named = self.findings[self.findings["gxid"] == gxid].reset_index(drop=True)
        gxids = self.records["gxid"]
        return TransactionView(
            gxid, record, None if position is None else position + 1, len(self.records),
            int(gxids.iloc[position - 1]) if position else None,
            int(gxids.iloc[position + 1]) if position is not None and position + 1 < len(gxids) else None,
            pd.DataFrame(parts, columns=PART_COLUMNS), rows, named)


PAGE = 200  # transactions listed at a time: narrow the search to see others


def browse(browser: TransactionBrowser) -> Any:
    """The widget: filters (time window, table, finding rule, a search of the list), a
    list of the matching transactions (gxid, commit time, size, tables), and the view."""
    import ipywidgets as widgets
    from IPython.display import display

    start = widgets.Text(description="from", placeholder="2026-01-01 12:00 (UTC)")
    end = widgets.Text(description="to", placeholder="(open)")
    table = widgets.Dropdown(description="table", options=["(any)", *browser.tables])
    rule = widgets.Dropdown(description="finding", options=["(any)", *browser.rules])
    search = widgets.Text(description="search", placeholder="part of a gxid, a time or a table")
    gxid = widgets.Select(description="gxid", options=[], rows=10, layout=widgets.Layout(width="95%"))
    count = widgets.Label()
    shown = widgets.Output()
    catalog = browser.catalog()
    labels = {int(row["gxid"]): browser.label(row) for _, row in catalog.iterrows()}

    def refilter(_change: Any = None) -> None:
        try:
            found = browser.gxids(start=start.value or None, end=end.value or None,
                                  table=None if table.value == "(any)" else table.value,
                                  rule=None if rule.value == "(any)" else rule.value)
        except ValueError as e:  # a time that does not parse
            with shown:
                shown.clear_output()
                print(f"cannot filter: {e}")
            return
        wanted = search.value.strip().lower()
        found = [g for g in found if wanted in labels.get(g, str(g)).lower()]
        gxid.options = [(labels.get(g, str(g)), g) for g in found[:PAGE]]
        count.value = (f"{len(found)} transactions" if len(found) <= PAGE else
                       f"{len(found)} transactions, the first {PAGE} listed: narrow the search")

    def show(_change: Any = None) -> None:
        with shown:
            shown.clear_output()
            if gxid.value is not None:
                display(browser.view(int(gxid.value)))

    for control in (start, end, table, rule, search):
        control.observe(refilter, names="value")
    gxid.observe(show, names="value")
    refilter()
    return widgets.VBox([widgets.HBox([start, end]), widgets.HBox([table, rule]), widgets.HBox([search, count]), gxid,
                         shown])
