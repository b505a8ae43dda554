"""The Iceberg sink's commit and recovery decisions, as pure functions (no catalog, no clock).

Iceberg tells a writer which epochs it holds through **snapshot summaries**: every epoch
commit of sink subtask ``s`` is one snapshot whose summary carries
``epochal.app-id = <prefix>-<lineage>-<s>`` and ``epochal.epoch = <epoch>`` (:func:`summary`), so the
committed epoch of an app id is the epoch of the newest snapshot *in the current
snapshot's ancestry* that names it (:func:`committed_epochs`; seed 004 §4.1.3.1: recovery
asks the external system). Flink's Iceberg committer finds its last checkpoint id the same
way. ``expire_snapshots`` removes old snapshots, summaries included: so every epoch commit
also sets the table property :func:`property_key` of its app id in the same catalog commit,
and a walk that runs into expired history takes the answer from it. The walk comes first
because a rollback of the table (``manage_snapshots().rollback_to``, to rewind it to a
savepoint) moves the current snapshot back but not the properties.

App ids name the run (:mod:`epochal.epochs.lineage`): ``<prefix>-<lineage>-<subtask>``, as
the Delta sink's. Every run adds one such property per sink subtask, so a job rerun many
times would grow the table's properties without bound: the commits also keep the list of
the prefix's most recent lineages (:func:`lineages_key`, newest last) and drop the
properties of lineages beyond the newest ``keep`` (:func:`pruned_properties`) — never those
of the committing run or of the run it restored. A restore that needs a dropped record
(its lineage was pruned *and* its snapshots expired) cannot tell what the table holds:
:func:`forgotten` says so, and the writer refuses rather than guess.

Everything else — deciding to commit or skip an epoch, the restore check, which staged
files are orphans — is the same decision as the Delta sink's, with the committed epoch in
place of ``transaction_version``; it is re-exported from
:mod:`epochal.connectors.delta.recovery` (a pure module; importing it needs no client).

Why ``commit.retry.num-retries=0``: pyiceberg retries a commit that lost the catalog's
compare-and-swap by re-applying the append on the new table state (measured: a stale
writer's epoch appended twice). Without retries the loser gets ``CommitFailedException``,
reloads the table, asks :func:`committed_epochs` again and skips the epoch a concurrent
writer (a zombie re-committing the same handle) already added.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from epochal.connectors.delta.recovery import (  # re-exported: the shared decisions
    Decision,
    ahead_of_restore,
    app_id,
    decide,
    name_tag,
    orphans,
    owns,
    parse_app_id,
    parse_name,
    recovery_plan,
    reproduced,
    staged_name,
)

__all__ = ["APP_ID", "EPOCH", "EXPIRED", "forgotten", "lineages_key", "maybe_pruned", "pruned_properties", "pruned_key", "Decision", "ahead_of_restore", "app_id", "committed_epochs", "decide",
           "name_tag", "orphans", "owns", "parse_app_id", "parse_name", "property_key", "recorded_epochs", "recovery_plan",
           "reproduced", "staged_name", "summary"]

APP_ID = "epochal.app-id"
EPOCH = "epochal.epoch"

#: the last item of an ancestry whose older snapshots were expired (see :func:`committed_epochs`)
EXPIRED: Mapping[str, str] = MappingProxyType({"expired": "true"})


def summary(app: str, epoch: int, job: str, sink: str, generation: int) -> dict[str, str]:
    """The snapshot summary properties of an epoch commit."""
    return {APP_ID: app, EPOCH: str(epoch), "epochal.job": job, "epochal.sink": sink,
            "epochal.generation": str(generation)}


def committed_epochs(ancestry: Iterable[tuple[int, Mapping[str, str] | None]], apps: Iterable[str],
                     known: tuple[int, Mapping[str, int | None]] | None = None,
                     recorded: Mapping[str, int] | None = None) -> dict[str, int | None]:
    """The committed epoch of each app id in ``apps`` (None: none).

    ``ancestry``: ``(snapshot id, summary properties)`` of the current snapshot and its
    ancestors, newest first (a lazy iterable: the walk stops as soon as every app id was
    found); a last item ``(parent id, EXPIRED)`` says the history goes on but its snapshots
    were expired. ``known``: ``(snapshot id, epochs)`` from an earlier walk — reaching that
    snapshot, the app ids in ``epochs`` take their answer from it (a writer walks only the
    snapshots added since its last look); the others walk on. ``recorded``: app id → epoch
    of the table properties (:func:`property_key`), the answer for an app id the walk did not
    find before expired snapshots. A summary without the properties, or with a malformed
    epoch, names no app id.
    """
    todo = set(apps)
    found: dict[str, int | None] = {}
    for snapshot_id, props in ancestry if todo else ():
        if props is EXPIRED:
            for app in todo:
                found[app] = (recorded or {}).get(app)
            todo = set()
            break
        if known is not None and snapshot_id == known[0]:
            for app in [a for a in todo if a in known[1]]:
                found[app] = known[1][app]
                todo.discard(app)
            if not todo:
                break
        app = (props or {}).get(APP_ID)
        if app in todo:
            try:
                found[app] = int(props[EPOCH])
            except (KeyError, TypeError, ValueError):
                continue
            todo.discard(app)
            if not todo:
                break
    for app in todo:
        found[app] = None
    return found


def property_key(app: str) -> str:
    """The table property holding the last epoch committed under ``app``, set atomically
    with the epoch's snapshot: it outlives ``expire_snapshots``."""
    return f"{EPOCH}.{app}"


def recorded_epochs(properties: Mapping[str, str]) -> dict[str, int]:
    """App id → epoch of the table properties written by :func:`property_key`."""
    out = {}
    prefix = EPOCH + "."
    for key, value in properties.items():
        if key.startswith(prefix):
            try:
                out[key[len(prefix):]] = int(value)
            except (TypeError, ValueError):
                continue
    return out


LINEAGES = "epochal.lineages"
PRUNED = "epochal.pruned"


def lineages_key(prefix: str) -> str:
    """The table property listing the most recent lineages of ``prefix``, newest last."""
    return f"{LINEAGES}.{prefix}"


def pruned_key(prefix: str) -> str:
    """The table property naming the lineages of ``prefix`` whose records were dropped: a
    Bloom filter of :data:`BLOOM_BITS` bits in hex (fixed size, however many runs were
    pruned; it may answer "pruned" for a lineage that was not, never the other way)."""
    return f"{PRUNED}.{prefix}"


#: bits of the pruned-lineages Bloom filter (512 hex digits; 3 hashes: 0.2 % false
#: "pruned" answers after 100 pruned runs)
BLOOM_BITS = 2048


def _bloom_positions(lineage: str) -> list[int]:
    digest = hashlib.sha256(lineage.encode()).digest()
    return [int.from_bytes(digest[4 * i:4 * i + 4], "big") % BLOOM_BITS for i in range(3)]


def _bloom(text: str) -> int:
    try:
        return int(text, 16) if text else 0
    except ValueError:
        return 0


def _bloom_with(text: str, lineages: Iterable[str]) -> str:
    bits = _bloom(text)
    for lineage in lineages:
        for position in _bloom_positions(lineage):
            bits |= 1 << position
    return f"{bits:0{BLOOM_BITS // 4}x}"


def maybe_pruned(properties: Mapping[str, str], prefix: str, lineage: str) -> bool:
    """Whether ``lineage``'s records may have been dropped (the Bloom filter of
    :func:`pruned_key`)."""
    bits = _bloom(properties.get(pruned_key(prefix), ""))
    return all(bits >> position & 1 for position in _bloom_positions(lineage))


def _recorded_lineages(properties: Mapping[str, str], prefix: str) -> dict[str, list[str]]:
    """Lineage → the keys of its :func:`property_key` records under ``prefix`` (the legacy
    lineage "" is left out: it is never pruned)."""
    out: dict[str, list[str]] = {}
    for key in properties:
        if key.startswith(EPOCH + "."):
            parsed = parse_app_id(prefix, key[len(EPOCH) + 1:])
            if parsed is not None and parsed[0]:
                out.setdefault(parsed[0], []).append(key)
    return out


def pruned_properties(properties: Mapping[str, str], prefix: str, lineage: str, keep: int,
                      protect: Iterable[str] = ()) -> tuple[dict[str, str], list[str]]:
    """The property changes an epoch commit under ``lineage`` makes besides its own record:
    ``(properties to set, property keys to remove)``.

    The lineages of ``prefix`` are ordered oldest first: lineages with records but not in the
    list (tables written before the list existed) first, then the list, with ``lineage``
    moved to the end. Beyond the newest ``keep``, the oldest lineages' records are dropped,
    except ``lineage`` and ``protect`` (the run's parent: a failure restart may restore its
    checkpoint again). Nothing changes when ``lineage`` is newest already (the common case:
    every commit of a run after its first)."""
    key = lineages_key(prefix)
    listed = [x for x in properties.get(key, "").split(",") if x]
    recorded = _recorded_lineages(properties, prefix)
    order = sorted(x for x in recorded if x not in listed and x != lineage) + [x for x in listed if x != lineage]
    order.append(lineage)
    if order == listed:
        return {}, []
    keeping = set(protect) | {lineage}
    drop: list[str] = []
    for old in order:
        if len(order) - len(drop) <= keep:
            break
        if old not in keeping:
            drop.append(old)
    changes = {key: ",".join(x for x in order if x not in drop)}
    if drop:
        changes[pruned_key(prefix)] = _bloom_with(properties.get(pruned_key(prefix), ""), drop)
    return changes, sorted(k for old in drop for k in recorded.get(old, []))


def forgotten(properties: Mapping[str, str], prefix: str, app: str) -> bool:
    """Whether the record of ``app`` may have been dropped by :func:`pruned_properties`:
    ``app``'s lineage is neither listed nor recorded, and :func:`maybe_pruned`."""
    parsed = parse_app_id(prefix, app)
    if parsed is None or not parsed[0] or property_key(app) in properties:
        return False
    listed = properties.get(lineages_key(prefix), "").split(",")
    return parsed[0] not in listed and maybe_pruned(properties, prefix, parsed[0])
