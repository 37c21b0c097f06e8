"""gpcdc_toolkit: change data capture for Greenplum-style MPP PostgreSQL clusters."""

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .config import Config, load_config
from .errors import (
    BrokerError,
    ClusterError,
    ConfigError,
    DistributedTransactionError,
    GpcdcError,
    SandboxError,
    UnreachableError,
)

_CLUSTER = ("Cluster", "DistributedTransaction", "Session")


def __getattr__(name: str) -> Any:
    # Loaded on first use: the cluster interface imports psycopg, the pure core must not.
    if name in _CLUSTER:
        from . import cluster

        return getattr(cluster, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    from .cluster import Cluster, DistributedTransaction, Session

__all__ = [
    "__version__",
    "Cluster", "DistributedTransaction", "Session",
    "Config", "load_config",
    "BrokerError", "ClusterError", "ConfigError", "DistributedTransactionError", "GpcdcError",
    "SandboxError", "UnreachableError",
]
