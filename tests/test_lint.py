"""The code base stays lint-clean and its public modules type-check (issue 35): ``ruff check``
over ``epochal/`` and ``mypy`` over the modules ``[tool.mypy] files`` names (configured in
pyproject.toml). ``epochal/py.typed`` tells type checkers of users the package is typed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _run(module: str, *args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    pytest.importorskip(module, reason=f"{module} is not installed (pip install -e '.[lint]')")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_ruff_is_clean_over_the_package(tmp_path):
    proc = _run("ruff", "check", "--no-cache", "epochal", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_mypy_is_clean_over_the_public_modules(tmp_path):
    proc = _run("mypy", "--cache-dir", str(tmp_path / "mypy-cache"), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Success" in proc.stdout


def test_the_package_says_it_is_typed():
    assert (REPO / "epochal" / "py.typed").exists()
