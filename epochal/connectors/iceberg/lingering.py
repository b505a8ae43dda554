"""``epochal sinks lingering`` for an :class:`~epochal.connectors.iceberg.sink.IcebergSink`:
the staged data files a stopped job's runs left in the table's ``data/`` that no snapshot
references (:mod:`epochal.connectors.leftovers` says which, and which a checkpoint still
promises).

The runs looked at: those the job's completed checkpoints name
(:class:`~epochal.sinks.lingering.Promised`) and those the snapshot summaries of the current
ancestry and the table properties name. Called on the driver or the command line while the
job is stopped.
"""
from __future__ import annotations

from epochal.connectors import leftovers
from epochal.connectors.iceberg import client, recovery


def find(sink, job: str, name: str, promised):
    """``(lingering items, the table's files, referenced(rel path))`` of ``sink`` (job
    ``job``'s sink operator ``name``)."""
    what = f"sink {name!r} ({sink!r})"
    catalog = sink.catalog(what)
    try:
        table = client.load_table(catalog, sink.identifier, what)
        if table is None:
            return [], None, lambda path: True
        prefix = sink.prefix(job, name)
        history = list(client.ancestry(table))
        recorded = recovery.recorded_epochs(table.metadata.properties)
        lineages = set(promised.lineages) | {promised.lineage}
        lineages |= leftovers.lineages_named(prefix, [(props or {}).get(recovery.APP_ID, "") for _, props in history])
        lineages |= leftovers.lineages_named(prefix, recorded)
        promises = leftovers.Promises.of(prefix, promised.handles, lambda h: h.files)
        lineages |= {lineage for lineage, _, _ in promises.epochs}  # restored handles of earlier runs
        tags = leftovers.staged_by(prefix, lineages)
        files, directory = client.data_files(table, what)
        listed = files.list(directory, keep=lambda base: base.startswith(tuple(f"part-{t}-" for t in tags)))
        held = {task.file.file_path for task in table.scan().plan_files()} if table.current_snapshot() else set()

        def referenced(path: str) -> bool:
            return client.full_path(table, path) in held

        def committed(lineage: str, subtasks: set[int]) -> dict[int, int | None]:
            apps = {j: recovery.app_id(prefix, j, lineage) for j in subtasks}
            epochs = recovery.committed_epochs(history, apps.values(), None, recorded)
            return {j: epochs[a] for j, a in apps.items()}

        return leftovers.lingering(name, "iceberg", listed, tags, committed, referenced, promises), files, referenced
    finally:
        client.close_catalog(catalog)


def end(sink, job: str, name: str, items: list, promised) -> int:
    """As :func:`epochal.connectors.delta.lingering.end`."""
    found, files, referenced = find(sink, job, name, promised)
    wanted = {item.what for item in items}
    doomed = [item.what for item in found if not item.promised and item.what in wanted]
    if not doomed:
        return 0
    return files.delete_unreferenced(doomed, referenced)
