"""The product's face: notebooks run by papermill into self-contained HTML reports.

``run_notebook`` (``gpcdc run``) executes a notebook of ``notebooks/`` with checked
parameters into ``reports/<job>-<time>/`` and updates ``reports/index.html``; a notebook
opens with ``notebook_config`` and shows its ``headline`` (figures first, and whether the
job passed, which sets the run's exit status). ``TransactionBrowser`` shows one
distributed transaction whole; ``browse`` is its widget.

``_params``, ``_headline`` and ``_index`` are pure; the rest load on first use.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ._headline import MEDIA_TYPE, Headline, cell_error, headline, read_headline
from ._index import index_html, prune_reports, read_runs, run_banner, runs_to_prune, update_index
from ._params import Parameter, check_parameters, convert, declared_parameters, refuse_secret, sql_names, syncpoint_choice

__getattr__ = lazy_exports(__name__, {
    "_browser": ("TransactionBrowser", "TransactionView", "browse"),
    "_charts": ("chart", "has_points"),
    "_export": ("external_references", "for_report", "for_schedule", "redact", "to_html"),
    "_investigate": ("Investigation", "find_run", "investigate"),
    "_notebook": ("notebook_config",),
    "_runner": ("EXIT", "NOTEBOOKS", "NotebookRun", "find_notebook", "run_notebook", "secrets_of"),
})

if TYPE_CHECKING:
    from ._browser import TransactionBrowser, TransactionView, browse
    from ._charts import chart, has_points
    from ._export import external_references, for_report, for_schedule, redact, to_html
    from ._investigate import Investigation, find_run, investigate
    from ._notebook import notebook_config
    from ._runner import EXIT, NOTEBOOKS, NotebookRun, find_notebook, run_notebook, secrets_of

__all__ = [
    "MEDIA_TYPE", "Headline", "cell_error", "headline", "read_headline",
    "index_html", "prune_reports", "read_runs", "run_banner", "runs_to_prune", "update_index",
    "Parameter", "check_parameters", "convert", "declared_parameters", "refuse_secret", "sql_names", "syncpoint_choice",
    "TransactionBrowser", "TransactionView", "browse",
    "chart", "has_points",
    "external_references", "for_report", "for_schedule", "redact", "to_html",
    "Investigation", "find_run", "investigate",
    "notebook_config",
    "EXIT", "NOTEBOOKS", "NotebookRun", "find_notebook", "run_notebook", "secrets_of",
]
