"""What ``epochal.eventual`` may import (read from the source like ``tests/test_architecture.py``).

The protocol modules (records, log, operator_state, extent, recovery, runner): the errors,
pickling, the durability and signing helpers — never the runtime, pyspark, or the engine's
operators, so the protocol stays testable without processes. The three integration modules
(``pipeline``: the ``Eventual`` option and its builder; ``chain``: the operators before key_by;
``source``: the operator as a source of
the job) may also use the graph layer — streams, graph, sources, windows' assigners and
functions, time units, key hashing — and still never the runtime. Only ``epochal.dataflow``
(which imports every builder) and ``epochal`` (which exports ``Eventual``) import the package."""
from __future__ import annotations

from test_architecture import SOURCE, import_graph

PACKAGE = "epochal.eventual"
ALLOWED = {"epochal.errors", "epochal.serde", "epochal.durable", "epochal.backends.signing"}
INTEGRATION = {f"{PACKAGE}.pipeline", f"{PACKAGE}.source", f"{PACKAGE}.chain"}
GRAPH_LAYER = {"epochal.graph", "epochal.streams", "epochal.sources.base", "epochal.sources.collection",
               "epochal.time.units", "epochal.windows.assigners", "epochal.windows.functions",
               "epochal.backends.keygroups"}
EXTERNAL = {"__future__", "collections", "dataclasses", "enum", "fsspec", "hashlib", "heapq", "hmac", "itertools",
            "json", "struct", "time", "typing"}


def test_eventual_imports_only_its_allowed_helpers():
    edges, external = import_graph(SOURCE)
    mods = [m for m in edges if m == PACKAGE or m.startswith(PACKAGE + ".")]
    assert len(mods) >= 9
    wrong = sorted(f"{m} -> {t}" for m in mods for t in edges[m]
                   if not (t.startswith(PACKAGE + ".") or t == PACKAGE or t in ALLOWED
                           or (m in INTEGRATION and t in GRAPH_LAYER)))
    wrong += sorted(f"{m} -> {x}" for m in mods for x in external[m] if x not in EXTERNAL)
    assert not wrong, "epochal.eventual imports outside its room:\n" + "\n".join(wrong)


def test_only_the_builder_registry_and_the_export_import_eventual():
    edges, _ = import_graph(SOURCE)
    users = sorted(m for m, ts in edges.items() if not m.startswith(PACKAGE)
                   for t in ts if t == PACKAGE or t.startswith(PACKAGE + "."))
    assert sorted(set(users)) == ["epochal", "epochal.dataflow"], f"the engine imports epochal.eventual: {users}"
