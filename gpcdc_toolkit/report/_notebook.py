"""What every notebook of the toolkit does first."""

from __future__ import annotations

from collections.abc import Mapping

from ..config import Config, load_config
from ._params import refuse_secret


def notebook_config(settings: Mapping[str, object] | None = None) -> Config:
    """The configuration (file, ``GPCDC_*`` environment), with the notebook's parameters
    for ``settings`` (dotted names; None leaves a setting as configured) on top; and
    plotly set to draw in the saved notebook and its HTML report without a network."""
    import plotly.io as pio

    # The figure's JSON alone, which JupyterLab draws: the saved notebook stays small, and
    # its report draws it with plotly.js inlined once (see report/_export.py).
    pio.renderers.default = "plotly_mimetype"
    given = {k: v for k, v in (settings or {}).items() if v is not None}
    for name, value in given.items():
        refuse_secret(name, value)
    return load_config(given)
