"""Capture workers of one pipeline spread over several hosts: which nodes a host runs
(``--nodes``), and how any host tells who holds a node's slot and how far Kafka has it,
without the other hosts' pid files. Pure: the slots and Kafka are read in ``_status``.

A worker names itself in its replication connection's ``application_name``
(``gpcdc capture <host> pid <pid>``), which the node shows beside the slot's active
walsender to any client; each worker's watermarks in Kafka say up to which WAL position
and commit time the node is complete there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from ..cluster import COORDINATOR
from ..errors import ConfigError

WORKER_APPLICATION = "gpcdc capture"
_NAMEDATALEN = 63  # PostgreSQL keeps this many bytes of an application_name
_RANGE = re.compile(r"^(-1|[0-9]{1,5})(?:-([0-9]{1,5}))?$")
_MOST = 65535  # content ids above are no cluster's; and a range up to them would fill memory
_HOLDER = re.compile(rf"^{WORKER_APPLICATION} (.+) pid ([0-9]{{1,10}})$")


def parse_nodes(text: str) -> frozenset[int]:
    """The content ids a ``--nodes`` list names: ``0-31``, ``coordinator,0-7``, ``-1,3,5``
    (on a command line, ``--nodes=-1,3,5``: a value starting with '-' reads as a flag)."""
    chosen: set[int] = set()
    for item in (part.strip() for part in text.split(",")):
        if item == "coordinator":
            chosen.add(COORDINATOR)
            continue
        match = _RANGE.fullmatch(item)
        if match is None:
            raise ConfigError(f"--nodes: {item!r} is neither a content id, a range such as 0-31, nor 'coordinator'",
                              fix="give content ids and ranges separated by commas, e.g. --nodes coordinator,0-31")
        first, last = int(match[1]), int(match[2] if match[2] is not None else match[1])
        if last > _MOST:
            raise ConfigError(f"--nodes: {item!r} goes beyond content id {_MOST}", fix="name the cluster's nodes")
        if last < first:
            raise ConfigError(f"--nodes: the range {item!r} ends before it starts", fix=f"write it as {last}-{first}")
        chosen.update(range(first, last + 1))
    return frozenset(chosen)


def check_nodes(chosen: Iterable[int], captured: Iterable[int]) -> None:
    """Refuse a selection naming nodes the pipeline does not capture."""
    known = sorted(captured)
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        raise ConfigError(f"--nodes names {_listed(unknown)}, which the pipeline does not capture "
                          f"(it captures {_listed(known)})", fix="choose among the captured nodes")


def _listed(contents: list[int]) -> str:
    """Content ids as ``--nodes`` takes them: coordinator, 0-31, 40."""
    runs: list[list[int]] = []
    for content in (c for c in contents if c != COORDINATOR):
        if runs and content == runs[-1][1] + 1:
            runs[-1][1] = content
        else:
            runs.append([content, content])
    named = ["coordinator"] if COORDINATOR in contents else []
    return ", ".join(named + [str(a) if a == b else f"{a}-{b}" for a, b in runs])


def worker_application(host: str, pid: int) -> str:
    """The ``application_name`` a worker's replication connection carries: the host
    name as PostgreSQL keeps it (printable ASCII, anything else a '?'), shortened to
    fit its 63 bytes."""
    tail = f" pid {pid}"
    room = _NAMEDATALEN - len(WORKER_APPLICATION) - 1 - len(tail)
    printable = "".join(c if " " <= c <= "~" else "?" for c in host) or "?"
    return f"{WORKER_APPLICATION} {printable[:room]}{tail}"


def holder(application_name: str | None) -> tuple[str, int] | None:
    """(host, pid) of the capture worker that ``application_name`` names; None for any
    other client."""
    match = _HOLDER.fullmatch(application_name or "")
    return (match[1], int(match[2])) if match else None


def latest_watermarks(values: Iterable[Any]) -> dict[int, tuple[int, int | None]]:
    """Per node, the (resolved LSN, resolved commit time in ms) of its furthest
    watermark among decoded messages; anything else is passed over."""
    latest: dict[int, tuple[int, int | None]] = {}
    for value in values:
        if not isinstance(value, Mapping):
            continue
        node, lsn, ts_ms = value.get("segment"), value.get("resolved"), value.get("resolved_ts_ms")
        if not (_integer(node) and _integer(lsn) and (ts_ms is None or _integer(ts_ms))):
            continue
        assert isinstance(node, int) and isinstance(lsn, int)  # for the type checker: checked above
        if node not in latest or lsn >= latest[node][0]:
            latest[node] = (lsn, ts_ms)
    return latest


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
