"""Typed configuration, resolved from a TOML file, the environment and flags.

Every setting has one dotted name (``source.dsn``), one environment variable
(``GPCDC_SOURCE_DSN``) and one flag (``--source-dsn``). Flags win over the
environment, which wins over the file, which wins over the defaults. The file is
``--config``, else ``$GPCDC_CONFIG``, else ``./gpcdc.toml`` when it exists.

A cluster is named either by a coordinator DSN or by the name of a sandbox under the
work directory; the defaults are the sandboxes ``source`` and ``target`` and the
embedded broker, so that everything runs on one machine with no configuration.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

ENV_PREFIX = "GPCDC_"
DEFAULT_FILE = "gpcdc.toml"

# name -> (default, help). Every value is a string until validated below.
SETTINGS: dict[str, tuple[str | None, str]] = {
    "work_dir": (".gpcdc", "directory for sandboxes, the broker and state"),
    "source.dsn": (None, "coordinator DSN of the source cluster"),
    "source.sandbox": ("source", "sandbox name of the source cluster (when no DSN)"),
    "target.dsn": (None, "coordinator DSN of the target cluster"),
    "target.sandbox": ("target", "sandbox name of the target cluster (when no DSN)"),
    "kafka.bootstrap_servers": (None, "Kafka bootstrap servers; unset: the embedded broker"),
    "kafka.topic_prefix": ("gpcdc", "prefix of every topic the toolkit writes"),
    "spark.master": ("local[2]", "Spark master URL"),
}


def env_var(name: str) -> str:
    return ENV_PREFIX + name.replace(".", "_").upper()


def flag(name: str) -> str:
    return "--" + name.replace(".", "-").replace("_", "-")


@dataclass(frozen=True)
class ClusterRef:
    """Where a cluster is: a coordinator DSN, or a sandbox of this work directory."""

    dsn: str | None
    sandbox: str | None

    def describe(self) -> str:
        return f"dsn {self.dsn!r}" if self.dsn else f"sandbox {self.sandbox!r}"


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap_servers: str | None  # None: the embedded broker of the work directory
    topic_prefix: str
    client: Mapping[str, str] = field(default_factory=dict)  # extra librdkafka settings


@dataclass(frozen=True)
class Config:
    work_dir: Path
    source: ClusterRef
    target: ClusterRef
    kafka: KafkaSettings
    spark_master: str
    origins: Mapping[str, str] = field(default_factory=dict)  # setting -> where it came from

    def cluster(self, role: str) -> ClusterRef:
        if role not in ("source", "target"):
            raise ConfigError(f"unknown cluster role {role!r}", fix="use 'source' or 'target'")
        return self.source if role == "source" else self.target


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
    for name, value in values.items():
        if name != "kafka.client" and not isinstance(value, (str, int)):
            raise ConfigError(f"{path}: {name} must be a string, not {type(value).__name__}")
    return values


def load_config(
    flags: Mapping[str, str | None] | None = None,
    *,
    config_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Resolve the configuration; ``flags`` maps setting names to flag values (None: unset)."""
    environ = os.environ if environ is None else environ
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    unknown = sorted(set(flags) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}", fix=f"known: {', '.join(SETTINGS)}")

    tried: list[str] = []
    file_values: dict[str, Any] = {}
    if config_file is not None:
        file_values = _read_file(Path(config_file), "config file")
        tried.append(f"file {config_file}")
    elif environ.get(ENV_PREFIX + "CONFIG"):
        file_values = _read_file(Path(environ[ENV_PREFIX + "CONFIG"]), f"{ENV_PREFIX}CONFIG file")
        tried.append(f"file {environ[ENV_PREFIX + 'CONFIG']} (from {ENV_PREFIX}CONFIG)")
    elif Path(DEFAULT_FILE).is_file():
        file_values = _read_file(Path(DEFAULT_FILE), "config file")
        tried.append(f"file ./{DEFAULT_FILE}")
    else:
        tried.append(f"file ./{DEFAULT_FILE} (absent)")
    tried += ["environment GPCDC_*", "flags"]

    values: dict[str, str | None] = {}
    origins: dict[str, str] = {}
    for name, (default, _help) in SETTINGS.items():
        value, origin = default, "default"
        if name in file_values:
            value, origin = str(file_values[name]), "file"
        if env_var(name) in environ:
            value, origin = environ[env_var(name)], f"environment {env_var(name)}"
        if name in flags:
            value, origin = str(flags[name]), f"flag {flag(name)}"
        values[name] = value if value != "" else None
        origins[name] = origin

    def cluster(role: str) -> ClusterRef:
        dsn, sandbox = values[f"{role}.dsn"], values[f"{role}.sandbox"]
        explicit_sandbox = origins[f"{role}.sandbox"] != "default"
        if dsn and explicit_sandbox and sandbox:
            raise ConfigError(
                f"{role} names both a DSN ({origins[f'{role}.dsn']}) and a sandbox "
                f"({origins[f'{role}.sandbox']})",
                fix=f"set only one of {role}.dsn and {role}.sandbox",
            )
        if not dsn and not sandbox:
            raise ConfigError(
                f"no {role} cluster configured; looked in {', '.join(tried)}",
                fix=f"set {flag(role + '.dsn')} / {env_var(role + '.dsn')} or {flag(role + '.sandbox')}",
            )
        return ClusterRef(dsn=dsn, sandbox=None if dsn else sandbox)

    prefix = values["kafka.topic_prefix"] or ""
    if not prefix or not all(c.isalnum() or c in "._-" for c in prefix):
        raise ConfigError(
            f"kafka.topic_prefix {prefix!r} ({origins['kafka.topic_prefix']}) is not a valid topic prefix",
            fix="use letters, digits, '.', '_' or '-'",
        )
    client = file_values.get("kafka.client", {})
    return Config(
        work_dir=Path(values["work_dir"] or ".gpcdc").absolute(),
        source=cluster("source"),
        target=cluster("target"),
        kafka=KafkaSettings(
            bootstrap_servers=values["kafka.bootstrap_servers"],
            topic_prefix=prefix,
            client={str(k): str(v) for k, v in client.items()},
        ),
        spark_master=values["spark.master"] or "local[2]",
        origins=origins,
    )
