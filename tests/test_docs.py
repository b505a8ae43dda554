"""The documentation site builds without a warning (issue 35): ``mkdocs build --strict`` fails
on a broken link or anchor between pages, a page missing from the nav, a snippet of an
example that does not exist, or an API reference to a module that does not import."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed (pip install -e '.[docs]')")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    site = tmp_path / "site"
    assert (site / "dashboard" / "index.html").exists() and (site / "img" / "dashboard.png").exists()
    for view in ("operator", "checkpoint", "exceptions", "offline"):  # a screenshot per dashboard view
        assert (site / "img" / f"dashboard-{view}.png").exists(), view
    assert "epoch" in (site / "concepts" / "index.html").read_text()
    for recipe, code in (("windows", "allowed_lateness"), ("joins", "temporal_join"), ("regions", "payments_region"),
                         ("queryable-state", "QueryClient"), ("savepoints", "stop_with_savepoint")):
        assert code in (site / "how-to" / recipe / "index.html").read_text(), recipe  # the snippet was cut in
    api = (site / "api" / "config" / "index.html").read_text()
    assert "MetricsConfig" in api and "ui_token" in api  # generated from the docstrings
    _no_raw_markup(site)
    readme_lines = (REPO / "README.md").read_text().count("\n")
    assert readme_lines < 250, f"README.md has {readme_lines} lines: it is the front door, the pages hold the rest"


#: what a docstring's reStructuredText leaves in HTML when nothing renders it
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj|const|type|ref):`?")
_CODE = re.compile(r"<(pre|code)\b.*?</\1>", re.DOTALL)


def _no_raw_markup(site: Path) -> None:
    """Every page of the API reference shows roles as links or code and doctests as code
    blocks (docs/griffe_markup.py): outside ``<pre>``/``<code>`` no ``:class:`` role, no
    ``>>>`` prompt, no block quote (a doctest's prompts read as Markdown), and no private
    placeholder as a default value."""
    pages = sorted((site / "api").glob("*/index.html"))
    assert len(pages) >= 9, pages
    problems = []
    for page in pages:
        whole = page.read_text()
        prose = _CODE.sub("", whole)
        for what, pattern, text in (("a raw role", _ROLE, prose), ("a doctest prompt", re.compile("&gt;&gt;&gt;"), prose),
                                    ("a block quote", re.compile("<blockquote"), prose),
                                    ("a private default", re.compile(r"=\s*(?:<[^>]*>)*_MISSING"), whole)):
            found = pattern.findall(text)
            if found:
                problems.append(f"{page.parent.name}: {len(found)} x {what}")
    assert not problems, problems


def test_getting_started_runs_as_written():
    """docs/getting-started.md builds examples/first_pipeline.py piece by piece and quotes its
    output: the script runs (local runtime: the page's pipeline, not Spark's start-up, is what is
    checked here; the README's example runs on Spark), its committed output equals the
    plain-Python count, and the lines the page quotes are the ones it prints."""
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "first_pipeline.py")], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "EPOCHAL_RUNTIME": "local"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    printed = proc.stdout.strip().splitlines()[-2:]
    assert printed[-1] == "equal to a plain-Python count: True", printed
    page = (REPO / "docs" / "getting-started.md").read_text()
    for line in printed:
        assert line in page, f"the page does not quote the script's output line {line!r}"


def test_how_to_pages_show_only_code_the_suite_runs():
    """Every ``python`` block of docs/how-to/*.md is a snippet of an example (no hand-written
    code that could drift), each section it cuts exists in the file (the strict build fails
    otherwise), and tests/test_examples_howto.py runs every example those pages cut from."""
    pages = sorted((REPO / "docs" / "how-to").glob("*.md"))
    assert len(pages) >= 5, pages
    runs = set(re.findall(r'load\("(\w+)"\)', (REPO / "tests" / "test_examples_howto.py").read_text()))
    problems, cut = [], set()
    for page in pages:
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL):
            for line in block.strip().splitlines():
                m = re.fullmatch(r'--8<-- "examples/(\w+)\.py(?::(\w+))?"', line.strip())
                if not m:
                    problems.append(f"{page.name}: hand-written code {line.strip()!r}")
                    continue
                cut.add(m.group(1))
                source = (REPO / "examples" / f"{m.group(1)}.py").read_text()
                if m.group(2) and f"# --8<-- [start:{m.group(2)}]" not in source:
                    problems.append(f"{page.name}: no section {m.group(2)!r} in examples/{m.group(1)}.py")
    assert not problems, problems
    assert cut and cut <= runs, f"examples the how-to pages cut from but no test runs: {sorted(cut - runs)}"


def test_pages_speak_of_the_product_not_its_history():
    """No page of the site tells the project's history ("issue 24", "before issue 36"): a
    reader cannot open the tracker. Another project's bug (``delta-rs issue 2184``) may be named."""
    found = []
    for page in sorted((REPO / "docs").rglob("*.md")):
        for m in re.finditer(r"(\S+\s+)?\b[Ii]ssues?\s+\d+", page.read_text()):
            if not (m.group(1) or "").strip().endswith("delta-rs"):
                found.append(f"{page.relative_to(REPO)}: {m.group(0).strip()!r}")
    assert not found, found
