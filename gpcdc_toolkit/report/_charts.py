"""A chart, or what its absence means: a figure with nothing to draw is replaced by one
line that says why ("no findings: 22 rules ran"), never shown as empty axes."""

from __future__ import annotations

import html
from collections.abc import Sized
from typing import Any

_EMPTY_STYLE = ("margin:12px 0;padding:14px 18px;border:1px dashed #d0d7de;border-radius:6px;color:#57606a;"
                "font:1em system-ui,sans-serif")


def has_points(figure: Any) -> bool:
    """Whether any trace of a plotly figure has a point to draw."""
    for trace in figure.data:
        for axis in ("x", "y", "values"):
            values = getattr(trace, axis, None) if axis in trace else None
            if isinstance(values, Sized) and len(values) > 0:
                return True
    return False


def chart(figure: Any, empty: str, *, nothing: bool | None = None) -> None:
    """Show ``figure`` in the notebook, or the sentence ``empty`` in its place when it has
    no point to draw (or when ``nothing``, the caller's own judgement: every value zero)."""
    from IPython.display import HTML, display

    if (not has_points(figure)) if nothing is None else nothing:
        display(HTML(f'<p class="gpcdc-empty" style="{_EMPTY_STYLE}">{html.escape(empty)}</p>'))
    else:
        figure.show()
