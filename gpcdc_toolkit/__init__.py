"""gpcdc_toolkit: change data capture for Greenplum-style MPP PostgreSQL clusters."""

from ._version import __version__
from .cluster import Cluster, DistributedTransaction, Session
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

__all__ = [
    "__version__",
    "Cluster", "DistributedTransaction", "Session",
    "Config", "load_config",
    "BrokerError", "ClusterError", "ConfigError", "DistributedTransactionError", "GpcdcError",
    "SandboxError", "UnreachableError",
]
