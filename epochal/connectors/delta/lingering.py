"""``epochal sinks lingering`` for a :class:`~epochal.connectors.delta.sink.DeltaSink`: the
staged data files a stopped job's runs left in the table that no version references
(:mod:`epochal.connectors.leftovers` says which, and which a checkpoint still promises).

The runs looked at: those the job's completed checkpoints name
(:class:`~epochal.sinks.lingering.Promised`) and those the table's commit history names
(``epochal.lineage`` of the job's and sink's commits). Called on the driver or the command
line while the job is stopped.
"""
from __future__ import annotations

from epochal.connectors import leftovers
from epochal.connectors.delta import client, recovery
from epochal.sinks.lingering import Lingering


def find(sink, job: str, name: str, promised) -> tuple[list[Lingering], object, set[str]]:
    """``(lingering items, the table's files, paths the current version references)`` of
    ``sink`` (job ``job``'s sink operator ``name``)."""
    what = f"sink {name!r} ({sink!r})"
    files = client.table_files(sink.table_uri, sink.storage_options)
    dt = client.open_table(sink.table_uri, sink.storage_options, what)
    if dt is None:
        return [], files, set()
    prefix = sink.prefix(job, name)
    lineages = set(promised.lineages) | {promised.lineage}
    lineages |= {c["epochal.lineage"] for c in dt.history() if isinstance(c.get("epochal.lineage"), str)
                 and c.get("epochal.job") == job and c.get("epochal.sink") == name}
    promises = leftovers.Promises.of(prefix, promised.handles, lambda h: [f["path"] for f in h.files])
    lineages |= {lineage for lineage, _, _ in promises.epochs}  # restored handles of earlier runs
    tags = leftovers.staged_by(prefix, lineages)
    listed = files.list(keep=lambda base: base.startswith(tuple(f"part-{t}-" for t in tags)),
                        hidden=client.hidden_dir)
    referenced = client.referenced(dt)

    def committed(lineage: str, subtasks: set[int]) -> dict[int, int | None]:
        return {j: dt.transaction_version(recovery.app_id(prefix, j, lineage)) for j in subtasks}

    return (leftovers.lingering(name, "delta", listed, tags, committed, referenced.__contains__, promises),
            files, referenced)


def end(sink, job: str, name: str, items: list, promised) -> int:
    """Delete the staged files of ``items``, each found again by :func:`find`: never a promised
    one, one the current version references, or a file of a foreign name. Returns how many."""
    found, files, referenced = find(sink, job, name, promised)
    wanted = {item.what for item in items}
    doomed = [item.what for item in found if not item.promised and item.what in wanted]
    if not doomed:
        return 0
    return files.delete_unreferenced(doomed, referenced.__contains__)
