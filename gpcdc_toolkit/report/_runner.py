"""``gpcdc run``: a notebook executed by papermill into ``reports/<job>-<time>/``, the
executed notebook and its self-contained HTML report written even when a cell fails,
and ``reports/index.html`` brought up to date.

The kernel gets the configuration in its environment (as capture workers do), never as
parameters: parameters are stored in the executed notebook, and a DSN may hold a
password. Whatever secret the configuration holds is replaced by ``***`` in everything
written, should a cell have printed it."""

from __future__ import annotations

import datetime as dt
import html
import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._runtime import write_json
from ..config import Config
from ..errors import ConfigError
from ._export import for_report, for_schedule, redact, to_html
from ._headline import Headline, cell_error, read_headline
from ._index import RUN_FILE, prune_reports, run_banner, update_index
from ._params import check_parameters, declared_parameters

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"  # the checkout's notebooks
EXIT = {"ok": 0, "findings": 1, "failed": 2}
# What the kernel process itself prints (its cells' outputs are in the notebook):
# ipykernel's own errors, some of them harmless races as it shuts down, and what the
# kernel's children print (a Spark JVM; ipykernel also shows it in the cell).
KERNEL_LOG = "kernel.log"
# The kernel's own log says that its local TCP sockets are unencrypted, on every start.
_KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=ERROR"]


@dataclass(frozen=True)
class NotebookRun:
    job: str
    directory: Path
    status: str  # ok, findings (the job found what fails it) or failed (a cell raised)
    seconds: float
    headline: Headline | None
    error: str | None = None  # the first cell error, 'Name: message'

    @property
    def exit_code(self) -> int:
        return EXIT[self.status]

    @property
    def report(self) -> Path:
        return self.directory / "report.html"

    def line(self) -> str:
        said = self.error or (self.headline.verdict if self.headline else "")
        return f"{self.job}: {self.status} in {self.seconds:.1f} s{f' ({said})' if said else ''}; {self.report}"


def find_notebook(name: str) -> Path:
    """A notebook by path, or by name among the toolkit's notebooks."""
    path = Path(name)
    for candidate in (path, NOTEBOOKS / path, NOTEBOOKS / f"{name}.ipynb"):
        if candidate.suffix == ".ipynb" and candidate.is_file():
            return candidate
    known = ", ".join(sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))) or "none found"
    raise ConfigError(f"no notebook {name!r}", fix=f"give a path to an .ipynb file, or one of: {known}")


def secrets_of(config: Config) -> list[str]:
    """The secrets the configuration holds: DSN passwords, Kafka client passwords."""
    from psycopg.conninfo import conninfo_to_dict

    found = [os.environ.get("PGPASSWORD", "")]
    for ref in (config.source, config.target):
        if ref.dsn:
            try:
                found.append(str(conninfo_to_dict(ref.dsn).get("password") or ""))
            except Exception:  # noqa: BLE001 (a malformed DSN fails where it is used, with its own error)
                pass
    found += [v for k, v in config.kafka.client.items() if k.startswith("sasl.") or k.endswith(
        (".password", ".secret", ".token", ".key", ".config"))]
    # As printed, encoded or escaped too. Shorter ones would redact innocent text everywhere.
    return sorted({form for secret in found if len(secret) >= 3 for form in _spellings(secret)})


def _spellings(secret: str) -> set[str]:
    from urllib.parse import quote, quote_plus

    return {secret, quote(secret, safe=""), quote_plus(secret), html.escape(secret), html.escape(secret, quote=False),
            json.dumps(secret)[1:-1], secret.replace("\\", "\\\\").replace("'", "\\'")}


def run_notebook(config: Config, notebook: str | Path, parameters: Mapping[str, Any] | None = None, *,
                 reports: Path | None = None) -> NotebookRun:
    """Execute ``notebook`` with ``parameters`` (checked against its ``parameters`` cell)."""
    import nbformat
    import papermill

    # Parameters papermill's own parser cannot read (annotated `str | None`) were checked above.
    logging.getLogger("papermill").setLevel(logging.ERROR)

    source = find_notebook(str(notebook))
    job = source.stem
    try:
        stored = json.loads(source.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise ConfigError(f"cannot read notebook {source}: {e}", fix="give a notebook saved by Jupyter") from None
    given = check_parameters(declared_parameters(stored), dict(parameters or {}), job)
    reports = Path(reports or config.report.dir).absolute()
    reports.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.UTC)
    directory = _new_directory(reports, f"{job}-{started:%Y%m%dT%H%M%SZ}")
    record: dict[str, Any] = {"job": job, "notebook": str(source), "started": f"{started:%Y-%m-%d %H:%M:%S}",
                              "started_at": started.timestamp(), "status": "running", "pid": os.getpid(), "parameters": given, "files": []}
    write_json(directory / RUN_FILE, record)
    update_index(reports)
    output = directory / "notebook.ipynb"
    began = time.monotonic()
    failure: str | None = None
    raise_after = False
    kernel_log = directory / KERNEL_LOG
    try:
        # Saved once, at the end (whether a cell failed or not), and redacted at once: a
        # save after every cell would leave a run killed midway with whatever it printed.
        papermill.execute_notebook(nbformat.from_dict(for_schedule(stored)), str(output), parameters=given,
                                   kernel_name=config.report.kernel,
                                   progress_bar=False, log_output=False, execution_timeout=config.report.timeout,
                                   cwd=os.getcwd(), extra_arguments=_KERNEL_ARGUMENTS,
                                   request_save_on_cell_execute=False, kernel_manager_class=_kernel_manager(config, kernel_log))
    except papermill.PapermillExecutionError:
        pass  # the error is in the output notebook, read below
    except KeyboardInterrupt:
        failure = "interrupted"  # written up below, then raised again
        raise_after = True
    except Exception as e:  # noqa: BLE001 (the kernel died or could not start: a failed run, reported)
        failure = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    seconds = time.monotonic() - began
    executed = json.loads(output.read_text()) if output.is_file() else stored
    secrets = secrets_of(config)
    executed = redact(executed, secrets)
    output.write_text(json.dumps(executed, indent=1, ensure_ascii=False) + "\n")
    logged = _redact_log(kernel_log, secrets)
    if failure and logged:
        failure += f" (the kernel's output: {kernel_log})"
    shown = read_headline(executed)
    error = failure or cell_error(executed)
    status = "failed" if error else "ok" if shown is None or shown.passed else "findings"
    record.update(status=status, seconds=round(seconds, 2))
    (directory / "report.html").write_text(to_html(for_report(executed), f"gpcdc {job}, {record['started']} UTC",
                                                   banner=run_banner(redact(record, secrets))))
    record.update(error=error,
                  figures=[[k, v] for k, v in shown.figures.items()] if shown else [], verdict=shown.verdict if shown else "",
                  files=["notebook.ipynb", "report.html", *([KERNEL_LOG] if logged else [])])
    write_json(directory / RUN_FILE, redact(record, secrets))
    update_index(reports)
    prune_reports(reports, keep_runs=config.report.keep_runs, keep_days=config.report.keep_days, now=time.time())
    if raise_after:
        raise KeyboardInterrupt
    return NotebookRun(job, directory, status, seconds, shown, error)


def _redact_log(log: Path, secrets: list[str]) -> bool:
    """``log`` redacted, or removed when empty; whether it is kept. The redacted text
    replaces the file rather than overwriting it: a process the kernel started may still
    hold it open, and what it writes after this goes to the old file, not unredacted into
    this one."""
    if not log.is_file() or log.stat().st_size == 0:
        log.unlink(missing_ok=True)
        return False
    redacted = log.with_name(f".{log.name}.redacted")
    redacted.write_text(redact(log.read_text(errors="replace"), secrets))
    os.replace(redacted, log)
    return True


def _new_directory(reports: Path, name: str) -> Path:
    for n in range(1000):
        directory = reports / (name if n == 0 else f"{name}-{n}")
        try:
            directory.mkdir()
            return directory
        except FileExistsError:
            continue
    raise ConfigError(f"{reports} holds 1000 runs named {name}", fix="remove old runs")


def kernel_arguments(kernel_argv: list[str]) -> list[str]:
    """What the command line of a kernel its spec starts with ``kernel_argv`` gains: an
    IPython kernel loads the toolkit's extension (``gpcdc_toolkit._kernel``), added to
    the extensions its configuration names. Other kernels are started as their spec says."""
    if not any(Path(a).name in ("ipykernel_launcher", "ipykernel_launcher.py") for a in kernel_argv):
        return []
    return ["--IPKernelApp.extra_extensions=gpcdc_toolkit._kernel"]


def _kernel_manager(config: Config, log: Path) -> type:
    """A kernel manager whose kernels start with this process's environment, its
    ``GPCDC_*`` variables replaced by the configuration's (this process's own environment
    left alone: other threads may be reading it), their output going to ``log``."""
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    from ..capture import child_environment

    environment = child_environment(config)

    class Manager(AsyncKernelManager):
        @default("shutdown_wait_time")
        def _shutdown_wait_time(self) -> float:
            # After a run the kernel is asked to shut down; jupyter_client sends it
            # SIGTERM if it has not ended after half of this, SIGKILL after all of it.
            # A kernel ends in about 0.1 s (_kernel.py). One with children (a local
            # Spark JVM) first sends them SIGTERM and looks again after 0.01 to 1.44 s,
            # then only at 4.44 s (ipykernel 7.4): SIGTERM at 1.5 s spares it that wait,
            # and the JVM, told to stop already, finishes stopping by itself.
            return 3.0

        async def start_kernel(self, **kw: Any) -> None:  # type: ignore[override]  # async, as AsyncKernelManager's
            arguments = [*(kw.pop("extra_arguments", None) or []),
                         *kernel_arguments(self.kernel_spec.argv if self.kernel_spec else [])]
            with log.open("ab") as output:  # the kernel keeps its own descriptor
                await super().start_kernel(**{**kw, "env": environment, "stdout": output, "stderr": output,
                                              "extra_arguments": arguments})

        async def _async_interrupt_kernel(self) -> None:
            # jupyter_client interrupts a kernel before asking it to shut down: at the end
            # of a run the kernel is idle, and the interrupt only makes it log an error.
            # (A cell over its time limit is interrupted before the shutdown begins.)
            if not self.shutting_down:
                await super()._async_interrupt_kernel()

    return Manager
