"""The audit's charts (plotly), for notebooks and reports: findings by rule over time,
each node's watermark delay, and how complete each segment's transactions are."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

if TYPE_CHECKING:
    from ._run import AuditResult

MAX_POINTS = 500  # per node: the delay is bucketed in time to stay near this


def figures(result: AuditResult) -> dict[str, Any]:
    return {"findings_over_time": findings_over_time(result), "watermark_delay": watermark_delay(result),
            "completeness": completeness(result)}


def findings_over_time(result: AuditResult) -> Any:
    import plotly.express as px

    counts = (result.findings.where(F.col("first_seen").isNotNull())
              .groupBy(F.date_trunc("minute", "first_seen").alias("minute"), "rule", "severity").count()
              .orderBy("minute").toPandas())
    figure = px.bar(counts, x="minute", y="count", color="rule", hover_data=["severity"],
                    title="Findings by rule, by the minute they were first seen")
    return figure.update_layout(xaxis_title="first seen (UTC)", yaxis_title="findings")


def watermark_delay(result: AuditResult) -> Any:
    import plotly.express as px

    lag = result.lag
    bounds = lag.agg(F.min(F.unix_seconds("at")).alias("first"), F.max(F.unix_seconds("at")).alias("last")).first()
    span = (bounds["last"] - bounds["first"]) if bounds and bounds["first"] is not None else 0
    bucket = max(1, span // MAX_POINTS)
    points: Any = (lag.groupBy("segment", F.timestamp_seconds(F.floor(F.unix_seconds("at") / bucket) * bucket).alias("at"))
              .agg(F.max("delay_ms").alias("delay_ms")).orderBy("segment", "at").toPandas())
    points["node"] = points["segment"].map(lambda s: "coordinator" if s == -1 else f"segment {s}")
    figure = px.line(points, x="at", y="delay_ms", color="node", render_mode="svg",
                     title=f"Resolved-watermark delay per node (max per {bucket} s)")
    return figure.update_layout(xaxis_title="Kafka time (UTC)", yaxis_title="delay (ms)")


def completeness(result: AuditResult) -> Any:
    import plotly.graph_objects as go

    parts = {r["segment"]: r["count"] for r in result.parts.groupBy("segment").count().collect()}
    troubles = (result.findings.where(F.col("rule").isin("missing_part", "late_part", "damaged_part"))
                .select("rule", F.explode("segments").alias("segment")).groupBy("segment", "rule").count().collect())
    by = {(r["segment"], r["rule"]): r["count"] for r in troubles}
    segments = sorted(set(parts) | {s for s, _ in by})
    damaged = [by.get((s, "damaged_part"), 0) for s in segments]
    bars = [("whole", [parts.get(s, 0) - d for s, d in zip(segments, damaged)]), ("damaged", damaged),
            ("missing", [by.get((s, "missing_part"), 0) for s in segments]),
            ("late", [by.get((s, "late_part"), 0) for s in segments])]
    figure = go.Figure([go.Bar(name=name, x=[f"segment {s}" for s in segments], y=values) for name, values in bars])
    return figure.update_layout(barmode="stack", title="Transaction parts per segment", yaxis_title="parts")
