"""The dashboard of a job started elsewhere, read from its checkpoint storage:
``epochal ui <storage> <job>``.

Read-only: no actions (ask a running job for a savepoint with ``epochal savepoint trigger``)
and no live rates — the storage holds what the job's checkpoints recorded: its operators
(names, kinds, parallelism: the plan fingerprint of the newest checkpoint; edges are not
stored, so the graph is drawn without them), the retained checkpoints (epoch, reason,
time, referenced bytes, generation) and the savepoints recorded in the job root. Every poll
lists the storage again; a completed checkpoint's ``_metadata`` never changes, so each is
read once. A job of several regions gets one dashboard per region, side by side
(:class:`RegionDashboards`).
"""
from __future__ import annotations

import threading
import time

from epochal.backends.storage import CheckpointStorage, referenced_bytes
from epochal.errors import EpochalError
from epochal.ui.layout import place
from epochal.ui.server import DashboardServer

__all__ = ["RegionDashboards", "StorageView", "serve"]


class StorageView:
    """The ``/api/state`` document of the job ``job`` under checkpoint storage ``url``."""

    def __init__(self, url: str, job: str, storage_options=None):
        self.storage = CheckpointStorage(url, job, storage_options=storage_options)
        self.job = job
        self._meta: dict[int, dict] = {}
        self._lock = threading.Lock()

    def _metadata(self, epoch: int) -> dict | None:
        if epoch not in self._meta:
            try:
                self._meta[epoch] = self.storage.read_metadata(epoch)
            except EpochalError:
                return None  # incomplete (or deleted meanwhile): not a checkpoint yet
        return self._meta[epoch]

    def view(self) -> dict:
        from epochal.state.savepoint import list_recorded

        with self._lock:
            rows, plan, chains = [], {}, []
            for epoch in sorted(self.storage.all_epochs()):
                meta = self._metadata(epoch)
                if meta is None:
                    continue
                plan = meta.get("plan") or plan
                chains = [t.get("chain") or [] for t in (meta.get("tasks") or {}).values()] or chains
                rows.append({"epoch": epoch, "generation": meta.get("generation"), "status": "completed",
                             "reason": meta.get("reason"), "wall_time": meta.get("wall_time"), "duration_s": None,
                             "bytes": None, "state_bytes": referenced_bytes(meta), "unaligned_bytes": 0,
                             "split": {}, "latency_s": None, "savepoint": None})
            savepoints = list_recorded(self.storage)
        by_epoch = {r["epoch"]: r for r in rows}
        for sp in savepoints:
            if sp.get("epoch") in by_epoch:
                by_epoch[sp["epoch"]]["savepoint"] = sp.get("url")
        return {
            "job": self.job, "time": time.time(), "state": "offline", "runtime": "storage", "guarantee": "",
            "checkpoint_root": self.storage.root_url, "generation": rows[-1]["generation"] if rows else None,
            "actions": False, "progress": {"last_completed_epoch": rows[-1]["epoch"] if rows else None},
            "graph": _boxes(plan, chains), "operators": {}, "checkpoints": rows,
            "counts": {"completed": len(rows), "aborted": 0}, "attempts": [], "restore": None,
            "savepoints": [{"epoch": s.get("epoch"), "url": s.get("url"), "bytes": s.get("bytes")} for s in savepoints],
            "series": [], "latency": [], "sinks": [],
        }


def _boxes(plan: dict, chains: list[list[str]]) -> dict:
    """The operators of a plan fingerprint laid out as the live page lays them out
    (:func:`epochal.ui.layout.place`), from what a checkpoint keeps: the operators' kinds and
    the tasks' chains (operators joined by forward edges, drawn). Shuffle edges are not
    stored, so the layers are guessed from the chains: a chain that starts at a source
    starts in column 0, any other chain in the column after the longest source chain (its
    operators in the columns after that), and a sink that heads its own chain in the last."""
    kind = {name: v.get("kind") for name, v in plan.items()}
    column: dict[str, int] = {}
    ordered = sorted({tuple(c) for c in chains if c}, key=lambda c: (kind.get(c[0]) != "source", c))
    first = max((len(c) for c in ordered if kind.get(c[0]) == "source"), default=0)
    for chain in ordered:
        start = 0 if kind.get(chain[0]) == "source" else first
        for i, name in enumerate(chain):
            column.setdefault(name, start + i)
    for name in plan:  # an operator no task ran (cannot happen in a checkpoint): after the sources
        column.setdefault(name, first)
    alone = [n for n in plan if kind[n] == "sink" and (n,) in ordered]  # a sink heading its own chain: the last
    if alone:
        last = max((c for n, c in column.items() if n not in alone), default=-1) + 1
        for name in alone:
            column[name] = last
    edges = [{"source": a, "target": b, "kind": "forward", "feedback": False, "port": "main"}
             for c in ordered for a, b in zip(c, c[1:])]
    items = [(name, kind[name], plan[name].get("parallelism"), column[name])
             for name in sorted(plan, key=lambda n: (column[n], n))]
    return place(items, edges)


def serve(url: str, job: str, host: str = "127.0.0.1", port: int = 0, token: str | None = None):
    """Serve the read-only dashboard of ``job`` under ``url`` (see the module docstring): a
    :class:`DashboardServer`, or for a job of several regions (:mod:`epochal.regions`, whose
    checkpoints live under ``<url>/<job>/regions/<region>``) a :class:`RegionDashboards` —
    one dashboard per region, each showing every region side by side and linking them.

    Raises:
        EpochalError: no checkpoints of ``job`` under ``url``.
    """
    view = StorageView(url, job)
    if not view.storage.has_checkpoints():
        from epochal.regions.layout import regions_with_checkpoints

        regions = regions_with_checkpoints(view.storage, job)
        if regions:  # a job of several regions keeps each region's checkpoints apart (epochal.regions)
            return RegionDashboards(url, job, regions, host, port, token)
        raise EpochalError(f"no checkpoints of job {job!r} under {view.storage.root_url}: check the storage URL and "
                           "the job (dataflow) name")
    return DashboardServer(view.view, None, host=host, port=port, token=token, name=job)


class RegionDashboards:
    """``epochal ui`` over a job of several regions: a read-only dashboard per region (the
    first at ``port``, the others at free ports, all with one token), whose header names its
    region and lists every region — its latest checkpoint and how many are retained — with a
    link to each (what a running job's region dashboards show, from storage)."""

    def __init__(self, url: str, job: str, regions: list[str], host: str, port: int, token: str | None):
        import secrets

        from epochal.regions.layout import REGIONS_DIR

        token = token or secrets.token_hex(16)
        self.views = {r: StorageView(f"{url.rstrip('/')}/{job}/{REGIONS_DIR}/{r}", job) for r in regions}
        self._latest: dict[str, dict] = {}
        self.servers: dict[str, DashboardServer] = {}
        try:
            for i, region in enumerate(regions):
                self.servers[region] = DashboardServer(lambda r=region: self._view(r), None, host=host,
                                                       port=port if i == 0 else 0, token=token, name=f"{job}/{region}")
        except BaseException:
            self.close()
            raise

    def _view(self, region: str) -> dict:
        doc = self.views[region].view()
        self._latest[region] = doc
        return dict(doc, region=region, regions=[self._line(r) for r in self.views])

    def _line(self, region: str) -> dict:
        doc = self._latest.get(region) or self.views[region].view()  # each view read once per its own poll
        self._latest[region] = doc
        last = doc["progress"].get("last_completed_epoch")
        return {"name": region, "state": "offline", "attempt": None, "restarts": None,
                "completed_epochs": doc["counts"]["completed"], "last_epoch": last, "url": self.servers[region].url}

    @property
    def url(self) -> str:
        """The first region's dashboard."""
        return next(iter(self.servers.values())).url

    @property
    def urls(self) -> dict[str, str]:
        return {r: s.url for r, s in self.servers.items()}

    def close(self) -> None:
        for server in self.servers.values():
            server.close()
