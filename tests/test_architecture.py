"""The house rules, checked on the import graph of the ``epochal`` source tree (issue 22).

Every ``import`` counts — at module level, inside functions, under ``TYPE_CHECKING``: a
deferred import is still a dependency, and a circle through one is still a circle (two
halves of one module, or a base that reaches into its implementations). ``from P import N``
depends on module ``P.N`` when that is a module, else on ``P`` itself (a name its
``__init__`` defines).

* no import circle among epochal modules;
* pyspark is imported only in the launcher package, ``epochal.runtime.launch``;
* ``epochal/runtime/`` holds sub-packages only (``driver``, ``task``, ``transport``,
  ``launch``), each saying in its docstring what runs there and what it may import — and
  the imports keep to it;
* connectors never import the runtime;
* classes that checkpoints pickle by module path are still found at that path.

The graph is read from the source with ``ast``, not from what an import happens to load.
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from epochal.loops.backedges import strongly_connected

SOURCE = Path(__file__).resolve().parent.parent / "epochal"
RUNTIME = "epochal.runtime"
ROOMS = ("driver", "launch", "task", "transport")
LAUNCHER = "epochal.runtime.launch"


# ---------------------------------------------------------------------- the graph
def modules_of(root: Path) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` under package directory ``root``."""
    mods = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imports(name: str, path: Path) -> list[tuple[str, list[str]]]:
    """``(module, [names])`` of every import statement anywhere in the file (relative ones
    resolved); ``names`` empty for ``import module``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.append((base, [alias.name for alias in node.names]))
    return found


def import_graph(root: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """``(edges, external)``: module → the package's modules it imports, and module → the
    top-level names of other packages it imports (``pyspark``, ``fsspec``, ...)."""
    mods = modules_of(root)
    top = root.name
    edges: dict[str, set[str]] = {m: set() for m in mods}
    external: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for module, names in _imports(m, path):
            if module.split(".")[0] != top:
                external[m].add(module.split(".")[0])
                continue
            targets = []
            for n in names:
                targets.append(f"{module}.{n}" if f"{module}.{n}" in mods else module)
            if not names:
                targets.append(module)
            for t in targets:
                while t not in mods and "." in t:  # `import a.b.Name`-like: the module holding it
                    t = t.rpartition(".")[0]
                if t in mods and t != m:
                    edges[m].add(t)
    return edges, external


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component with more than one module (the
    project's own Tarjan, :func:`epochal.loops.backedges.strongly_connected`), as
    ``[a, b, ..., a]``."""
    components = strongly_connected(sorted(edges), lambda v: sorted(edges[v]))
    return sorted(_circle(edges, set(c)) for c in components if len(c) > 1)


def _circle(edges: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest circle through the component's first module (breadth-first)."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & component):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no circle in {component}")  # pragma: no cover - a component has one


@pytest.fixture(scope="module")
def graph():
    return import_graph(SOURCE)


# ---------------------------------------------------------------------- the rules
def test_no_import_circles(graph):
    edges, _ = graph
    found = cycles(edges)
    assert not found, "import circles (imports inside functions and under TYPE_CHECKING count):\n" + "\n".join(
        " -> ".join(c) for c in found)


def test_pyspark_is_imported_only_in_the_launcher_package(graph):
    _, external = graph
    outside = sorted(m for m, names in external.items()
                     if "pyspark" in names and not (m == LAUNCHER or m.startswith(LAUNCHER + ".")))
    assert not outside, f"pyspark imported outside {LAUNCHER}: {outside}"


def test_runtime_holds_sub_packages_only_each_with_its_rules():
    runtime = SOURCE / "runtime"
    loose = sorted(p.name for p in runtime.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules directly in epochal/runtime/ (put each in a sub-package): {loose}"
    rooms = sorted(p.name for p in runtime.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert rooms == sorted(ROOMS)
    for room in rooms:
        init = runtime / room / "__init__.py"
        assert init.exists(), f"epochal/runtime/{room}/ is not a package"
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import" in doc or "may import" in doc, f"epochal/runtime/{room}/__init__.py: say what it may import"


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if module.startswith(RUNTIME + ".") and len(parts) > 2 else None


def test_the_rooms_import_what_their_docstrings_allow(graph):
    """transport imports no other room; task never driver nor launch; launch never driver;
    the driver reaches into task only for the spec it ships (task.attempt)."""
    edges, _ = graph
    allowed = {"transport": set(), "task": {"transport"}, "launch": {"task", "transport"},
               "driver": {"transport", "task", "launch"}}
    wrong = []
    for m, targets in edges.items():
        room = _room(m)
        for t in targets:
            other = _room(t)
            if room is None or other is None or other == room:
                continue
            if other not in allowed[room] or (room == "driver" and other == "task"
                                              and t != "epochal.runtime.task.attempt"):
                wrong.append(f"{m} -> {t}")
    assert not wrong, "imports across runtime rooms that their docstrings do not allow:\n" + "\n".join(sorted(wrong))


def test_connectors_never_import_the_runtime(graph):
    edges, external = graph
    wrong = sorted(f"{m} -> {t}" for m, ts in edges.items() if m.startswith("epochal.connectors")
                   for t in ts if t == RUNTIME or t.startswith(RUNTIME + "."))
    wrong += sorted(f"{m} -> pyspark" for m, names in external.items()
                    if m.startswith("epochal.connectors") and "pyspark" in names)
    assert not wrong, "connectors import the runtime:\n" + "\n".join(wrong)


#: classes whose instances checkpoints and savepoints hold pickled *by module path* (found
#: by unpickling the state files of jobs with every backend, sink and loop; the task state
#: file, channel state and loop logs are pickles). Moving one strands every checkpoint
#: written before: keep it where it is (re-exporting is not enough, pickle stores the
#: defining module), or add an alias for the old path to the unpickler.
PICKLED_BY_PATH = [
    "epochal.broadcast.state.BroadcastElement",
    "epochal.broadcast.state.BroadcastSnapshot",
    "epochal.sinks.files.FileTransaction",
    "epochal.sinks.log.LogTransaction",
    "epochal.sinks.transactions.TwoPhaseCommitState",
    "epochal.time.assign.GeneratorState",
    "epochal.time.watermarks.WatermarkMark",
]


@pytest.mark.parametrize("path", PICKLED_BY_PATH)
def test_classes_in_checkpoints_keep_their_module_path(path):
    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert (cls.__module__, cls.__qualname__) == (module, name), f"{path} is now defined in {cls.__module__}"


# ---------------------------------------------------------------------- the checker itself
def test_the_checker_finds_circles_through_deferred_and_type_checking_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.base import Base\n")
    (pkg / "sub" / "base.py").write_text("def make():\n    from pkg.sub import impl\n    return impl\n\nclass Base:\n"
                                         "    pass\n")
    (pkg / "sub" / "impl.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                         "    from .base import Base\n")
    (pkg / "leaf.py").write_text("import pkg.sub.impl\nfrom pkg.sub import Base\nimport pyspark.sql\n")
    edges, external = import_graph(pkg)
    assert edges["pkg.sub.base"] == {"pkg.sub.impl"}
    assert edges["pkg.sub.impl"] == {"pkg.sub.base"}
    assert edges["pkg.leaf"] == {"pkg.sub.impl", "pkg.sub"}  # Base is a name of pkg.sub's __init__
    assert external["pkg.leaf"] == {"pyspark"}
    assert cycles(edges) == [["pkg.sub.base", "pkg.sub.impl", "pkg.sub.base"]]
    (pkg / "sub" / "impl.py").write_text("X = 1\n")  # the circle broken: nothing found
    assert cycles(import_graph(pkg)[0]) == []
