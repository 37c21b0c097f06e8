"""The sandbox's functions in C (``gp_dist.c``: its routing, and the row hash of
checksum validation): built once per source and PostgreSQL version with the C compiler
and the server's headers, kept in ``~/.cache/gpcdc/gp_dist``, and copied into each
sandbox, whose servers load it by its path."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

import psycopg
from psycopg import sql

from .._sql import Name
from ..errors import SandboxError

# The row hash's C symbol names its form (gp_dist.c): validation asks a server for the
# sandbox's row hash only when its library computes this form.
ROW_HASH_SYMBOL = "gpcdc_row_hash_3"
_NEEDS = "install a C compiler and PostgreSQL 15's server headers (Debian: gcc postgresql-server-dev-15; `./dev setup` does)"


def functions_library(pg_bin: Path, into: Path) -> Path:
    """``gp_dist.so`` in directory ``into``, built unless the cache has it."""
    source = resources.files(__package__).joinpath("gp_dist.c").read_bytes()
    include = Path(_pg_config(pg_bin, "--includedir-server"))
    if not (include / "postgres.h").is_file():
        raise SandboxError(f"the sandbox's functions cannot be built: no PostgreSQL server headers in {include}",
                           fix=_NEEDS)
    # Compiled as the server was (its flags keep floating point as the Python form's).
    compiler = [*shlex.split(_pg_config(pg_bin, "--cc")), *shlex.split(_pg_config(pg_bin, "--cflags")),
                *shlex.split(_pg_config(pg_bin, "--cflags_sl"))]
    build = "\0".join([_pg_config(pg_bin, "--version"), platform.machine(), str(include), *compiler])
    key = hashlib.sha256(source + build.encode()).hexdigest()[:16]
    cache = Path.home() / ".cache" / "gpcdc" / "gp_dist"
    built = cache / f"gp_dist-{key}.so"
    if not built.is_file():
        _build(source, include, compiler, cache, built)
    library = into / "gp_dist.so"
    shutil.copyfile(built, library)
    library.chmod(0o755)  # the servers may run as another OS user
    return library


@functools.cache  # asked five times for each sandbox made; the answers do not change
def _pg_config(pg_bin: Path, flag: str) -> str:
    try:
        done = subprocess.run([str(pg_bin / "pg_config"), flag], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise SandboxError(f"the sandbox's functions cannot be built: {pg_bin / 'pg_config'} {flag} failed "
                           f"({e})", fix=_NEEDS) from None
    return done.stdout.strip()


def _build(source: bytes, include: Path, compiler: list[str], cache: Path, built: Path) -> None:
    if not compiler or shutil.which(compiler[0]) is None:
        raise SandboxError(f"the sandbox's functions cannot be built: no C compiler {' '.join(compiler[:1])!r}",
                           fix=_NEEDS)
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SandboxError(f"the sandbox's functions cannot be built: {e}",
                           fix=f"make {cache} writable, or set HOME to a directory that is") from None
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        (Path(scratch) / "gp_dist.c").write_bytes(source)
        output = Path(scratch) / "gp_dist.so"
        done = subprocess.run([*compiler, "-shared", f"-I{include}", "-o", str(output), str(Path(scratch) / "gp_dist.c")],
                              capture_output=True, text=True)
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()
            raise SandboxError(f"building the sandbox's functions failed: {detail[-1] if detail else done.returncode}",
                               fix=_NEEDS)
        os.replace(output, built)  # whole or not at all, for a sandbox built beside this one


def install_functions(dsn: str, library: Path) -> None:
    """``gp_dist.segment_of(segments, VARIADIC key text[])``,
    ``gp_dist.row_hash(VARIADIC "any")`` and the aggregate ``gp_dist.chunk_digests(bigint, bigint)``
    on one server."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute("CREATE SCHEMA IF NOT EXISTS gp_dist")
        conn.execute(sql.SQL("CREATE FUNCTION gp_dist.segment_of(segments int, VARIADIC key text[]) RETURNS int "
                             "AS {}, 'gpcdc_segment_of' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE")
                     .format(sql.Literal(str(library))))
        # Not strict: a NULL column is part of the row.
        conn.execute(sql.SQL('CREATE FUNCTION gp_dist.row_hash(VARIADIC "any") RETURNS bigint '
                             "AS {}, {} LANGUAGE C IMMUTABLE PARALLEL SAFE")
                     .format(sql.Literal(str(library)), sql.Literal(ROW_HASH_SYMBOL)))
        functions = {"add": "(internal, bigint, bigint) RETURNS internal", "combine": "(internal, internal) RETURNS internal",
                     "serialize": "(internal) RETURNS bytea STRICT", "deserialize": "(bytea, internal) RETURNS internal "
                     "STRICT", "final": "(internal) RETURNS bytea"}
        for name, signature in functions.items():
            conn.execute(sql.SQL("CREATE FUNCTION gp_dist.{}{} AS {}, {} LANGUAGE C IMMUTABLE PARALLEL SAFE").format(
                Name(f"chunks_{name}"), sql.SQL(signature), sql.Literal(str(library)),
                sql.Literal(f"gpcdc_chunks_{name}")))
        conn.execute("CREATE AGGREGATE gp_dist.chunk_digests(hash bigint, key bigint) (SFUNC = gp_dist.chunks_add, "
                     "STYPE = internal, SSPACE = 1572864, COMBINEFUNC = gp_dist.chunks_combine, SERIALFUNC = gp_dist.chunks_serialize, "
                     "DESERIALFUNC = gp_dist.chunks_deserialize, FINALFUNC = gp_dist.chunks_final, PARALLEL = SAFE)")
