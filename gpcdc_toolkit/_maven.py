"""Java libraries from Maven Central, resolved once into a cache by Maven itself.

A set of artifacts (the Kafka broker; Spark's Kafka connector) is written as a small
``pom.xml`` under the cache, and ``mvn dependency:copy-dependencies`` copies the
artifacts with their runtime dependencies beside it. A stamp names what was resolved,
so later calls read the directory and run nothing. The cache is ``$GPCDC_JARS_DIR``,
else ``~/.cache/gpcdc/jars``; processes resolving the same set at once take turns on a
file lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .errors import GpcdcError


class JarsError(GpcdcError):
    """Maven is missing, or could not resolve an artifact."""


def jars_dir() -> Path:
    configured = os.environ.get("GPCDC_JARS_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "gpcdc" / "jars"


def _pom(name: str, artifacts: Sequence[str]) -> str:
    deps = []
    for coordinate in artifacts:
        group, artifact, version = coordinate.split(":")
        deps.append(f"    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
                    f"<version>{version}</version></dependency>")
    return ("<project xmlns=\"http://maven.apache.org/POM/4.0.0\">\n  <modelVersion>4.0.0</modelVersion>\n"
            f"  <groupId>gpcdc</groupId><artifactId>{name}</artifactId><version>1</version>"
            "<packaging>pom</packaging>\n  <dependencies>\n" + "\n".join(deps) + "\n  </dependencies>\n</project>\n")


def resolve(name: str, artifacts: Sequence[str], *, timeout: float = 900.0) -> list[Path]:
    """The jars of ``artifacts`` (``group:artifact:version``) and of their runtime
    dependencies, sorted by file name; resolved by Maven the first time only."""
    pom = _pom(name, artifacts)
    home = jars_dir() / name
    libs, stamp = home / "libs", home / "resolved"
    digest = hashlib.sha256(pom.encode()).hexdigest()
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (stamp.is_file() and stamp.read_text() == digest):
            _copy_dependencies(home, pom, libs, timeout)
            stamp.write_text(digest)
    return sorted(libs.glob("*.jar"))


def _copy_dependencies(home: Path, pom: str, libs: Path, timeout: float) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsError("Maven (mvn) is not installed; it fetches the Java libraries from Maven Central",
                        fix="run ./dev setup, or install it (apt-get install maven)")
    (home / "pom.xml").write_text(pom)
    shutil.rmtree(libs, ignore_errors=True)
    command = [mvn, "-B", "-q", "-U", "-f", str(home / "pom.xml"), "dependency:copy-dependencies",
               "-DincludeScope=runtime", f"-DoutputDirectory={libs}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise JarsError(f"Maven did not resolve {home.name} within {timeout:g} s",
                        fix="check that Maven Central (repo.maven.apache.org) is reachable") from None
    if done.returncode != 0:
        errors = [line.removeprefix("[ERROR] ") for line in done.stdout.splitlines() if line.startswith("[ERROR] ")]
        first = next((e for e in errors if e.strip()), done.stderr.strip() or f"exit status {done.returncode}")
        raise JarsError(f"Maven could not resolve {home.name}: {first}",
                        fix="check that Maven Central is reachable; see " + str(home / "pom.xml"))
