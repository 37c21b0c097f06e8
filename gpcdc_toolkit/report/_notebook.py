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

    # "notebook" inlines plotly.js once per notebook, so that the report draws offline;
    # the mime bundle beside it is what JupyterLab draws.
    pio.renderers.default = "plotly_mimetype+notebook"
    given = {k: v for k, v in (settings or {}).items() if v is not None}
    for name, value in given.items():
        refuse_secret(name, value)
    return load_config(given)
