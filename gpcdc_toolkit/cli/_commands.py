"""The ``gpcdc`` commands, grouped as the command line shows them; one small class each,
in a module per concern."""

from __future__ import annotations

from ._audit import Archive, Audit
from ._command import Command
from ._pipeline import BootstrapCreate, BootstrapDrop, BootstrapExtend, BootstrapRepair, CaptureRun, CaptureStart, CaptureStop, Status
from ._replay import Replay
from ._run import ReportsPrune, Run
from ._servers import (
    BrokerDown,
    BrokerStatus,
    BrokerUp,
    SandboxDown,
    SandboxExpand,
    SandboxFailover,
    SandboxStatus,
    SandboxUp,
    SparkDown,
    SparkStatus,
    SparkUp,
)
from ._validate import SyncPointCommand, Validate
from ._workload import Demo, Workload

GROUPS: dict[str, tuple[str, list[Command]]] = {
    "sandbox": ("sandbox clusters of PostgreSQL 15 servers",
                [SandboxUp(), SandboxDown(), SandboxStatus(), SandboxFailover(), SandboxExpand()]),
    "broker": ("the embedded Apache Kafka broker", [BrokerUp(), BrokerDown(), BrokerStatus()]),
    "spark": ("the Spark Connect server the commands and notebooks share", [SparkUp(), SparkDown(), SparkStatus()]),
    "bootstrap": ("replication slots at a distributed-transaction-consistent point",
                  [BootstrapCreate(), BootstrapDrop(), BootstrapRepair(), BootstrapExtend()]),
    "capture": ("capture workers: every node into Kafka", [CaptureRun(), CaptureStart(), CaptureStop()]),
    "reports": ("the runs of `gpcdc run` in the report directory", [ReportsPrune()]),
}
COMMANDS: list[Command] = [Workload(), Status(), Replay(), Audit(), Archive(), SyncPointCommand(), Validate(), Run(), Demo()]
