"""The jars of the test broker (Apache Kafka, tests/kafka/pom.xml), resolved from Maven Central
into a cache outside the work tree: ``~/.cache/epochal/kafka-<version>/libs``.

:func:`resolve` is idempotent: once the folder exists it returns at once and runs nothing. The
first call runs ``mvn dependency:copy-dependencies`` into a temporary folder beside the cache
and renames it into place, so a run that is killed half-way leaves no half-filled ``libs``
that a later run would trust; two processes resolving at once both succeed (the loser of the
rename drops its copy).

Pre-resolve (CI, a clean machine): ``python tests/kafka_broker.py prepare`` (the jars, then the
broker's class-data-sharing archive).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

KAFKA_VERSION = "4.1.1"  # keep equal to <kafka.version> in tests/kafka/pom.xml
POM = Path(__file__).resolve().parent / "kafka" / "pom.xml"
LOG4J2_CONFIG = POM.parent / "log4j2.properties"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/epochal/kafka-<version>``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "epochal" / f"kafka-{KAFKA_VERSION}"


def libs_dir() -> Path:
    return cache_dir() / "libs"


def missing_tools() -> str | None:
    """Why the broker cannot run here (no Java, or no Maven and no resolved jars), or None."""
    if shutil.which("java") is None:
        return "Java is not installed (the Kafka test broker needs java 17+ on PATH)"
    if not libs_dir().is_dir() and shutil.which("mvn") is None:
        return (f"Maven is not installed and the Kafka broker's jars are not resolved into {libs_dir()} "
                f"(install maven, then run: python tests/kafka_broker.py prepare)")
    return None


def resolve() -> Path:
    """The folder of the broker's jars, resolving them first if needed (see the module doc).
    Raises RuntimeError quoting Maven's output when resolution fails."""
    libs = libs_dir()
    if libs.is_dir():
        return libs
    libs.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="libs-", dir=libs.parent))
    tmp.chmod(0o755)
    try:
        proc = subprocess.run(
            ["mvn", "-q", "-B", "-f", str(POM), f"{DEPENDENCY_PLUGIN}:copy-dependencies",
             f"-DoutputDirectory={tmp}", "-DincludeScope=runtime"],
            cwd=tmp, capture_output=True, text=True, timeout=900)
        jars = sorted(p.name for p in tmp.glob("*.jar"))
        if proc.returncode != 0 or not any(j.startswith("kafka_2.13-") for j in jars):
            raise RuntimeError(f"resolving the Kafka broker's jars with {POM} failed (exit {proc.returncode}, "
                               f"{len(jars)} jars): {(proc.stdout + proc.stderr)[-3000:]}")
        try:
            tmp.rename(libs)
        except OSError:
            if not libs.is_dir():  # not a concurrent resolver's win: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return libs
