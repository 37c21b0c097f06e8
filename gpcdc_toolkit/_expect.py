"""great-expectations 1.x, as the audit and the validation run it: suites kept as JSON
in ``expectations/`` (bodies as great-expectations reads them), validated on Spark
DataFrames in an ephemeral context, each expectation's outcome in plain values.

A suite's ``meta.gpcdc.frame`` says what it validates: the audit's ``events`` or
``tables`` (see ``audit/_expectations``), or ``target``: a target table after
validation, named by ``meta.gpcdc.table`` as PostgreSQL prints it
(``public."Order Items"``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError

_SEVERITY = {"critical": "error", "warning": "warning", "info": "info"}
FRAMES = ("events", "tables", "target")
DEFAULT_DIR = Path(__file__).resolve().parents[1] / "expectations"  # in a source checkout


@dataclass(frozen=True)
class Suite:
    name: str
    frame: str  # one of FRAMES
    marked_only: bool
    body: dict[str, Any]  # the JSON, as great-expectations reads it
    table: str | None = None  # a target suite's table


def load_suites(directory: Path | None = None) -> list[Suite]:
    """Every ``*.json`` suite of ``directory`` (default: the checkout's ``expectations/``)."""
    directory = directory or DEFAULT_DIR
    files = sorted(directory.glob("*.json")) if directory.is_dir() else []
    if not files:
        raise ConfigError(f"no expectation suites (*.json) in {directory}",
                          fix="set audit.expectations_dir to the directory of the suites (expectations/)")
    suites = []
    for file in files:
        try:
            body = json.loads(file.read_text())
            meta = body.get("meta", {}).get("gpcdc", {})
            frame, table = meta.get("frame", "events"), meta.get("table")
        except (ValueError, AttributeError):
            raise ConfigError(f"{file} is not a suite: a JSON object with name, expectations and meta.gpcdc.frame",
                              fix="repair or remove the file") from None
        if frame not in FRAMES:
            raise ConfigError(f"{file}: meta.gpcdc.frame is {frame!r}", fix=f"use one of {', '.join(FRAMES)}")
        if frame == "target" and not isinstance(table, str):
            raise ConfigError(f"{file}: a target suite names no table (meta.gpcdc.table)",
                              fix='name it as PostgreSQL prints it, e.g. "public.wl_accounts"')
        suites.append(Suite(body.get("name", file.stem), frame, meta.get("when") == "marked", body, table))
    return suites


@dataclass(frozen=True)
class Outcome:
    suite: str
    expectation: str  # its type and column(s): expect_column_values_to_be_unique(id)
    success: bool
    severity: str  # error, warning or info (great-expectations' critical, warning, info)
    evidence: str  # how many values were unexpected, and a few of them; or what was observed


class Expectations:
    """An ephemeral great-expectations context with one Spark data source."""

    def __init__(self) -> None:
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        # Some of its modules set their own logger's level: quiet each one, not only the parent.
        for name in [n for n in logging.root.manager.loggerDict if n.startswith("great_expectations")]:
            logging.getLogger(name).setLevel(logging.ERROR)
        self._gx = gx
        context = gx.get_context(mode="ephemeral")
        context.variables.progress_bars = ProgressBarsConfig(globally=False)
        # Not persisted by great-expectations: it never releases what it persists, and
        # the frames given to it are materialized by their owner.
        self._source = context.data_sources.add_spark(name="gpcdc", persist=False)
        self._assets = 0

    def evaluate(self, name: str, body: dict[str, Any], frame: Any) -> list[Outcome]:
        """Every expectation of the suite ``body`` on the DataFrame ``frame``. Raises
        ConfigError when the suite does not load whole or an expectation cannot be
        evaluated (a column it names is not there)."""
        suite = self._gx.ExpectationSuite(**body)
        if len(suite.expectations) != len(body.get("expectations", [])):
            raise ConfigError(f"suite {name}: great-expectations kept {len(suite.expectations)} of its "
                              f"{len(body.get('expectations', []))} expectations",
                              fix="check the expectation types against great-expectations 1.x")
        self._assets += 1  # asset names are unique within a context
        batch = (self._source.add_dataframe_asset(name=f"{name}-{self._assets}")
                 .add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame}))
        out = []
        for result in batch.validate(suite, result_format="SUMMARY").results:
            config = result.expectation_config
            assert config is not None  # a suite's results name their expectations
            kwargs = config.kwargs
            subject = kwargs.get("column") or ", ".join(kwargs.get("column_list") or [])
            if (result.exception_info or {}).get("raised_exception"):
                raise ConfigError(f"suite {name}: {config.type}({subject}) could not be evaluated: "
                                  f"{result.exception_info.get('exception_message')}",
                                  fix="correct the expectation in its JSON file")
            r = result.result
            if "unexpected_count" in r:
                evidence = (f"{r.get('unexpected_count')} of {r.get('element_count')} values unexpected"
                            + (f", e.g. {r.get('partial_unexpected_list', [])[:5]}" if r.get("unexpected_count") else ""))
            else:
                evidence = f"observed {r.get('observed_value')}"
            severity = _SEVERITY.get(str(getattr(config, "severity", "critical")).split(".")[-1].lower(), "error")
            out.append(Outcome(name, f"{config.type}({subject})", bool(result.success), severity, evidence))
        return out
