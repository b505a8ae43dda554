"""The Iceberg sink's commit and recovery decisions, as pure functions (no catalog, no clock).

Iceberg tells a writer which epochs it holds through **snapshot summaries**: every epoch
commit of sink subtask ``s`` is one snapshot whose summary carries
``epochal.app-id = <prefix>-<s>`` and ``epochal.epoch = <epoch>`` (:func:`summary`), so the
committed epoch of an app id is the epoch of the newest snapshot *in the current
snapshot's ancestry* that names it (:func:`committed_epochs`; seed 004 §4.1.3.1: recovery
asks the external system). Flink's Iceberg committer finds its last checkpoint id the same
way.

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

from collections.abc import Iterable, Mapping

from epochal.connectors.delta.recovery import (  # re-exported: the shared decisions
    Decision,
    ahead_of_restore,
    app_id,
    decide,
    name_tag,
    orphans,
    owns,
    parse_name,
    recovery_plan,
    staged_name,
)

__all__ = ["APP_ID", "EPOCH", "Decision", "ahead_of_restore", "app_id", "committed_epochs", "decide", "name_tag",
           "orphans", "owns", "parse_name", "recovery_plan", "staged_name", "summary"]

APP_ID = "epochal.app-id"
EPOCH = "epochal.epoch"


def summary(app: str, epoch: int, job: str, sink: str, generation: int) -> dict[str, str]:
    """The snapshot summary properties of an epoch commit."""
    return {APP_ID: app, EPOCH: str(epoch), "epochal.job": job, "epochal.sink": sink,
            "epochal.generation": str(generation)}


def committed_epochs(ancestry: Iterable[tuple[int, Mapping[str, str] | None]], apps: Iterable[str],
                     known: tuple[int, Mapping[str, int | None]] | None = None) -> dict[str, int | None]:
    """The committed epoch of each app id in ``apps`` (None: none).

    ``ancestry``: ``(snapshot id, summary properties)`` of the current snapshot and its
    ancestors, newest first (a lazy iterable: the walk stops as soon as every app id was
    found). ``known``: ``(snapshot id, epochs)`` from an earlier walk — reaching that
    snapshot, the rest of the answer is ``epochs`` (a writer walks only the snapshots added
    since its last commit). A summary without the properties, or with a malformed epoch,
    names no app id.
    """
    todo = set(apps)
    found: dict[str, int | None] = {}
    if not todo:
        return found
    for snapshot_id, props in ancestry:
        if known is not None and snapshot_id == known[0]:
            for app in todo:
                found[app] = known[1].get(app)
            todo = set()
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
