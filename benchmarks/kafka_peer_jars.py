"""The peer engines' Kafka connectors for the side-by-side Kafka benchmark, resolved from Maven
Central into a cache outside the work tree (as ``tests/kafka_jars.py`` does for the broker):

* Spark's own connector, ``spark-sql-kafka-0-10_2.13`` (``tests/kafka/spark/pom.xml``), into
  ``~/.cache/epochal/spark-sql-kafka-<version>/libs`` — only the jars pyspark does not ship
  (the connector, its token provider, ``kafka-clients``, ``commons-pool2``), for ``spark.jars``;
* Flink's, ``flink-sql-connector-kafka`` (``tests/kafka/flink/pom.xml``, a shaded jar holding
  ``kafka-clients``), into ``~/.cache/epochal/flink-sql-connector-kafka-<version>/libs``, for
  PyFlink's ``pipeline.jars``;
* PyFlink itself: ``apache-flink==FLINK_VERSION`` in a virtualenv of its own
  (``~/.cache/epochal/pyflink-<version>``): apache-beam pins cloudpickle 2.2, epochal needs 3.

Every step is idempotent: once its folder exists (the virtualenv: once its ``pyflink``
answers with ``FLINK_VERSION``) it returns at once and runs nothing. Jars are resolved into a
temporary folder renamed into place, so a killed run leaves no half-filled ``libs``; a
half-finished virtualenv fails the version check and is installed again. Each returns ``(path, None)`` or ``(None, why it is not available)`` —
the benchmark records the reason instead of the engine's figures.

    python benchmarks/kafka_peer_jars.py      # resolve all three, print where they are
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPARK_POM = ROOT / "tests" / "kafka" / "spark" / "pom.xml"
FLINK_POM = ROOT / "tests" / "kafka" / "flink" / "pom.xml"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
#: Spark's Kafka connector is published for Spark releases; pyspark here may be newer than
#: the newest one Maven Central serves: these are tried in order, the first that resolves wins
SPARK_FALLBACK_VERSIONS = ("4.2.0", "4.1.1")
#: the jars Spark's connector adds to what pyspark ships (the rest of its runtime
#: dependencies — hadoop client, scala, lz4, snappy, slf4j — are pyspark's own)
SPARK_CONNECTOR_JARS = ("spark-sql-kafka-0-10_", "spark-token-provider-kafka-0-10_", "kafka-clients-",
                        "commons-pool2-")
FLINK_VERSION = "2.2.0"  # apache-flink on PyPI; its connector is <connector.version> in FLINK_POM
FLINK_CONNECTOR_VERSION = "5.0.0-2.2"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "epochal"


def _copy_dependencies(pom: Path, dest: Path, props: dict[str, str], transitive: bool) -> tuple[Path | None, str | None]:
    """``mvn dependency:copy-dependencies`` of ``pom`` into ``dest`` (once)."""
    if dest.is_dir() and any(dest.glob("*.jar")):
        return dest, None
    if shutil.which("mvn") is None:
        return None, f"Maven is not installed (needed once to resolve {pom.parent.name}'s jars into {dest})"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="libs-", dir=dest.parent))
    try:
        cmd = ["mvn", "-q", "-B", "-f", str(pom), f"{DEPENDENCY_PLUGIN}:copy-dependencies",
               f"-DoutputDirectory={tmp}", "-DincludeScope=runtime",
               *(f"-D{k}={v}" for k, v in props.items())]
        if not transitive:
            cmd.append("-DexcludeTransitive=true")
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0 or not any(tmp.glob("*.jar")):
            tail = " ".join(line for line in (proc.stdout + proc.stderr).splitlines() if "ERROR" in line)[:600]
            return None, f"resolving {pom} ({props}) failed, exit {proc.returncode}: {tail}"
        try:
            tmp.rename(dest)
        except OSError:
            if not dest.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest, None


def spark_connector(pyspark_version: str) -> tuple[list[str] | None, str | None, str | None]:
    """Spark's Kafka connector jars for ``spark.jars``: ``(jars, connector version, why not)``.
    The connector at pyspark's own version first; where Maven Central has none, the newest
    of :data:`SPARK_FALLBACK_VERSIONS` that resolves (the version used is returned: the
    benchmark records it beside pyspark's)."""
    reasons = []
    for version in (pyspark_version, *[v for v in SPARK_FALLBACK_VERSIONS if v != pyspark_version]):
        libs, why = _copy_dependencies(SPARK_POM, cache_root() / f"spark-sql-kafka-{version}" / "libs",
                                       {"spark.version": version}, transitive=True)
        if libs is None:
            reasons.append(f"{version}: {why}")
            continue
        jars = sorted(str(p) for p in libs.glob("*.jar") if p.name.startswith(SPARK_CONNECTOR_JARS))
        return jars, version, None
    return None, None, "spark-sql-kafka-0-10_2.13 could not be resolved: " + "; ".join(reasons)


def flink_connector() -> tuple[list[str] | None, str | None]:
    libs, why = _copy_dependencies(FLINK_POM, cache_root() / f"flink-sql-connector-kafka-{FLINK_CONNECTOR_VERSION}"
                                   / "libs", {"connector.version": FLINK_CONNECTOR_VERSION}, transitive=False)
    return (sorted(str(p) for p in libs.glob("*.jar")), None) if libs else (None, why)


def pyflink_python() -> tuple[str | None, str | None]:
    """The interpreter of PyFlink's own virtualenv (created, with ``apache-flink``, once):
    ``EPOCHAL_FLINK_PYTHON`` if set, else ``~/.cache/epochal/pyflink-<version>/bin/python``."""
    explicit = os.environ.get("EPOCHAL_FLINK_PYTHON")
    if explicit:
        return (explicit, None) if Path(explicit).exists() else (None, f"EPOCHAL_FLINK_PYTHON={explicit} does not exist")
    venv = cache_root() / f"pyflink-{FLINK_VERSION}"
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import pyflink.version as v; print(v.__version__)"]
    if python.exists() and subprocess.run(check, capture_output=True, text=True).stdout.strip() == FLINK_VERSION:
        return str(python), None
    # installed in place: a half-finished install fails the version check above and is redone
    steps = [[sys.executable, "-m", "venv", "--clear", str(venv)],
             [str(python), "-m", "pip", "install", "-q", f"apache-flink=={FLINK_VERSION}"]]
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            return None, (f"PyFlink could not be installed ({' '.join(step[-2:])} exit {proc.returncode}): "
                          f"{(proc.stdout + proc.stderr)[-600:]}")
    return str(python), None


def pyspark_version() -> str:
    import pyspark

    return re.match(r"\d+\.\d+\.\d+", pyspark.__version__).group(0)


if __name__ == "__main__":
    print("spark", spark_connector(pyspark_version()))
    print("flink", flink_connector())
    print("pyflink", pyflink_python())
