"""Typed configuration, resolved from a TOML file, the environment and flags.

The configuration is declared once, as typed sections (dataclasses of ``setting``
fields). Each setting's dotted name (``replay.batch_transactions``), which is also its
key in the file (``[replay] batch_transactions = 100``), its environment variable
(``GPCDC_REPLAY_BATCH_TRANSACTIONS``) and its flag (``--replay-batch-transactions``)
are derived from that declaration. Flags win over the environment, which wins over the
file, which wins over the defaults. The file is ``--config``, else ``$GPCDC_CONFIG``,
else ``./gpcdc.toml`` when it exists.

A cluster is named either by a coordinator DSN or by the name of a sandbox under the
work directory; the defaults are the sandboxes ``source`` and ``target`` and the
embedded broker, so that everything runs on one machine with no configuration.

A new stage (audit, validate, report) adds its section as one more dataclass and one
more field of ``Config``; nothing else changes.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .errors import ConfigError
from .protocol._topics import DISPATCHERS

ENV_PREFIX = "GPCDC_"
DEFAULT_FILE = "gpcdc.toml"


def setting(default: Any, help: str, *, choices: tuple[str, ...] = (), minimum: float | None = None,
            check: Callable[[Any], str | None] | None = None) -> Any:
    """A configurable field: its default, a help line, and what values it accepts
    (``check`` returns what is wrong with a value, or None)."""
    return field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum, "check": check})


def _port(port: int, room: int) -> str | None:
    """What is wrong with a port setting (0: off) that needs ``room`` ports above it."""
    return None if port == 0 or 1 <= port <= 65535 - room else f"is not a port in 1..{65535 - room} (or 0: off)"


def _lock_timeout(seconds: float) -> str | None:
    """PostgreSQL's lock_timeout is an int of milliseconds."""
    return None if seconds * 1000 <= 2**31 - 1 else "is above PostgreSQL's longest lock_timeout, 2147483.647 s"


def internal(default: Any = dataclasses.MISSING, **kwargs: Any) -> Any:
    """A field of a section that is not a setting (set by code or a command's own flag)."""
    if default is dataclasses.MISSING:
        return field(metadata={"internal": True}, **kwargs)
    return field(default=default, metadata={"internal": True}, **kwargs)


def _topic_prefix_problem(prefix: str) -> str | None:
    if prefix and all(c.isalnum() or c in "._-" for c in prefix):
        return None
    return "is not a valid topic prefix: use letters, digits, '.', '_' or '-'"


@dataclass(frozen=True)
class ClusterRef:
    """Where a cluster is: a coordinator DSN, or a sandbox of this work directory."""

    dsn: str | None = setting(None, "coordinator DSN of the cluster")
    sandbox: str | None = setting(None, "sandbox name of the cluster (when no DSN)")

    def describe(self) -> str:
        """Where the cluster is, for a person: a DSN with its password masked."""
        from .cluster import masked  # not at the top: the cluster package imports this module

        return f"dsn {masked(self.dsn)!r}" if self.dsn else f"sandbox {self.sandbox!r}"


_Ref = TypeVar("_Ref", bound=ClusterRef)


@dataclass(frozen=True)
class SourceRef(ClusterRef):
    dsn: str | None = setting(None, "coordinator DSN of the source cluster")
    sandbox: str | None = setting("source", "sandbox name of the source cluster (when no DSN)")


TARGET_KINDS = ("auto", "sandbox", "postgres")
# librdkafka settings (with their aliases) that capture's producer fixes: acknowledged by
# every replica, written once, never timed out locally, never past a gap.
GUARDED_CLIENT_SETTINGS = frozenset({
    "acks", "request.required.acks", "enable.idempotence", "message.timeout.ms", "delivery.timeout.ms",
    "enable.gapless.guarantee",
})


@dataclass(frozen=True)
class TargetRef(ClusterRef):
    dsn: str | None = setting(None, "DSN of the target: its coordinator, or a plain PostgreSQL server")
    sandbox: str | None = setting("target", "sandbox name of the target cluster (when no DSN)")
    kind: str = setting("auto", "sandbox: a Greenplum-style sandbox written segment by segment; postgres: a plain "
                                "PostgreSQL server or a Citus coordinator, written at its front door; auto: told by "
                                "its catalog", choices=TARGET_KINDS)


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap_servers: str | None = setting(None, "Kafka bootstrap servers; unset: the embedded broker")
    topic_prefix: str = setting("gpcdc", "prefix of every topic the toolkit writes", check=_topic_prefix_problem)
    replication_factor: int = setting(0, "replicas of each topic the toolkit creates (3 on a production cluster); "
                                         "0: the brokers' default.replication.factor", minimum=0)
    # Extra librdkafka settings: the file's table [kafka.client] only.
    client: Mapping[str, str] = internal(default_factory=dict)


@dataclass(frozen=True)
class SparkSettings:
    master: str = setting("local[2]", "Spark master URL")
    class_archive: bool = setting(True, "start Spark's JVM from an archive of the classes it loads, recorded once per "
                                        "Java and PySpark installation (seconds off each start)")


@dataclass(frozen=True)
class CaptureSettings:
    dispatcher: str = setting("segment", "partition the changes topic by segment or by key", choices=DISPATCHERS)
    heartbeat_interval: float = setting(1.0, "seconds between resolved watermarks", minimum=0.01)
    max_buffered: int = setting(1000, "events of one transaction held back before it is streamed", minimum=1)
    ack_interval: float = setting(0.5, "seconds between acknowledgements to the slot", minimum=0.01)
    flush_timeout: float = setting(10.0, "seconds Kafka may take to confirm events before the worker reports "
                                         "waiting for it (a pipeline marker: before the session restarts)",
                                   minimum=0.1)
    max_backoff: float = setting(30.0, "longest wait, in seconds, between reconnection attempts", minimum=0.1)
    producer_queue_kbytes: int = setting(65536, "the Kafka producer's buffer, in KiB", minimum=1024)
    metrics_port: int = setting(0, "Prometheus metrics of the workers: the coordinator's on this port, segment N's "
                                   "on it + 1 + N; 0: none", minimum=0, check=lambda p: _port(p, 1024))


@dataclass(frozen=True)
class ReplaySettings:
    batch_transactions: int = setting(500, "source transactions per target transaction, at most", minimum=1)
    batch_rows: int = setting(20_000, "rows per target transaction, at most (a larger transaction goes alone)",
                              minimum=1)
    clock_skew_ms: int = setting(1000, "how far, in ms, a segment's clock may lag the coordinator's", minimum=0)
    initial_load: bool = setting(True, "load the bootstrap's snapshot before the first transaction")
    legacy_per_segment: bool = setting(False, "replay a stream written with legacy markers segment by segment: "
                                              "exact once caught up, but parts of distributed transactions can "
                                              "show until then")
    spill_rows: int = setting(2_000, "rows of one part held in memory; past that they go to a file", minimum=1)
    chunk_rows: int = setting(5_000, "row events folded and written at a time within a batch", minimum=1)
    metrics_port: int = setting(0, "Prometheus metrics of `gpcdc replay` on this port; 0: none", minimum=0,
                                check=lambda p: _port(p, 0))
    spill_dir: str | None = setting(None, "directory of spilled parts (default: the system's temporary directory)")
    # gxids whose refused DDL was given to the target by hand: `gpcdc replay --skip-ddl`.
    skip_ddl: frozenset[int] = internal(frozenset())


@dataclass(frozen=True)
class AuditSettings:
    clock_skew_ms: int = setting(1000, "how far, in ms, one node's clock may be off another's: a part is proven "
                                       "missing only from a prepared list read that long after its record", minimum=0)
    silence_ms: int = setting(30_000, "a node with no resolved watermark for longer, in ms, is reported silent",
                              minimum=1)
    # Warnings are what cannot be proven right (a stream without markers, a silent node):
    # exit 0 means verified.
    fail_on: str = setting("warning", "the least severity of a finding that makes `gpcdc audit` exit 1",
                           choices=("error", "warning", "info"))
    expectations_dir: str | None = setting(None, "directory of the stream's expectation suites (default: the "
                                                 "expectations/ directory of the toolkit's checkout)")


@dataclass(frozen=True)
class ValidateSettings:
    mode: str = setting("checksum", "how tables are compared: checksums computed in each database, bisected to "
                                    "the rows that differ, or both sides read into Spark and diffed",
                        choices=("checksum", "spark"))
    fetch_rows: int = setting(1000, "checksum mode: differing chunks are bisected until each holds at most this "
                                    "many rows, which are then fetched and diffed", minimum=1)
    check_placement: bool = setting(True, "checksum mode: also read every target row's distribution key, to find "
                                          "rows on a segment their key does not name (a pass over the key columns)")
    expectations: bool = setting(True, "also run great-expectations suites on the target tables (computed by its "
                                       "servers): key unique and not null, row count as the source's, and the "
                                       "target suites of validate.expectations_dir")
    expectations_dir: str | None = setting(None, "directory of the expectation suites (default: the expectations/ "
                                                 "directory of the toolkit's checkout)")
    # Rows that differ always fail a validation; this is for the expectations' outcomes.
    fail_on: str = setting("warning", "the least severity of a failed expectation that makes `gpcdc validate` exit 1",
                           choices=("error", "warning", "info"))
    replay_timeout: float = setting(120.0, "seconds to wait for the replayer to reach a new sync point", minimum=0.1)
    lock_timeout: float = setting(10.0, "seconds a sync point waits for the commit lock (for running commit "
                                        "phases to end) before giving up", minimum=0.01, check=_lock_timeout)


@dataclass(frozen=True)
class ReportSettings:
    dir: Path = setting(Path("reports"), "directory of `gpcdc run`'s reports: one directory per run, and index.html")
    kernel: str = setting("python3", "the Jupyter kernel that runs the notebooks")
    timeout: float = setting(3600.0, "seconds a notebook cell may run before the run fails", minimum=1)
    keep_runs: int = setting(1000, "runs kept per job: `gpcdc run` removes a job's older runs after each run "
                                   "(`gpcdc reports prune` too; never a job's last run); 0: no limit", minimum=0)
    keep_days: float = setting(0.0, "days a run is kept: older runs are removed as keep_runs says; 0: no limit",
                               minimum=0)


@dataclass(frozen=True)
class Config:
    work_dir: Path = setting(Path(".gpcdc"), "directory for sandboxes, the broker and state")
    source: ClusterRef = field(default_factory=SourceRef)
    target: TargetRef = field(default_factory=TargetRef)
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    spark: SparkSettings = field(default_factory=SparkSettings)
    capture: CaptureSettings = field(default_factory=CaptureSettings)
    replay: ReplaySettings = field(default_factory=ReplaySettings)
    audit: AuditSettings = field(default_factory=AuditSettings)
    validate: ValidateSettings = field(default_factory=ValidateSettings)
    report: ReportSettings = field(default_factory=ReportSettings)
    origins: Mapping[str, str] = internal(default_factory=dict)  # setting -> where its value came from
    file: Path | None = internal(None)  # the configuration file read, if any (child processes read it too)

    def cluster(self, role: str) -> ClusterRef:
        if role not in ("source", "target"):
            raise ConfigError(f"unknown cluster role {role!r}", fix="use 'source' or 'target'")
        return self.source if role == "source" else self.target

    def value(self, name: str) -> Any:
        """The value of a setting by its dotted name."""
        section, _, key = name.rpartition(".")
        return getattr(getattr(self, section) if section else self, key)

    def with_settings(self, values: Mapping[str, object]) -> Config:
        """This configuration with some settings changed, checked as flags are."""
        unknown = sorted(set(values) - set(SETTINGS))
        if unknown:
            raise ConfigError(f"unknown setting(s) {', '.join(unknown)}", fix=f"known: {', '.join(SETTINGS)}")
        sections: dict[str, dict[str, Any]] = {}
        top: dict[str, Any] = {}
        origins = dict(self.origins)
        for name, raw in values.items():
            spec = SETTINGS[name]
            (sections.setdefault(spec.section, {}) if spec.section else top)[spec.key] = spec.parse(raw, "code")
            origins[name] = "code"
        for role in ("source", "target"):
            # A DSN replaces the sandbox, as in load_config; naming both is refused.
            given = sections.get(role, {})
            if given.get("dsn"):
                if given.get("sandbox"):
                    raise ConfigError(f"{role} names both a DSN and a sandbox",
                                      fix=f"set only one of {role}.dsn and {role}.sandbox")
                given["sandbox"] = None
            elif given.get("sandbox"):
                given["dsn"] = None
        changed = {s: dataclasses.replace(getattr(self, s), **kv) for s, kv in sections.items()}
        return dataclasses.replace(self, **top, **changed, origins=origins)


@dataclass(frozen=True)
class Setting:
    """One setting as derived from its declaration."""

    section: str  # "" for the top-level ones
    key: str
    type: type
    optional: bool
    default: Any
    help: str
    choices: tuple[str, ...]
    minimum: float | None
    check: Callable[[Any], str | None] | None

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}" if self.section else self.key

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.name.replace(".", "_").upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace(".", "-").replace("_", "-")

    def parse(self, raw: object, origin: str) -> Any:
        """The typed value of ``raw`` (a string from a flag or the environment, or a TOML
        value), or a ConfigError naming the setting, the value and where it came from."""
        def bad(what: str) -> ConfigError:
            return ConfigError(f"{self.name} = {raw!r} ({origin}) {what}")

        if raw is None or raw == "":
            if self.optional:
                return None
            raise ConfigError(f"{self.name} is empty ({origin})",
                              fix=f"give it a value, or unset it for the default {self.default!r}")
        value: Any
        if self.type is bool:
            if isinstance(raw, bool):
                value = raw
            elif str(raw).strip().lower() in ("1", "true", "yes", "on"):
                value = True
            elif str(raw).strip().lower() in ("0", "false", "no", "off"):
                value = False
            else:
                raise bad("is not a boolean: use true or false")
        elif self.type in (int, float):
            kind = "an integer" if self.type is int else "a number"
            if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
                raise bad(f"is not {kind}")
            try:
                value = self.type(str(raw))  # through str: 1.5 is no integer, though int(1.5) is 1
            except ValueError:
                raise bad(f"is not {kind}") from None
            if not math.isfinite(value):
                raise bad("is not a finite number")
            if self.minimum is not None and value < self.minimum:
                raise bad(f"is below the minimum {self.minimum:g}")
        elif self.type is Path:
            if not isinstance(raw, (str, os.PathLike)):
                raise bad("is not a path")
            value = Path(raw)
        else:
            if not isinstance(raw, (str, int)) or isinstance(raw, bool):
                raise bad(f"must be a string, not {type(raw).__name__}")
            value = str(raw)
        if self.choices and value not in self.choices:
            raise bad(f"is not one of {', '.join(self.choices)}")
        problem = self.check(value) if self.check else None
        if problem:
            raise bad(problem)
        return value


def _fields(cls: type, section: str) -> Iterator[Setting]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal") or "help" not in f.metadata:
            continue
        hint = hints[f.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) == 1 and type(None) in typing.get_args(hint)
        yield Setting(section, f.name, args[0] if optional else hint, optional, f.default,
                      f.metadata["help"], f.metadata["choices"], f.metadata["minimum"], f.metadata["check"])


def _declared() -> dict[str, Setting]:
    out = {s.name: s for s in _fields(Config, "")}
    for f in dataclasses.fields(Config):
        section = f.default_factory
        if isinstance(section, type) and dataclasses.is_dataclass(section):
            out.update({s.name: s for s in _fields(section, f.name)})
    return out


SETTINGS: dict[str, Setting] = _declared()
SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(s.section for s in SETTINGS.values() if s.section))


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and name != "kafka.client":
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _read_file(path: Path, where: str) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where} {path} is not valid TOML ({e})", fix="fix the file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where} {path} is not UTF-8 text (byte {e.start})", fix="save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"cannot read {where} {path} ({e.strerror})", fix="fix the path") from None
    values = _flatten(data)
    unknown = sorted(set(values) - set(SETTINGS) - {"kafka.client"})
    if unknown:
        raise ConfigError(
            f"{path}: unknown setting(s) {', '.join(unknown)}",
            fix=f"known settings are {', '.join(sorted(SETTINGS))} and the table [kafka.client]",
        )
    client = values.get("kafka.client", {})
    if not isinstance(client, Mapping):
        raise ConfigError(f"{path}: kafka.client must be a table of librdkafka settings")
    if guarded := sorted(GUARDED_CLIENT_SETTINGS.intersection(client)):
        raise ConfigError(
            f"{path}: [kafka.client] sets {', '.join(guarded)}, on which the order of each partition "
            "and the slots' acknowledgements rest (capture sets them itself)",
            fix=f"remove {', '.join(guarded)} from [kafka.client]",
        )
    return values


def load_config(
    flags: Mapping[str, object] | None = None,
    *,
    config_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Resolve the configuration; ``flags`` maps setting names to values (None: unset)."""
    environ = os.environ if environ is None else environ
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    unknown = sorted(set(flags) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}", fix=f"known: {', '.join(SETTINGS)}")

    tried: list[str] = []
    file_values: dict[str, Any] = {}
    file: Path | None = None
    if config_file is not None:
        file = Path(config_file)
        file_values = _read_file(file, "config file")
        tried.append(f"file {config_file}")
    elif environ.get(ENV_PREFIX + "CONFIG"):
        file = Path(environ[ENV_PREFIX + "CONFIG"])
        file_values = _read_file(file, f"{ENV_PREFIX}CONFIG file")
        tried.append(f"file {environ[ENV_PREFIX + 'CONFIG']} (from {ENV_PREFIX}CONFIG)")
    elif Path(DEFAULT_FILE).is_file():
        file = Path(DEFAULT_FILE)
        file_values = _read_file(file, "config file")
        tried.append(f"file ./{DEFAULT_FILE}")
    else:
        tried.append(f"file ./{DEFAULT_FILE} (absent)")
    tried += [f"environment {ENV_PREFIX}*", "flags"]

    sections: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    top: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for name, spec in SETTINGS.items():
        value, origin = spec.default, "default"
        if name in file_values:
            value, origin = spec.parse(file_values[name], "file"), "file"
        if spec.env_var in environ:
            origin = f"environment {spec.env_var}"
            value = spec.parse(environ[spec.env_var], origin)
        if name in flags:
            origin = f"flag {spec.flag}"
            value = spec.parse(flags[name], origin)
        (sections[spec.section] if spec.section else top)[spec.key] = value
        origins[name] = origin

    def cluster(role: str, cls: type[_Ref]) -> _Ref:
        dsn, sandbox = sections[role]["dsn"], sections[role]["sandbox"]
        explicit_sandbox = origins[f"{role}.sandbox"] != "default"
        if dsn and explicit_sandbox and sandbox:
            raise ConfigError(
                f"{role} names both a DSN ({origins[f'{role}.dsn']}) and a sandbox "
                f"({origins[f'{role}.sandbox']})",
                fix=f"set only one of {role}.dsn and {role}.sandbox",
            )
        if not dsn and not sandbox:
            dsn_spec, sandbox_spec = SETTINGS[f"{role}.dsn"], SETTINGS[f"{role}.sandbox"]
            raise ConfigError(
                f"no {role} cluster configured; looked in {', '.join(tried)}",
                fix=f"set {dsn_spec.flag} / {dsn_spec.env_var} or {sandbox_spec.flag} / {sandbox_spec.env_var}",
            )
        kind = {"kind": sections[role]["kind"]} if "kind" in sections[role] else {}
        return cls(dsn=dsn, sandbox=None if dsn else sandbox, **kind)

    client = file_values.get("kafka.client", {})
    return Config(
        work_dir=Path(top["work_dir"]).absolute(),
        source=cluster("source", SourceRef),
        target=cluster("target", TargetRef),
        kafka=KafkaSettings(**sections["kafka"], client={str(k): str(v) for k, v in client.items()}),
        spark=SparkSettings(**sections["spark"]),
        capture=CaptureSettings(**sections["capture"]),
        replay=ReplaySettings(**sections["replay"]),
        audit=AuditSettings(**sections["audit"]),
        validate=ValidateSettings(**sections["validate"]),
        report=ReportSettings(**sections["report"]),
        origins=origins,
        file=file.absolute() if file is not None else None,
    )
