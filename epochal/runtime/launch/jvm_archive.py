"""A class-data-sharing (CDS) archive of the classes Spark's JVM loads, for the embedded session.

Starting embedded Spark loads and verifies about ten thousand classes from 280 jars; with
those classes mapped from an archive instead, the session starts in about half the time
(measured 14 s → 6.5 s on 2 busy cores, issue 24). The JVM makes such an archive when told
``-XX:ArchiveClassesAtExit`` (a dynamic archive over the JDK's own base archive) and uses
it with ``-XX:SharedArchiveFile``; an archive that does not match the JVM or the class path
any more is ignored by the JVM (``-Xshare:auto``), never an error.

:func:`java_options` is what the embedded session adds to its JVM options: the archive
when it exists; when it does not, it starts :func:`main` once in a detached, low-priority
process that waits until the starting process exited (at most :data:`WAIT_FOR_PARENT_S`),
runs a throw-away local session with two tasks under ``-XX:ArchiveClassesAtExit`` and
installs the archive atomically when its JVM exited —
so the user's own process never waits for the dump, and later processes start faster.

Archives live in ``$EPOCHAL_JVM_CACHE`` (default ``~/.cache/epochal/jvm``), one per JVM +
Spark + options (the file name is a hash of them). ``EPOCHAL_JVM_CACHE=off`` disables it.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

CACHE_ENV = "EPOCHAL_JVM_CACHE"
#: a generator that has held its lock this long is presumed dead (its lock is taken over)
STALE_LOCK_S = 900.0
#: the generator waits until the process that started it exits, at most this long, so it
#: does not compete for the cores with the job that is starting
WAIT_FOR_PARENT_S = 120.0
#: after a failed attempt to make the archive, the next one waits this long
RETRY_FAILED_S = 86400.0
#: the JVM must say nothing about the archive on the user's terminal
QUIET = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def cache_dir() -> Path | None:
    value = os.environ.get(CACHE_ENV, "")
    if value.strip().lower() in ("off", "0", "false", "no"):
        return None
    return Path(value) if value else Path.home() / ".cache" / "epochal" / "jvm"


def archive_path(base_options: str) -> Path | None:
    """Where the archive for this JVM, this Spark and these options lives (None: disabled)."""
    directory = cache_dir()
    if directory is None:
        return None
    import pyspark

    from epochal.runtime.launch.java import ensure_java

    java = Path(ensure_java()) / "bin" / "java"
    jars = Path(pyspark.__file__).parent / "jars"
    h = hashlib.sha256()
    for part in (str(java.resolve()), _stat(java.resolve()), pyspark.__version__, base_options):
        h.update(part.encode() + b"\0")
    if jars.is_dir():
        for jar in sorted(jars.iterdir()):
            h.update(f"{jar.name}:{_stat(jar)}".encode() + b"\0")
    return directory / f"spark-{pyspark.__version__}-{h.hexdigest()[:16]}.jsa"


def _stat(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return "-"
    return f"{st.st_size}:{int(st.st_mtime)}"


def java_options(base_options: str) -> str:
    """Options to add to the embedded session's JVM: use the archive if it exists, else
    start making it in the background (once) and add nothing."""
    try:
        path = archive_path(base_options)
    except Exception:  # no Java, no pyspark: the session start reports that itself
        return ""
    if path is None:
        return ""
    if path.is_file():
        return f"{QUIET} -XX:SharedArchiveFile={path}"
    _start_generator(path, base_options)
    return ""


def _start_generator(path: Path, base_options: str) -> None:
    lock = path.with_suffix(".lock")
    failed = path.with_suffix(".failed")
    try:
        if time.time() - failed.stat().st_mtime < RETRY_FAILED_S:
            return  # the last attempt on this machine failed recently: do not burn the CPU again
    except FileNotFoundError:
        pass
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if time.time() - lock.stat().st_mtime > STALE_LOCK_S:
                lock.unlink()
        except FileNotFoundError:
            pass
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except OSError:  # another process generates it, or the cache is not writable
        return
    os.close(fd)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("PYSPARK_GATEWAY_SECRET", None)
    subprocess.Popen([sys.executable, "-m", "epochal.runtime.launch.jvm_archive", str(path), base_options,
                      str(os.getpid())],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, env=env, preexec_fn=lambda: os.nice(10))


def generate(path: Path, base_options: str) -> bool:
    """Run a throw-away local session under ``-XX:ArchiveClassesAtExit`` and install the
    archive at ``path`` once its JVM exited. Returns whether it did."""
    from pyspark.sql import SparkSession

    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    os.environ["SPARK_LAUNCHER_OPTS"] = base_options
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (SparkSession.builder.master("local[2]").appName("epochal-jvm-archive")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.extraJavaOptions", f"{base_options} {QUIET} -XX:ArchiveClassesAtExit={tmp}")
               .getOrCreate())
    sc = session.sparkContext
    sc.setLogLevel("FATAL")
    sc.parallelize(range(2), 2).barrier().mapPartitions(lambda it: [sum(it)]).collect()  # scheduler classes
    proc = sc._gateway.proc
    session.stop()
    proc.stdin.close()  # the gateway JVM exits on EOF (System.exit: the archive is dumped)
    proc.wait(600)
    if not tmp.is_file() or tmp.stat().st_size == 0:
        return False
    os.replace(tmp, path)
    return True


def _wait_for(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.5)


def main() -> None:
    path, base_options, parent = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    ok = False
    try:
        _wait_for(parent, WAIT_FOR_PARENT_S)
        ok = generate(path, base_options)
    finally:
        if not ok:
            path.with_suffix(".failed").write_text(f"{time.time()}\n")
        for leftover in path.parent.glob(f"{path.name}.{os.getpid()}.tmp"):
            leftover.unlink(missing_ok=True)
        path.with_suffix(".lock").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
