"""The stream's invariants as great-expectations suites, kept as JSON in
``expectations/``, validated on the audit's DataFrames; a failed expectation is a
finding whose rule names it.

A suite's ``meta.gpcdc.frame`` says what it validates: ``events`` (every message,
duplicates removed) or ``tables`` (one row per table, ``keys`` all, none or mixed);
``meta.gpcdc.when = "marked"`` keeps it to streams written with the gxid markers.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..errors import ConfigError
from ._findings import FINDING_COLUMNS
from ._rules import Stream

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "expectations"  # in a source checkout
_SEVERITY = {"critical": "error", "warning": "warning", "info": "info"}


@dataclass(frozen=True)
class Suite:
    name: str
    frame: str  # events or tables
    marked_only: bool
    body: dict[str, Any]  # the JSON, as great-expectations reads it


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
            frame = meta.get("frame", "events")
        except (ValueError, AttributeError):
            raise ConfigError(f"{file} is not a suite: a JSON object with name, expectations and meta.gpcdc.frame",
                              fix="repair or remove the file") from None
        if frame not in ("events", "tables"):
            raise ConfigError(f"{file}: meta.gpcdc.frame is {frame!r}", fix="use events or tables")
        suites.append(Suite(body.get("name", file.stem), frame, meta.get("when") == "marked", body))
    return suites


def tables_frame(stream: Stream) -> DataFrame:
    rows = stream.events.where((F.col("kind") == "row") & (F.col("op") != "t"))  # a TRUNCATE has no key
    keyed = F.sum(F.col("key").isNotNull().cast("int"))
    return rows.groupBy("table_schema", "table_name").agg(
        F.when(keyed == F.count(F.lit(1)), "all").when(keyed == 0, "none").otherwise("mixed").alias("keys"))


def validate(stream: Stream, suites: list[Suite]) -> DataFrame:
    """The failed expectations of ``suites`` on ``stream``, as findings."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_spark(name="gpcdc")
    frames = {"events": stream.events, "tables": tables_frame(stream)}
    marked = stream.parts.where(F.col("gxid").isNotNull() & (F.col("ends") > 0)).limit(1).count() > 0
    rows = []
    for suite in suites:
        if suite.marked_only and not marked:
            continue
        expectations = gx.ExpectationSuite(**suite.body)
        if len(expectations.expectations) != len(suite.body.get("expectations", [])):
            raise ConfigError(f"suite {suite.name}: great-expectations kept {len(expectations.expectations)} of its "
                              f"{len(suite.body.get('expectations', []))} expectations",
                              fix="check the expectation types against great-expectations 1.x")
        batch = (source.add_dataframe_asset(name=suite.name).add_batch_definition_whole_dataframe("all")
                 .get_batch(batch_parameters={"dataframe": frames[suite.frame]}))
        for result in batch.validate(expectations, result_format="SUMMARY").results:
            if result.success:
                continue
            config = result.expectation_config
            assert config is not None  # a suite's results name their expectations
            kwargs = config.kwargs
            subject = kwargs.get("column") or ", ".join(kwargs.get("column_list") or [])
            if (result.exception_info or {}).get("raised_exception"):
                raise ConfigError(f"suite {suite.name}: {config.type}({subject}) could not be evaluated: "
                                  f"{result.exception_info.get('exception_message')}",
                                  fix="correct the expectation in its JSON file")
            r = result.result
            evidence = (f"{suite.name}: {r.get('unexpected_count')} of {r.get('element_count')} values "
                        f"unexpected, e.g. {r.get('partial_unexpected_list', [])[:5]}")
            severity = _SEVERITY.get(str(getattr(config, "severity", "critical")).split(".")[-1].lower(), "error")
            rows.append((f"{config.type}({subject})", severity, evidence))
    spark = stream.events.sparkSession
    found = spark.createDataFrame(rows, "rule string, severity string, evidence string")
    return found.select(*[F.col(name).cast(kind) if name in ("rule", "severity", "evidence")
                          else F.lit(None).cast(kind).alias(name) for name, kind in FINDING_COLUMNS])
