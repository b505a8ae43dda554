"""What ``epochal.eventual`` may import (read from the source like ``tests/test_architecture.py``):
the errors, pickling, the durability and signing helpers — never the runtime, pyspark, or
the engine's operators, so the engine can import it (a builder registering itself) without a
circle, and its protocol stays testable without processes."""
from __future__ import annotations

from test_architecture import SOURCE, import_graph

PACKAGE = "epochal.eventual"
ALLOWED = {"epochal.errors", "epochal.serde", "epochal.durable", "epochal.backends.signing"}
EXTERNAL = {"__future__", "collections", "dataclasses", "enum", "fsspec", "hashlib", "heapq", "hmac", "itertools",
            "json", "struct", "time", "typing"}


def test_eventual_imports_only_its_allowed_helpers():
    edges, external = import_graph(SOURCE)
    mods = [m for m in edges if m == PACKAGE or m.startswith(PACKAGE + ".")]
    assert len(mods) >= 7
    wrong = sorted(f"{m} -> {t}" for m in mods for t in edges[m]
                   if not (t.startswith(PACKAGE + ".") or t == PACKAGE or t in ALLOWED))
    wrong += sorted(f"{m} -> {x}" for m in mods for x in external[m] if x not in EXTERNAL)
    assert not wrong, "epochal.eventual imports outside its room:\n" + "\n".join(wrong)


def test_nothing_of_the_engine_imports_eventual_yet():
    """True until the integration: then only the public ``Eventual`` option's module may,
    and this test says which."""
    edges, _ = import_graph(SOURCE)
    users = sorted(m for m, ts in edges.items() if not m.startswith(PACKAGE)
                   for t in ts if t == PACKAGE or t.startswith(PACKAGE + "."))
    assert not users, f"the engine imports epochal.eventual (register a builder instead): {users}"
