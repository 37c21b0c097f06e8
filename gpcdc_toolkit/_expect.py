"""great-expectations 1.x, as the audit and the validation run it: suites kept as JSON
in ``expectations/`` (bodies as great-expectations reads them), validated in an
ephemeral context on the audit's Spark DataFrames or by the target's own servers
(validation), each expectation's outcome in plain values.

A suite's ``meta.gpcdc.frame`` says what it validates: the audit's ``events`` or
``tables`` (see ``audit/_expectations``), or ``target``: a target table after
validation, named by ``meta.gpcdc.table`` as PostgreSQL prints it
(``public."Order Items"``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from importlib import import_module
from pathlib import Path
from typing import Any

from .errors import ConfigError, GpcdcError

_SEVERITY = {"critical": "error", "warning": "warning", "info": "info"}
_COUNTS_ONLY = {"result_format": "BASIC", "partial_unexpected_count": 0}  # BASIC without its examples
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
        expectations = body.get("expectations", [])
        if not isinstance(expectations, list) or not all(isinstance(e, dict) and isinstance(e.get("type"), str)
                                                         and isinstance(e.get("kwargs", {}), dict)
                                                         for e in expectations):
            raise ConfigError(f"{file}: expectations is not a list of objects, each with a type and its kwargs",
                              fix='write each as {"type": "expect_...", "kwargs": {...}}')
        if frame not in FRAMES:
            raise ConfigError(f"{file}: meta.gpcdc.frame is {frame!r}", fix=f"use one of {', '.join(FRAMES)}")
        if frame == "target" and not isinstance(table, str):
            raise ConfigError(f"{file}: a target suite names no table (meta.gpcdc.table)",
                              fix='name it as PostgreSQL prints it, e.g. "public.wl_accounts"')
        suites.append(Suite(body.get("name", file.stem), frame, meta.get("when") == "marked", body, table))
    return suites


def preload() -> None:
    """Start importing great-expectations in a thread of its own. Its import takes about
    3 s of Python; ``gpcdc audit`` calls this first, so that the import runs while the
    command waits on the Spark server for the stream's rules rather than after them.
    A daemon: a command that stops early does not wait for it."""

    def load() -> None:
        try:
            import_module("great_expectations")
        except Exception:  # noqa: BLE001, S110 (imported again where it is used, which says what failed, once)
            pass

    threading.Thread(target=load, name="import great_expectations", daemon=True).start()


def severity_of(expectation: Any) -> str:
    """error, warning or info: an expectation's (or its configuration's) severity."""
    return _SEVERITY.get(str(getattr(expectation, "severity", "critical")).split(".")[-1].lower(), "error")


@dataclass(frozen=True)
class Outcome:
    suite: str
    expectation: str  # its type and column(s): expect_column_values_to_be_unique(id)
    success: bool
    severity: str  # error, warning or info (great-expectations' critical, warning, info)
    evidence: str  # how many values were unexpected, and a few of them; or what was observed


@dataclass(frozen=True)
class Measured:
    """One expectation's result on one batch, in plain values (great-expectations'
    ``BASIC`` result): what outcomes are made of, and what results of several batches
    are combined from (``validate._stores``)."""

    type: str
    kwargs: dict[str, Any]
    severity: str
    success: bool
    result: dict[str, Any]

    @property
    def subject(self) -> str:
        return str(self.kwargs.get("column") or ", ".join(self.kwargs.get("column_list") or []))

    def outcome(self, suite: str) -> Outcome:
        r = self.result
        if "unexpected_count" in r:
            evidence = (f"{r.get('unexpected_count')} of {r.get('element_count')} values unexpected"
                        + (f", e.g. {r.get('partial_unexpected_list', [])[:5]}" if r.get("unexpected_count") else ""))
        else:
            evidence = f"observed {r.get('observed_value')}"
        return Outcome(suite, f"{self.type}({self.subject})", self.success, self.severity, evidence)


class Expectations:
    """An ephemeral great-expectations context: suites validated on Spark DataFrames
    (:meth:`evaluate`) or on queries of PostgreSQL servers (:meth:`store`, :meth:`measure_query`)."""

    def __init__(self) -> None:
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        # Some of its modules set their own logger's level: quiet each one, not only the parent.
        # What fails is said by the toolkit, in one line (a suite it cannot load, below).
        for name in [n for n in logging.root.manager.loggerDict if n.startswith("great_expectations")]:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        self._gx = gx
        self._context = gx.get_context(mode="ephemeral")
        self._context.variables.progress_bars = ProgressBarsConfig(globally=False)
        self._spark: Any = None
        self._assets = 0
        self._on_begin: dict[str, Callable[[Any], None]] = {}  # per SQL data source
        self._query_assets: dict[str, dict[str, str]] = {}  # per SQL data source: its assets by query
        self._queries: set[str] = set()  # of the query assets, as :meth:`_columns_only` meets them
        self._opened: list[Any] = []  # the SQL data sources' connections, for :meth:`stop`
        self._stopped = False

    def suite(self, name: str, body: dict[str, Any]) -> Any:
        """The suite ``body`` as great-expectations loads it. Raises ConfigError when it
        does not load whole."""
        try:
            suite = self._gx.ExpectationSuite(**body)
        except Exception as e:  # noqa: BLE001 (its own and pydantic's errors, whatever the field)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ConfigError(f"suite {name}: great-expectations cannot load it ({first})",
                              fix="correct its expectations' types and arguments (great-expectations 1.x) in its "
                                  "JSON file") from None
        if len(suite.expectations) != len(body.get("expectations", [])):
            raise ConfigError(f"suite {name}: great-expectations kept {len(suite.expectations)} of its "
                              f"{len(body.get('expectations', []))} expectations",
                              fix="check the expectation types against great-expectations 1.x")
        return suite

    def evaluate(self, name: str, body: dict[str, Any], frame: Any) -> list[Outcome]:
        """Every expectation of the suite ``body`` on the DataFrame ``frame``. Raises
        ConfigError when the suite does not load whole or an expectation cannot be
        evaluated (a column it names is not there)."""
        if self._spark is None:
            # Not persisted by great-expectations: it never releases what it persists, and
            # the frames given to it are materialized by their owner.
            self._spark = self._context.data_sources.add_spark(name="gpcdc", persist=False)
        batch = (self._spark.add_dataframe_asset(name=self._asset_name(name))
                 .add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame}))
        return [m.outcome(name) for m in self._measure(name, body, batch)]

    def store(self, name: str, connect: Callable[[], Any], queries: Sequence[str], *,
              on_begin: Sequence[str] = ()) -> Any:
        """A SQL data source whose connections come from ``connect`` (a psycopg
        connection), each transaction starting with the statements ``on_begin`` (say,
        importing a snapshot), with an asset for each of ``queries``, which
        :meth:`measure_query` then computes. ``name`` is unique within this object.
        Release it with :meth:`release`."""
        from sqlalchemy import event

        # The assets are declared with the source: added one by one, each asset and each
        # batch definition would have great-expectations write its whole configuration as
        # YAML again (about 5 ms each, whatever its size).
        assets = {query.strip(): f"query {i}" for i, query in enumerate(queries)}
        with warnings.catch_warnings():
            # It suggests its PostgreSQL source, which takes a URL: connections here come
            # from a DSN, as everywhere in the toolkit (a password file, a service, TLS).
            warnings.filterwarnings("ignore", message="You are using a generic SQLDatasource")
            source = self._context.data_sources.add_sql(  # type: ignore[call-arg]  # the stub lacks kwargs
                name=name, connection_string="postgresql+psycopg://", kwargs={"creator": partial(self._open, connect)},
                assets=[{"type": "query", "name": asset, "query": query,
                         "batch_definitions": [{"name": "all", "partitioner": None}]} for query, asset in assets.items()])
        def begin(connection: Any) -> None:
            for statement in on_begin:
                connection.exec_driver_sql(statement)

        # The engine great-expectations runs queries on: its execution engine's own.
        engine = source.get_execution_engine().engine
        event.listen(engine, "begin", begin)
        event.listen(engine, "before_cursor_execute", self._columns_only, retval=True)
        self._on_begin[name] = begin
        self._query_assets[name] = assets
        self._queries.update(assets)
        return source

    def _open(self, connect: Callable[[], Any]) -> Any:
        self._opened.append(connection := connect())
        return connection

    def stop(self) -> None:
        """Stop what the SQL data sources run, from another thread: the statement each
        runs is cancelled, and every statement after it refused (for good: this
        object's validations are over)."""
        import psycopg

        self._stopped = True
        for connection in list(self._opened):
            if not connection.closed:
                # Its server may be what failed: the statement then fails on its own, and
                # the caller's error is the one to say, not this one.
                with contextlib.suppress(psycopg.Error):
                    connection.cancel_safe(timeout=5)

    def _columns_only(self, connection: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                      executemany: bool) -> tuple[str, Any]:
        """``statement``, or, when it is one of the query assets' queries run as it is,
        a query of its columns without its rows. great-expectations learns a query
        asset's column names by running the query itself and reading the result's
        description (every metric reads the query as a subquery): psycopg would first
        read every row of the table into this process."""
        if self._stopped:
            raise RuntimeError("stopped: the caller no longer waits for this validation")
        if statement.strip() in self._queries:
            return f"SELECT * FROM ({statement}) AS columns_only LIMIT 0", parameters
        return statement, parameters

    @staticmethod
    def release(source: Any) -> None:
        source.get_execution_engine().engine.dispose()
        source.get_engine().dispose()

    def measure_query(self, name: str, body: dict[str, Any], source: Any, query: str) -> list[Measured]:
        """Every expectation of the suite ``body`` on the rows of ``query``, one of the
        queries ``source`` was made with, computed by its server (:meth:`store`)."""
        from sqlalchemy import event

        asset = self._query_assets[source.name].get(query.strip())
        if asset is None:
            raise ValueError(f"{source.name} was made without the query {query!r}: name it to store()")
        batch = source.get_asset(asset).get_batch_definition("all").get_batch()
        # Should great-expectations run this on an engine of its own, the statements of
        # every transaction (a snapshot imported) would silently not apply: refuse.
        if not event.contains(source.get_execution_engine().engine, "begin", self._on_begin[source.name]):
            raise GpcdcError(f"great-expectations would query {source.name} outside its transactions' set-up "
                             "(an engine the toolkit did not prepare)",
                             fix="install the great-expectations version pyproject.toml names")
        return self._measure(name, body, batch)

    def _asset_name(self, name: str) -> str:
        self._assets += 1  # asset names are unique within a context
        return f"{name}-{self._assets}"

    def _measure(self, name: str, body: dict[str, Any], batch: Any) -> list[Measured]:
        suite = self.suite(name, body)
        # Counts first: examples of unexpected values cost a query (a Spark job) per
        # expectation, so they are looked up, in a second pass, only for those that
        # failed with unexpected values (a row count judged on one store fails with none).
        results = batch.validate(suite, result_format=_COUNTS_ONLY).results
        failed = [i for i, result in enumerate(results) if not result.success and result.result.get("unexpected_count")]
        if failed:
            # Copies: great-expectations' copy of an expectation leaves out its id, which
            # would tie it to the suite it came from (a suite it saved gives each one).
            retry = self._gx.ExpectationSuite(name=f"{name} examples", expectations=[
                copy.copy(results[i].expectation_config.to_domain_obj()) for i in failed])
            # Matched by what they are: great-expectations orders results as it resolved them.
            positions: dict[str, list[int]] = {}
            for i in failed:
                positions.setdefault(_identity(results[i]), []).append(i)
            for result in batch.validate(retry, result_format="BASIC").results:
                if waiting := positions.get(_identity(result)):  # else its counts stand, without examples
                    results[waiting.pop()] = result
        out = []
        for result in results:
            config = result.expectation_config
            assert config is not None  # a suite's results name their expectations
            kwargs = {k: v for k, v in config.kwargs.items() if k != "batch_id"}  # the expectation's own
            measured = Measured(config.type, kwargs, severity_of(config), bool(result.success), dict(result.result))
            if (failure := _raised(result.exception_info)) is not None:
                raise ConfigError(f"suite {name}: {config.type}({measured.subject}) could not be evaluated: "
                                  f"{failure}",
                                  fix="where it names a column or an argument, correct the expectation in its JSON "
                                      "file; otherwise its data source failed, as the message says")
            out.append(measured)
        return out


def _identity(result: Any) -> str:
    config = result.expectation_config
    return repr((config.type, severity_of(config), sorted((k, v) for k, v in config.kwargs.items() if k != "batch_id")))


def _raised(info: Any) -> str | None:
    """The first line of what an expectation's evaluation raised: great-expectations
    reports it at the top (the expectation's own) or per metric (a failed query)."""
    if not isinstance(info, dict):
        return None
    reports = [info] + [v for v in info.values() if isinstance(v, dict)]
    for report in reports:
        if report.get("raised_exception"):
            message = str(report.get("exception_message") or "an exception").strip()
            return message.splitlines()[0] if message else "an exception"
    return None
