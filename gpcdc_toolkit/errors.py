"""The toolkit's exceptions.

Every error carries a one-line message that says what happened and, where there is
one, the fix. The command line prints ``str(error)`` and exits with the class's
``exit_code``: 1 in general, 2 for the configuration, 4 for the stream, 5 for a
source cluster that changed under the pipeline (3 is ``gpcdc status`` finding workers
down or in trouble). Errors of the pure core derive
from ``ValueError`` too, as the bad values they are.
"""

from __future__ import annotations


def first_line(error: BaseException) -> str:
    """An error's first line: a client library's cause ("... failed: Connection refused"),
    not the hint or context on the lines after it; the error's kind when it says nothing."""
    text = str(error).strip()
    return text.splitlines()[0].strip() if text else type(error).__name__


class GpcdcError(Exception):
    """Base of every error the toolkit raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.message = message
        self.fix = fix
        super().__init__(f"{message}: {fix}" if fix else message)


class ConfigError(GpcdcError):
    """The configuration is malformed, contradictory or incomplete."""

    exit_code = 2


class StreamError(GpcdcError):
    """What was read (a replication stream, a topic, a DDL record) breaks the protocol,
    or cannot be shown whole: nothing past it was applied."""

    exit_code = 4


class ClusterError(GpcdcError):
    """A cluster cannot be used: unreachable, misconfigured, or not Greenplum-shaped."""


class ClusterChangedError(ClusterError):
    """A node of the source is not what the pipeline started on: its slot was dropped or
    invalidated, another server answers for it (a mirror promoted), or the cluster has
    nodes the pipeline does not capture. Capture of that node cannot go on as it was."""

    exit_code = 5


class UnreachableError(ClusterError):
    """A server or broker does not answer."""


class DistributedTransactionError(ClusterError):
    """A distributed transaction failed; the message says which phase and which nodes."""


class SyncPointError(GpcdcError):
    """A sync point could not be taken, or the replayer did not reach it."""

    exit_code = 2


class SandboxError(GpcdcError):
    """A sandbox cannot be created, started, stopped or found."""


class BrokerError(GpcdcError):
    """The embedded broker cannot be started, stopped or reached."""
