"""A Greenplum-style sandbox cluster made of real PostgreSQL 15 servers on localhost.

One coordinator and N segments, each its own server with its own data directory
under ``<work_dir>/sandboxes/<name>/``. The coordinator carries the catalog and the
controller functions (``controller.sql``); segments carry the data. Every node has the
routing and the validation's row hash as SQL functions in C (``gp_dist.segment_of``,
``gp_dist.row_hash``, see ``_functions``). The state file
``sandbox.json`` names the nodes; servers are stopped through their own
``postmaster.pid``, never by process name.

With ``mirrors``, each segment has a mirror and the coordinator a standby: physical
streaming replicas (``pg_basebackup``), synchronous as Greenplum's are, listed in
``gp_segment_configuration`` with role ``m``. :meth:`Sandbox.failover` fails a
segment's primary and promotes its mirror as Greenplum's fault-tolerance service does,
or the coordinator and promotes its standby as ``gpactivatestandby`` does.
A mirror has no logical slot (PostgreSQL 15 does not carry them to a standby).

Two other flavours stand for the targets users have, reached through a front door:
``postgres``, one plain server, and ``citus``, a Citus coordinator and N workers
(Citus installed into PostgreSQL 15; see ``citus_installed``).

PostgreSQL refuses to run as root, so under root the servers run as the ``postgres``
OS user that Debian's server package creates.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg

from .._runtime import free_port, pid_alive, port_in_use, read_json, write_json
from ..cluster import COORDINATOR, CitusCluster, Cluster, FrontDoor
from ..errors import SandboxError, UnreachableError
from ._expand import Expansion, expand_cluster
from ._functions import functions_library, install_functions

PG_MAJOR = 15
SUPERUSER = "gpcdc"
DATABASE = "postgres"
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,30}$")
FLAVOURS = ("greenplum", "postgres", "citus")
_MIRROR_SLOT = "sandbox_mirror"  # the physical slot that keeps a primary's WAL until its mirror has it

# The sandbox trades durability for speed (fsync off): it is for tests and demos, and
# survives killed clients, not a killed machine. synchronous_commit stays on, because
# logical decoding only sends WAL that is flushed: asynchronous commits would reach
# change capture up to a WAL-writer cycle late.
SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "unix_socket_directories": "''",
    "wal_level": "logical",
    "max_connections": "200",
    "max_prepared_transactions": "200",
    "max_replication_slots": "16",
    "max_wal_senders": "16",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "64MB",
    "logical_decoding_work_mem": "64MB",
    "log_min_messages": "warning",
    "log_line_prefix": "'%m [%p] '",
}


def find_pg_bin() -> Path:
    """The directory of the PostgreSQL 15 server binaries."""
    candidates = []
    if os.environ.get("GPCDC_PG_BIN"):
        candidates.append(("GPCDC_PG_BIN", Path(os.environ["GPCDC_PG_BIN"])))
    else:
        candidates.append(("Debian's layout", Path(f"/usr/lib/postgresql/{PG_MAJOR}/bin")))
        on_path = shutil.which("pg_ctl")
        if on_path:
            candidates.append(("PATH", Path(on_path).resolve().parent))
    for _, directory in candidates:
        if all((directory / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            version = subprocess.run([directory / "postgres", "--version"], capture_output=True, text=True).stdout
            if f" {PG_MAJOR}." in version:
                return directory
    looked = ", ".join(f"{where} ({d})" for where, d in candidates)
    raise SandboxError(
        f"PostgreSQL {PG_MAJOR} server binaries (initdb, pg_ctl, postgres) not found; looked in {looked}",
        fix=f"install the Debian package postgresql-{PG_MAJOR}, or set GPCDC_PG_BIN to their directory",
    )


def _server_user() -> pwd.struct_passwd | None:
    """The unprivileged OS user that runs the servers when we are root; None otherwise."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise SandboxError(
            "running as root, but there is no 'postgres' OS user to run the servers as",
            fix=f"install the Debian package postgresql-{PG_MAJOR} (it creates that user), or run as a non-root user",
        ) from None


@dataclass(frozen=True)
class SandboxNode:
    content: int
    port: int
    datadir: str

    @property
    def name(self) -> str:
        return "coordinator" if self.content == COORDINATOR else f"segment {self.content}"

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={DATABASE}"

    def pid(self) -> int | None:
        """The postmaster's pid, from its own pid file, when it is running."""
        try:
            first = Path(self.datadir, "postmaster.pid").read_text().split("\n", 1)[0]
        except (FileNotFoundError, PermissionError):
            return None
        pid = int(first) if first.strip().isdigit() else None
        return pid if pid_alive(pid) else None


class Sandbox:
    """A named sandbox under a work directory; :meth:`up` creates or starts it."""

    def __init__(self, name: str, work_dir: str | os.PathLike[str]) -> None:
        if not _NAME.match(name):
            raise SandboxError(
                f"invalid sandbox name {name!r}",
                fix="use 1-31 lowercase letters, digits, '_' or '-', starting with a letter",
            )
        self.name = name
        self.work_dir = Path(work_dir).absolute()
        self.path = self.work_dir / "sandboxes" / name
        self._state_file = self.path / "sandbox.json"

    # -- state ---------------------------------------------------------------------
    @property
    def exists(self) -> bool:
        return self._state_file.is_file()

    def _state(self) -> dict[str, Any]:
        if not self.exists:
            others = sorted(p.name for p in (self.work_dir / "sandboxes").glob("*") if (p / "sandbox.json").is_file())
            known = f" (there are: {', '.join(others)})" if others else ""
            raise SandboxError(
                f"no sandbox named {self.name!r} in {self.work_dir}{known}",
                fix=f"create it with `gpcdc sandbox up --name {self.name}`",
            )
        return read_json(self._state_file)

    @property
    def nodes(self) -> list[SandboxNode]:
        """The primaries (the coordinator first)."""
        return [SandboxNode(**n) for n in self._state()["nodes"]]

    @property
    def mirrors(self) -> list[SandboxNode]:
        """The mirrors (the coordinator's standby as content -1), where there are."""
        return [SandboxNode(**n) for n in self._state().get("mirrors", [])]

    @property
    def dsn(self) -> str:
        return self.nodes[0].dsn

    @property
    def flavour(self) -> str:
        return str(self._state().get("flavour", "greenplum"))

    def cluster(self) -> Cluster:
        connect = {"greenplum": Cluster.connect, "postgres": FrontDoor.connect, "citus": CitusCluster.connect}
        try:
            return connect[self.flavour](self.dsn)
        except UnreachableError as e:
            raise UnreachableError(f"sandbox {self.name!r} does not answer: {e.message}",
                                   fix=f"start it with `gpcdc sandbox up --name {self.name}`") from None

    def status(self) -> list[tuple[SandboxNode, int | None]]:
        """Each node, primaries then mirrors, with its postmaster pid (None: not running)."""
        return [(node, node.pid()) for node in [*self.nodes, *self.mirrors]]

    # -- lifecycle -------------------------------------------------------------------
    def up(self, segments: int = 3, base_port: int | None = None, flavour: str = "greenplum",
           mirrors: bool = False) -> Sandbox:
        """Create and start the sandbox, or start it if it exists. Idempotent.
        ``flavour``: greenplum (segments), postgres (one server: ``segments`` 0) or
        citus (``segments`` workers); ``mirrors`` (greenplum only): a mirror per segment
        and a standby coordinator.

        On failure, whatever this call started is stopped and whatever it created is
        removed.
        """
        if flavour not in FLAVOURS:
            raise SandboxError(f"unknown sandbox flavour {flavour!r}", fix=f"use one of {', '.join(FLAVOURS)}")
        if flavour == "postgres":
            segments = 0
        if mirrors and flavour != "greenplum":
            raise SandboxError(f"a {flavour} sandbox has no mirrors", fix="use --flavour greenplum, or leave out --mirrors")
        if self.exists:
            state = self._state()
            if state.get("flavour", "greenplum") != flavour:
                raise SandboxError(f"sandbox {self.name!r} exists as a {state.get('flavour', 'greenplum')} cluster, "
                                   f"not {flavour}", fix=f"use --flavour {state.get('flavour', 'greenplum')}, or "
                                   f"`gpcdc sandbox down --name {self.name} --remove` first")
            if len(state["nodes"]) - 1 != segments:
                raise SandboxError(
                    f"sandbox {self.name!r} exists with {len(state['nodes']) - 1} segments, not {segments}",
                    fix=f"use --segments {len(state['nodes']) - 1}, or `gpcdc sandbox down --name {self.name} --remove` first",
                )
            if mirrors and not state.get("mirrors"):
                raise SandboxError(f"sandbox {self.name!r} exists without mirrors",
                                   fix=f"leave out --mirrors, or `gpcdc sandbox down --name {self.name} --remove` first")
            started: list[SandboxNode] = []
            try:
                for node in [*self.nodes, *self.mirrors]:
                    if node.pid() is None:
                        self._pg_ctl(node, "start")
                        started.append(node)
            except BaseException:
                for node in started:
                    self._stop(node)
                raise
            return self
        if flavour != "postgres" and not 1 <= segments <= 64:
            raise SandboxError(f"a sandbox needs 1 to 64 segments, not {segments}")
        pg_bin, user = find_pg_bin(), _server_user()
        if flavour == "citus":
            citus_installed(pg_bin)
        ports = self._choose_ports(segments + 1, base_port)
        nodes = [
            SandboxNode(content, port, str(self.path / ("coordinator" if content == COORDINATOR else f"seg{content}")))
            for content, port in zip(range(-1, segments), ports)
        ]
        self._check_reachable(user)
        self._clear_half_created()
        self.path.mkdir(parents=True)
        state = {"name": self.name, "pg_bin": str(pg_bin), "os_user": user.pw_name if user else None,
                 "flavour": flavour, "nodes": [asdict(n) for n in nodes]}
        started = []
        try:
            (self.path / "logs").mkdir()
            if user:
                os.chown(self.path / "logs", user.pw_uid, user.pw_gid)
            write_json(self.path / "sandbox.json.creating", state)
            library = functions_library(pg_bin, self.path) if flavour == "greenplum" else None
            with ThreadPoolExecutor(max_workers=4) as pool:
                list(pool.map(lambda n: self._initdb(n, pg_bin, user, flavour), nodes))
            for node in nodes:
                self._pg_ctl(node, "start", pg_bin=pg_bin, user=user)
                started.append(node)
            if library is not None:
                self._install_controller(nodes)
                for node in nodes:
                    install_functions(node.dsn, library)
            elif flavour == "citus":
                _join_citus(nodes)
            if mirrors:
                state["mirrors"] = []
                for node, port in zip(nodes, self._choose_ports(len(nodes), None if base_port is None
                                                                else base_port + len(nodes))):
                    mirror = self._mirror(node, port, pg_bin, user)
                    started.append(mirror)
                    state["mirrors"].append(asdict(mirror))
                    write_json(self.path / "sandbox.json.creating", state)
                self._list_mirrors(nodes[0].dsn, [SandboxNode(**m) for m in state["mirrors"]])
            os.replace(self.path / "sandbox.json.creating", self._state_file)
        except BaseException:
            for node in started:
                self._stop(node, pg_bin=pg_bin, user=user)
            shutil.rmtree(self.path, ignore_errors=True)
            raise
        return self

    def failover(self, content: int) -> SandboxNode:
        """Fail node ``content``'s primary (stopped at once, as a crash) and promote its
        mirror in its place: for a segment as Greenplum's fault-tolerance service does,
        for the coordinator (content -1) as ``gpactivatestandby`` does with its standby.
        The catalog (on the coordinator that then runs) lists the mirror as the primary,
        and the failed primary as a mirror that is down (its data is removed: a sandbox
        does not recover it). Returns the new primary."""
        state = self._state()
        mirror = next((m for m in self.mirrors if m.content == content), None)
        if mirror is None:
            what = "the coordinator has no standby" if content == COORDINATOR else (
                f"segment {content} has no mirror" if any(n.content == content for n in self.nodes)
                else f"there is no segment {content}")
            raise SandboxError(f"cannot fail over node {content} of sandbox {self.name!r}: {what}",
                               fix="choose a node with a mirror (`gpcdc sandbox status`); mirrors and a standby come "
                                   "with `gpcdc sandbox up --mirrors`")
        primary = next(n for n in self.nodes if n.content == content)
        self._stop(primary, mode="immediate")
        user = pwd.getpwnam(state["os_user"]) if state["os_user"] else None
        self._run_as(user, [str(Path(state["pg_bin"]) / "pg_ctl"), "promote", "-D", mirror.datadir, "-w", "-t", "60",
                            "-s"], f"promoting the mirror of node {content}")
        # The catalog is the coordinator's: the promoted standby's own copy, when it is the coordinator.
        coordinator = mirror if content == COORDINATOR else self.nodes[0]
        with psycopg.connect(coordinator.dsn, autocommit=True) as conn, conn.transaction():
            conn.execute("UPDATE gp_dist.gp_segment_configuration SET role = 'p', mode = 'n' "
                         "WHERE content = %s AND port = %s", (content, mirror.port))
            conn.execute("UPDATE gp_dist.gp_segment_configuration SET role = 'm', mode = 'n', status = 'd' "
                         "WHERE content = %s AND port = %s", (content, primary.port))
        state["nodes"] = [asdict(mirror) if n["content"] == content else n for n in state["nodes"]]
        state["mirrors"] = [m for m in state["mirrors"] if m["content"] != content]
        write_json(self._state_file, state)
        shutil.rmtree(primary.datadir, ignore_errors=True)
        return mirror

    def expand(self, segments: int, *, timeout: float = 60.0) -> Expansion:
        """Add ``segments`` segments (each with a mirror, where the sandbox has mirrors)
        and redistribute every table over them, as gpexpand does: see ``_expand``.
        Writers wait while it runs. Returns what it did.

        New servers that never joined the catalog are stopped and removed on failure;
        once listed, they stay (the cluster has them), and the failure says so."""
        state = self._state()
        if state.get("flavour", "greenplum") != "greenplum":
            raise SandboxError(f"sandbox {self.name!r} is a {state['flavour']} cluster; only a greenplum sandbox "
                               "expands with `gpcdc sandbox expand`", fix="expand a greenplum sandbox")
        have = len(state["nodes"]) - 1
        if segments < 1 or have + segments > 64:
            raise SandboxError(f"cannot add {segments} segments to sandbox {self.name!r}: it has {have}, and a "
                               "sandbox has 1 to 64", fix=f"add 1 to {64 - have} segments")
        pg_bin = Path(state["pg_bin"])
        user = pwd.getpwnam(state["os_user"]) if state["os_user"] else None
        new = [SandboxNode(content, port, str(self.path / f"seg{content}"))
               for content, port in zip(range(have, have + segments), self._choose_ports(segments, None))]
        started: list[SandboxNode] = []
        mirrors: list[SandboxNode] = []
        listed = False

        def list_in_state() -> None:
            nonlocal listed
            listed = True  # the catalog has them: whatever fails next, they stay
            state["nodes"] += [asdict(n) for n in new]
            if mirrors:
                self._list_mirrors(self.dsn, mirrors)
                state["mirrors"] += [asdict(m) for m in mirrors]
            write_json(self._state_file, state)

        try:
            for node in new:
                self._initdb(node, pg_bin, user, "greenplum")
                self._pg_ctl(node, "start", pg_bin=pg_bin, user=user)
                started.append(node)
            if state.get("mirrors"):
                for node, port in zip(new, self._choose_ports(len(new), None)):
                    mirrors.append(self._mirror(node, port, pg_bin, user))
                    started.append(mirrors[-1])
            return expand_cluster(self.dsn, [(n.content, n.port, n.datadir) for n in new], pg_bin, list_in_state,
                                  timeout=timeout)
        except BaseException as e:
            if listed:
                if not isinstance(e, Exception):
                    raise
                reason = e.message if isinstance(e, SandboxError) else str(e).strip().splitlines()[0]
                raise SandboxError(f"sandbox {self.name!r} lists its new segments {[n.content for n in new]}, but its "
                                   f"expansion stopped: {reason}",
                                   fix=f"finish it: `gpcdc sandbox expand --name {self.name} --finish`") from None
            for node in started:
                self._stop(node, pg_bin=pg_bin, user=user)
            for node in [*new, *mirrors]:
                shutil.rmtree(node.datadir, ignore_errors=True)
            raise

    def finish_expansion(self, *, timeout: float = 60.0) -> Expansion:
        """Move every row the distribution key places on another segment than where it
        is, one distributed transaction per table: what an expansion stopped half-way
        left to do (nothing, after one that finished)."""
        state = self._state()
        if state.get("flavour", "greenplum") != "greenplum":
            raise SandboxError(f"sandbox {self.name!r} is a {state['flavour']} cluster; only a greenplum sandbox "
                               "expands with `gpcdc sandbox expand`", fix="expand a greenplum sandbox")
        return expand_cluster(self.dsn, [], Path(state["pg_bin"]), lambda: None, timeout=timeout)

    def down(self, *, remove: bool = False) -> None:
        """Stop every node (by its pid file); with ``remove``, delete the data too."""
        def stop(node: SandboxNode) -> str | None:
            try:
                self._stop(node)
            except SandboxError as e:
                return str(e)
            return None

        errors: list[str] = []
        for nodes in (self.mirrors, self.nodes):  # the mirrors first, then the nodes, each side by side
            if nodes:
                with ThreadPoolExecutor(max_workers=min(8, len(nodes))) as pool:
                    errors += [e for e in pool.map(stop, nodes) if e is not None]
        if errors:
            raise SandboxError("; ".join(errors))
        if remove:
            shutil.rmtree(self.path)

    # -- helpers -----------------------------------------------------------------------
    def _clear_half_created(self) -> None:
        """Stop and remove what a creation killed midway left behind."""
        leftover = self.path / "sandbox.json.creating"
        if leftover.is_file():
            state = read_json(leftover)
            for node in (SandboxNode(**n) for n in state["nodes"]):
                if node.pid() is not None:
                    self._pg_ctl(node, "stop", pg_bin=Path(state["pg_bin"]),
                                 user=pwd.getpwnam(state["os_user"]) if state["os_user"] else None)
            shutil.rmtree(self.path)
        elif self.path.exists():
            raise SandboxError(f"{self.path} exists but holds no sandbox", fix="remove that directory")

    def _choose_ports(self, count: int, base_port: int | None) -> list[int]:
        if base_port is None:
            ports: list[int] = []
            while len(ports) < count:
                ports.append(free_port(avoid=ports))
            return ports
        ports = list(range(base_port, base_port + count))
        if ports[0] < 1024 or ports[-1] > 65535:
            raise SandboxError(f"ports {ports[0]}-{ports[-1]} are out of range", fix="choose a base port in 1024-65500")
        taken = [p for p in ports if port_in_use(p)]
        if taken:
            raise SandboxError(
                f"port {taken[0]} is taken by another process (the sandbox needs {ports[0]}-{ports[-1]})",
                fix="choose another --base-port, or omit it to use free ports",
            )
        return ports

    def _check_reachable(self, user: pwd.struct_passwd | None) -> None:
        if user is None:
            return
        for parent in [self.work_dir, *self.work_dir.parents]:
            if parent.exists() and not parent.stat().st_mode & 0o001:
                raise SandboxError(
                    f"the servers run as OS user {user.pw_name}, who cannot enter {parent} (mode {oct(parent.stat().st_mode & 0o777)})",
                    fix="choose a work directory whose parent directories are world-executable (e.g. under /srv or /tmp)",
                )

    def _run_as(self, user: pwd.struct_passwd | None, argv: list[str], what: str) -> None:
        kwargs: dict[str, Any] = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []} if user else {}
        env = {**os.environ, "LC_ALL": "C.UTF-8"}
        if user:
            env["HOME"] = user.pw_dir
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/", **kwargs)
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()
            raise SandboxError(f"{what} failed: {detail[-1] if detail else f'exit {done.returncode}'}")

    def _initdb(self, node: SandboxNode, pg_bin: Path, user: pwd.struct_passwd | None, flavour: str) -> None:
        datadir = Path(node.datadir)
        datadir.mkdir(mode=0o700)
        if user:
            os.chown(datadir, user.pw_uid, user.pw_gid)
        self._run_as(
            user,
            [str(pg_bin / "initdb"), "-D", str(datadir), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
             "--locale=C.UTF-8", "--no-sync", "--no-instructions"],
            f"initdb for {node.name}",
        )
        settings = {**SERVER_SETTINGS, "port": str(node.port)}
        if flavour == "citus":
            settings["shared_preload_libraries"] = "'citus'"
        with (datadir / "postgresql.conf").open("a") as conf:
            conf.write("\n# gpcdc sandbox\n" + "".join(f"{k} = {v}\n" for k, v in settings.items()))

    def restart(self, content: int, mode: str = "fast") -> None:
        """Stop one node (``mode``: pg_ctl's fast, or immediate: as a crash) and start it again."""
        if mode not in ("fast", "immediate"):
            raise SandboxError(f"unknown stop mode {mode!r}", fix="use fast or immediate")
        node = next((n for n in self.nodes if n.content == content), None)
        if node is None:
            raise SandboxError(f"sandbox {self.name!r} has no node {content}",
                               fix=f"use one of {', '.join(str(n.content) for n in self.nodes)}")
        self._pg_ctl(node, "stop", mode=mode)
        self._pg_ctl(node, "start")

    def _pg_ctl(self, node: SandboxNode, action: str, *, pg_bin: Path | None = None,
                user: pwd.struct_passwd | None = None, mode: str = "fast") -> None:
        if pg_bin is None:
            state = self._state()
            pg_bin = Path(state["pg_bin"])
            user = pwd.getpwnam(state["os_user"]) if state["os_user"] else None
        if action == "start":
            if port_in_use(node.port):
                raise SandboxError(
                    f"cannot start {node.name} of sandbox {self.name!r}: port {node.port} is taken by another process",
                    fix="stop that process, or remove the sandbox and create it again",
                )
            log = self.path / "logs" / f"{Path(node.datadir).name}.log"
            argv = [str(pg_bin / "pg_ctl"), "start", "-D", node.datadir, "-l", str(log), "-w", "-t", "60", "-s"]
        else:
            argv = [str(pg_bin / "pg_ctl"), "stop", "-D", node.datadir, "-m", mode, "-w", "-t", "60", "-s"]
        try:
            self._run_as(user, argv, f"pg_ctl {action} for {node.name} of sandbox {self.name!r}")
        except SandboxError as e:
            if action == "start":
                raise SandboxError(f"{e.message} (see {self.path / 'logs'})") from None
            raise

    def _stop(self, node: SandboxNode, **kwargs: Any) -> None:
        if node.pid() is not None:
            self._pg_ctl(node, "stop", **kwargs)

    def _mirror(self, primary: SandboxNode, port: int, pg_bin: Path, user: pwd.struct_passwd | None) -> SandboxNode:
        """A streaming replica of ``primary`` on ``port``, started, and the primary made to
        wait for it at each commit (Greenplum's mirrors are synchronous: a failover loses
        no committed transaction)."""
        mirror = SandboxNode(primary.content, port, f"{primary.datadir}-mirror")
        Path(mirror.datadir).mkdir(mode=0o700)
        if user:
            os.chown(mirror.datadir, user.pw_uid, user.pw_gid)
        self._run_as(user, [str(pg_bin / "pg_basebackup"), "-D", mirror.datadir, "-h", "127.0.0.1",
                            "-p", str(primary.port), "-U", SUPERUSER, "-X", "stream", "-R", "-c", "fast", "--no-sync",
                            "-C", "-S", _MIRROR_SLOT], f"pg_basebackup of {primary.name}")
        with (Path(mirror.datadir) / "postgresql.conf").open("a") as conf:
            conf.write(f"\n# gpcdc sandbox mirror\nport = {port}\n")
        self._pg_ctl(mirror, "start", pg_bin=pg_bin, user=user)
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")
            # The reload reaches the walsender a moment later: until then commits do not wait.
            deadline = time.monotonic() + 60
            while conn.execute("SELECT sync_state FROM pg_stat_replication").fetchall() != [("sync",)]:
                if time.monotonic() > deadline:
                    raise SandboxError(f"the mirror of {primary.name} did not become synchronous within 60 s",
                                       fix=f"see {self.path / 'logs'}")
                time.sleep(0.05)  # polling the primary's own view of its standby
        return mirror

    @staticmethod
    def _list_mirrors(coordinator_dsn: str, mirrors: list[SandboxNode]) -> None:
        with psycopg.connect(coordinator_dsn, autocommit=True) as conn, conn.transaction(), conn.cursor() as cur:
            cur.execute("UPDATE gp_dist.gp_segment_configuration SET mode = 's'")
            cur.executemany(
                "INSERT INTO gp_dist.gp_segment_configuration VALUES "
                "((SELECT max(dbid) + 1 FROM gp_dist.gp_segment_configuration), %s, 'm', 'm', 's', 'u', %s, "
                "'127.0.0.1', '127.0.0.1', %s)", [(m.content, m.port, m.datadir) for m in mirrors])

    def _install_controller(self, nodes: list[SandboxNode]) -> None:
        controller = resources.files("gpcdc_toolkit.cluster").joinpath("controller.sql").read_text()
        with psycopg.connect(nodes[0].dsn, autocommit=True) as conn:
            with conn.transaction():
                conn.execute(controller)
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO gp_dist.gp_segment_configuration VALUES "
                        "(%s, %s, 'p', 'p', 'n', 'u', %s, '127.0.0.1', '127.0.0.1', %s)",
                        [(dbid, n.content, n.port, n.datadir) for dbid, n in enumerate(nodes, start=1)],
                    )
            conn.execute(f'ALTER DATABASE {DATABASE} SET search_path = "$user", public, gp_dist')


def citus_installed(pg_bin: Path | None = None) -> None:
    """Raise SandboxError naming the fix when Citus is not installed into PostgreSQL 15."""
    libdir = (pg_bin or find_pg_bin()).parent / "lib"  # Debian's layout: bin/ and lib/ side by side
    if not (libdir / "citus.so").is_file():
        raise SandboxError(f"Citus is not installed for PostgreSQL {PG_MAJOR} (no citus.so in {libdir})",
                           fix="install Citus's packages for PostgreSQL 15, or build it from source "
                               "(`./dev test-citus` does, from ../shared/citus)")


def _join_citus(nodes: list[SandboxNode]) -> None:
    """The Citus extension on every node; the first the coordinator, the others its workers."""
    for node in nodes:
        with psycopg.connect(node.dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION citus")
    with psycopg.connect(nodes[0].dsn, autocommit=True) as conn:
        conn.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", (nodes[0].port,))
        for worker in nodes[1:]:
            conn.execute("SELECT citus_add_node('127.0.0.1', %s)", (worker.port,))


def list_sandboxes(work_dir: str | os.PathLike[str]) -> list[Sandbox]:
    root = Path(work_dir) / "sandboxes"
    return [Sandbox(p.name, work_dir) for p in sorted(root.glob("*")) if (p / "sandbox.json").is_file()]
