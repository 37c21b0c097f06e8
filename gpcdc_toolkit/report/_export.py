"""An executed notebook as one self-contained HTML file: nothing loaded from a network,
code hidden behind a "show code" switch, errors shown, widgets left out (their views
need a widget manager from a CDN; a report's interactivity is plotly's own)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).parent / "templates"
INTERACTIVE_TAG = "interactive"  # cells for a person at a notebook (widgets): not in reports
_EXTERNAL = re.compile(r"""<(?:script|link|img|iframe)\b[^>]*?\b(?:src|href)\s*=\s*["']?((?:https?:)?//[^"'\s>]+)""",
                       re.IGNORECASE)


PLOTLY_MIME = "application/vnd.plotly.v1+json"
_FIGURE_HEIGHT = "525px"  # as plotly's own notebook renderer draws a figure
# plotly.js's basic bundle (npm plotly.js-basic-dist-min, MIT: plotly-basic.LICENSE),
# 1.2 MB against the full bundle's 4.8 MB, and the trace types it draws.
_BASIC_BUNDLE = Path(__file__).parent / "static" / "plotly-basic.min.js"
_BASIC_TRACES = frozenset({"scatter", "bar", "pie"})


def for_schedule(notebook: Mapping[str, Any]) -> dict[str, Any]:
    """The notebook as a scheduled run executes it: without the cells for a person at
    the notebook (widgets)."""
    out: dict[str, Any] = copy.deepcopy(dict(notebook))
    out["cells"] = [c for c in out.get("cells", []) if INTERACTIVE_TAG not in c.get("metadata", {}).get("tags", [])]
    return out


def for_report(notebook: Mapping[str, Any]) -> dict[str, Any]:
    """The notebook as a report shows it: interactive cells (unless one failed) and
    widget state dropped, and each plotly figure given the HTML that draws it (with
    plotly.js, which :func:`to_html` inlines once). Secrets are the caller's: :func:`redact` first."""
    import plotly.io as pio

    out: dict[str, Any] = copy.deepcopy(dict(notebook))
    out["cells"] = [c for c in out.get("cells", []) if INTERACTIVE_TAG not in c.get("metadata", {}).get("tags", [])
                    or any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    out.setdefault("metadata", {}).pop("widgets", None)
    for cell in out["cells"]:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if PLOTLY_MIME in data and "text/html" not in data:
                data["text/html"] = pio.to_html(data[PLOTLY_MIME], include_plotlyjs=False, full_html=False,
                                                default_height=_FIGURE_HEIGHT, validate=False)
    return out


def redact(value: Any, secrets: Iterable[str]) -> Any:
    """``value`` (JSON) with every occurrence of each secret replaced by ``***``; in a
    notebook, a cell's consecutive outputs to one stream are joined first, so that a
    secret printed in pieces is found whole."""
    found = sorted({s for s in secrets if s}, key=len, reverse=True)
    if not found:
        return value
    if isinstance(value, dict) and isinstance(value.get("cells"), list):
        value = {**value, "cells": [_joined_streams(c) if isinstance(c, dict) else c for c in value["cells"]]}

    pattern = re.compile("|".join(map(re.escape, found)))

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            for _ in range(8):  # again while one is left: a replacement can complete another secret
                v, replaced = pattern.subn("***", v)
                if not replaced:
                    break
            return v
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            return {walk(k): walk(x) for k, x in v.items()}
        return v

    return walk(value)


def _joined_streams(cell: dict[str, Any]) -> dict[str, Any]:
    outputs: list[Any] = []
    for output in cell.get("outputs") or []:
        last = outputs[-1] if outputs else None
        if (isinstance(output, dict) and output.get("output_type") == "stream" and isinstance(last, dict)
                and last.get("output_type") == "stream" and last.get("name") == output.get("name")):
            outputs[-1] = {**last, "text": _text(last.get("text")) + _text(output.get("text"))}
        else:
            outputs.append(output)
    return {**cell, "outputs": outputs} if "outputs" in cell else cell


def _text(text: Any) -> str:
    return "".join(text) if isinstance(text, list) else str(text or "")


def external_references(page: str) -> list[str]:
    """The addresses a page would load from a network (scripts, styles, images, frames)."""
    return _EXTERNAL.findall(page)


_EXTERNAL_SCRIPT = re.compile(r"""<script\b[^>]*?\bsrc\s*=\s*["']?(?:https?:)?//[^>]*>\s*</script>""", re.IGNORECASE)


def to_html(notebook: Mapping[str, Any], title: str, banner: str = "") -> str:
    """The report's page; ``banner`` (HTML) is the line it opens with."""
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="gpcdc", extra_template_basedirs=[str(TEMPLATES)])
    node = nbformat.reads(json.dumps(notebook), as_version=4)  # as on disk: sources and outputs in lines, joined
    node.metadata["title"] = title
    body, _resources = exporter.from_notebook_node(node, resources={"gpcdc_banner": banner})
    # plotly's notebook renderer adds MathJax from a CDN to every figure, for LaTeX in
    # labels: a report loads nothing from a network (labels are shown as written).
    page = _used_styles_only(_EXTERNAL_SCRIPT.sub("", str(body)))
    # plotly.js once, before the figures that use it (unless a cell inlined it already).
    if "Plotly.newPlot(" in page and "</head>" in page and "* plotly.js" not in page:
        head, rest = page.split("</head>", 1)
        page = f'{head}<script type="text/javascript">{plotly_js(trace_types(notebook))}</script>\n</head>{rest}'
    return page


_STYLE = re.compile(r'(<style type="text/css">)(.*?)(</style>)', re.DOTALL)
_CLASS_ATTRIBUTE = re.compile(r"""\bclass\s*=\s*(?:"([^"]*)"|'([^']*)')""", re.IGNORECASE)
_CLASS = re.compile(r"\.(-?[_a-zA-Z][\w-]*)")
_PARENTHESIZED = re.compile(r"\([^()]*\)")


def _used_styles_only(page: str) -> str:
    """The page with the style rules that can match none of its elements left out: most
    of JupyterLab's stylesheet (about 240 KB) styles what a report never holds."""
    classes = {c for m in _CLASS_ATTRIBUTE.finditer(page) for c in (m[1] or m[2] or "").split()}
    return _STYLE.sub(lambda m: m[1] + used_rules(m[2], classes) + m[3], page)


def used_rules(css: str, classes: set[str]) -> str:
    """``css`` without the rules whose every selector names a class not in ``classes``.
    Classes in parentheses do not count (``:not(.x)`` matches where ``x`` is absent,
    ``:is(.x, .y)`` where either is there): in doubt, a rule stays. At-rules other than
    ``@media`` and ``@supports`` are kept whole; those two are pruned inside."""
    import tinycss2

    kept = []
    for rule in tinycss2.parse_stylesheet(css, skip_comments=True, skip_whitespace=True):
        if rule.type == "qualified-rule":
            selectors = _top_level_split(tinycss2.serialize(rule.prelude))
            if any(set(_CLASS.findall(_outside_parentheses(selector))) <= classes for selector in selectors):
                kept.append(rule.serialize())
        elif rule.type == "at-rule" and rule.lower_at_keyword in ("media", "supports") and rule.content is not None:
            inner = used_rules(tinycss2.serialize(rule.content), classes)
            if inner:
                kept.append(f"@{rule.at_keyword}{tinycss2.serialize(rule.prelude)}{{{inner}}}")
        elif rule.type != "error":
            kept.append(rule.serialize())
        else:
            return css  # a stylesheet this cannot read is left as it is
    return "\n".join(kept)


def _outside_parentheses(selector: str) -> str:
    while (inner := _PARENTHESIZED.sub("", selector)) != selector:
        selector = inner
    return selector


def _top_level_split(selectors: str) -> list[str]:
    """A selector list split at its commas, those inside parentheses aside."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(selectors):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(selectors[start:i])
            start = i + 1
    return [*parts, selectors[start:]]


def trace_types(notebook: Mapping[str, Any]) -> set[str]:
    """The plotly trace types the notebook's figures draw."""
    return {trace.get("type", "scatter") for cell in notebook.get("cells", []) for output in cell.get("outputs", [])
            for trace in output.get("data", {}).get(PLOTLY_MIME, {}).get("data", [])}


def plotly_js(types: set[str]) -> str:
    """The smallest plotly.js that draws these trace types: the basic bundle when it draws
    them all and is the version plotly.py writes its figures for, else plotly.py's full one."""
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    if types <= _BASIC_TRACES:
        basic = _BASIC_BUNDLE.read_text()
        if f" v{get_plotlyjs_version()}\n" in basic[:200]:
            return basic
    return str(get_plotlyjs())
