"""From a failed run to causes and fixes: what the investigate notebook reads.

A validation run's differing rows (``rows.parquet``) grouped by cause, each cause with
what to do about it (``validate._causes.REMEDIES``), the source events behind each row
and the statements of ``fix.sql``; or an audit run's findings grouped by rule, each
with its advice. Only the run's files are read: no server is needed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..audit._findings import SEVERITIES, advice
from ..config import Config
from ..errors import ConfigError
from ..validate._causes import REMEDIES

KINDS = ("validate", "audit")


def runs_dir(config: Config, kind: str) -> Path:
    return Path(config.work_dir) / kind / config.kafka.topic_prefix / "runs"


def _failed(run: Path, kind: str, fail_on: str) -> bool:
    summary = json.loads((run / "summary.json").read_text())
    if kind == "validate":
        return not summary.get("verified", True)
    worst = SEVERITIES.index(fail_on)
    return any(SEVERITIES.index(s["severity"]) <= worst for s in summary.get("summary", []))


def find_run(config: Config, kind: str, run: str = "latest") -> Path | None:
    """The run to investigate: ``run`` (a run's directory, or its name under the
    pipeline's runs), or "latest": the latest that failed (None when none did)."""
    if kind not in KINDS:
        raise ConfigError(f"start {kind!r} is neither of {', '.join(KINDS)}", fix="give start validate or audit")
    runs = runs_dir(config, kind)
    if run != "latest":
        path = Path(run) if Path(run).is_absolute() else runs / run
        if not (path / "summary.json").is_file():
            raise ConfigError(f"{path} is not a {kind} run (it has no summary.json)",
                              fix=f"give a directory under {runs}, or latest")
        return path
    fail_on = config.audit.fail_on if kind == "audit" else "error"
    failed = [p for p in sorted(runs.glob("*/summary.json")) if _failed(p.parent, kind, fail_on)]
    return failed[-1].parent if failed else None


@dataclass(frozen=True)
class Investigation:
    kind: str  # validate or audit
    run: Path | None  # None: no failed run to investigate
    summary: dict[str, Any]
    items: Any  # pandas: the differing rows (validate) or the findings (audit)

    @property
    def unexplained(self) -> int:
        """Rows whose cause is unexplained or not known (an audit's findings all have a rule)."""
        if self.kind != "validate" or not len(self.items):
            return 0
        return int((self.items["cause"].isna() | (self.items["cause"] == "unexplained")).sum())

    def causes(self) -> Any:
        """Per cause (validate) or rule (audit): how many, in which tables, and what to do."""
        import pandas as pd

        columns = ["cause", "rows", "tables", "what to do"] if self.kind == "validate" else \
            ["rule", "severity", "findings", "what to do"]
        if not len(self.items):
            return pd.DataFrame(columns=columns)
        if self.kind == "validate":
            items = self.items.assign(cause=self.items["cause"].fillna("not classified"))
            grouped = items.groupby("cause").agg(rows=("table", "size"), tables=("table", lambda t: ", ".join(sorted(set(t)))))
            grouped["what to do"] = [REMEDIES.get(None if c == "not classified" else c, "") for c in grouped.index]
            return grouped.reset_index()[columns].sort_values("rows", ascending=False, ignore_index=True)
        grouped = self.items.groupby(["rule", "severity"]).size().rename("findings").reset_index()
        grouped["what to do"] = [advice(r) for r in grouped["rule"]]
        rank = grouped["severity"].map(SEVERITIES.index)
        return grouped.assign(rank=rank).sort_values(["rank", "findings"], ascending=[True, False]) \
            .drop(columns="rank").reset_index(drop=True)[columns]

    def events(self) -> Any:
        """The source events behind each differing row: one row per event, with the row's
        table, key, kind and cause (empty for an audit)."""
        import pandas as pd

        columns = ["table", "key_text", "kind", "cause", "gxid", "segment", "offset", "commit_time", "applied"]
        out = [{"table": r["table"], "key_text": r["key_text"], "kind": r["kind"], "cause": r["cause"],
                "gxid": e["gxid"], "segment": e["segment"], "offset": e["offset"],
                "commit_time": pd.Timestamp(e["commit_ts_ms"], unit="ms", tz="UTC"), "applied": e["applied"]}
               for r in (self.items.to_dict("records") if self.kind == "validate" else [])
               for e in json.loads(r["events"] or "[]")]
        return pd.DataFrame(out, columns=columns)

    def fix(self) -> str:
        """The run's fix statements (validate), or "" when it has none."""
        path = self.run / "fix.sql" if self.run is not None else None
        return path.read_text() if path is not None and path.is_file() else ""

    def verdict(self) -> str:
        if self.run is None:
            return f"no failed {self.kind} run to investigate"
        if self.kind == "audit":
            return f"{len(self.items)} findings of {self.causes()['rule'].nunique()} rules, each with what to do"
        if not len(self.items):
            return "no row differs: the run failed on its expectations or the tables' definitions"
        if self.unexplained:
            return f"{self.unexplained} of {len(self.items)} differing rows are not explained by the pipeline's record"
        return f"every one of the {len(self.items)} differing rows is explained: {self.causes()['cause'].nunique()} causes"


def investigate(config: Config, kind: str = "validate", run: str = "latest") -> Investigation:
    """The failed ``kind`` run named by ``run`` (see :func:`find_run`), read."""
    import pandas as pd

    found = find_run(config, kind, run)
    if found is None:
        empty = pd.DataFrame(columns=["table", "kind", "key_text", "cause", "cause_detail", "events"]
                             if kind == "validate" else ["rule", "severity", "gxid", "evidence"])
        return Investigation(kind, None, {}, empty)
    summary = json.loads((found / "summary.json").read_text())
    if kind == "validate":
        rows = found / "rows.parquet"
        items = pd.read_parquet(rows) if rows.is_file() else pd.DataFrame(
            columns=["table", "kind", "key_text", "cause", "cause_detail", "events"])
    else:
        items = pd.read_parquet(found / "findings.parquet")
    return Investigation(kind, found, summary, items)
