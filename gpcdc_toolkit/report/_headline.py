"""A job's headline: the figures a report opens with and whether the job passed.

A notebook shows it with :func:`headline`; the output carries, beside its HTML, a JSON
bundle of its own media type that the runner reads back from the executed notebook
(:func:`read_headline`) for the exit status and the index. Pure apart from the display."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MEDIA_TYPE = "application/vnd.gpcdc.headline+json"


@dataclass(frozen=True)
class Headline:
    job: str
    figures: dict[str, Any]  # label -> number or short text, in the order shown
    passed: bool = True  # False: the job found what fails it (findings, differences)
    verdict: str = ""  # one line saying what the figures mean

    def bundle(self) -> dict[str, Any]:
        # Pairs, not an object: Jupyter's messages sort an object's keys.
        data = {"job": self.job, "figures": [[k, _plain(v)] for k, v in self.figures.items()], "passed": self.passed,
                "verdict": self.verdict}
        return {MEDIA_TYPE: data, "text/html": self.html(), "text/plain": self.text()}

    def html(self) -> str:
        tiles = "".join(f'<div class="gpcdc-tile"><div class="gpcdc-figure">{html.escape(format_figure(v))}</div>'
                        f'<div class="gpcdc-label">{html.escape(k)}</div></div>' for k, v in self.figures.items())
        tone = "gpcdc-pass" if self.passed else "gpcdc-fail"
        verdict = f'<p class="gpcdc-verdict {tone}">{html.escape(self.verdict)}</p>' if self.verdict else ""
        return f'<div class="gpcdc-headline">{_STYLE}{verdict}<div class="gpcdc-tiles">{tiles}</div></div>'

    def text(self) -> str:
        figures = "; ".join(f"{k}: {format_figure(v)}" for k, v in self.figures.items())
        return f"{self.verdict}\n{figures}" if self.verdict else figures


_STYLE = """<style>
.gpcdc-headline{font-family:system-ui,sans-serif;margin:.5em 0 1em}
.gpcdc-tiles{display:flex;flex-wrap:wrap;gap:12px}
.gpcdc-tile{border:1px solid #d0d7de;border-radius:6px;padding:10px 16px;min-width:120px}
.gpcdc-figure{font-size:1.9em;font-weight:600;line-height:1.2}
.gpcdc-label{color:#57606a;font-size:.9em}
.gpcdc-verdict{font-size:1.2em;font-weight:600;padding:6px 10px;border-radius:6px;display:inline-block}
.gpcdc-pass{background:#dafbe1;color:#116329}.gpcdc-fail{background:#ffebe9;color:#a40e26}
</style>"""


def _plain(value: Any) -> Any:
    """A JSON value: numpy and pandas scalars as Python's."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    return str(value)


def format_figure(value: Any) -> str:
    value = _plain(value)
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}".rstrip("0").rstrip(".") or "0"
    return str(value)


def headline(job: str, figures: Mapping[str, Any], *, passed: bool = True, verdict: str = "") -> None:
    """Show the job's headline in the notebook."""
    from IPython.display import display

    display(Headline(job, dict(figures), passed, verdict).bundle(), raw=True)


def read_headline(notebook: Mapping[str, Any]) -> Headline | None:
    """The last headline a notebook showed, from its outputs."""
    found: Headline | None = None
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            data = output.get("data", {}).get(MEDIA_TYPE)
            if isinstance(data, dict):
                figures = {str(k): v for k, v in data.get("figures") or []}
                found = Headline(str(data.get("job", "")), figures, bool(data.get("passed", True)),
                                 str(data.get("verdict", "")))
    return found


def cell_error(notebook: Mapping[str, Any]) -> str | None:
    """The first error a cell raised, as 'Name: message', or None."""
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            if output.get("output_type") == "error":
                message = str(output.get("evalue", "")).strip().splitlines()
                return f"{output.get('ename', 'Error')}: {message[0] if message else ''}".rstrip(": ")
    return None
