"""What a job on a Spark cluster needs beyond local runs, checked on the driver before any
task starts (DESIGN.md "On a cluster").

On one machine every task sees the driver's disk. On a cluster a task writes the local disk
of whichever host Spark put it on: a ``file://`` checkpoint would be scattered over hosts
(a restore on another host finds nothing), a ``FileSink`` would publish part of its output
on each host, and ``memory://`` lives inside one process. So every storage location the job
uses — its checkpoint storage and every source's and sink's :meth:`locations` — must be
visible from every host: an object store or another remote file system (``s3://``, ...),
or a local path the user declares shared (``ClusterConfig.shared_paths``, e.g. an NFS
mount). Anything else is refused with one error listing every offending location.

The module is pure (no pyspark); :class:`~epochal.runtime.launch.spark.SparkLauncher` decides
whether the job runs on a cluster.
"""
from __future__ import annotations

import os

from fsspec.utils import get_protocol

from epochal.errors import ConfigError
from epochal.graph import NodeKind

#: fsspec protocols whose paths name the local disk of the host (or the process) using them
_HOST_LOCAL = ("file", "local")
_PROCESS_LOCAL = ("memory",)


def _local_path(url: str) -> str:
    path = url.split("://", 1)[1] if "://" in url else url
    return os.path.normpath(os.path.abspath(path))


def _is_under(path: str, roots: list[str]) -> bool:
    for root in roots:
        try:
            if os.path.commonpath([path, root]) == root:
                return True
        except ValueError:  # different drives (Windows)
            continue
    return False


def storage_locations(plan, checkpoint_url: str | None) -> list[tuple[str, str]]:
    """``(what, url)`` for the checkpoint storage and every source's and sink's location."""
    found = [("checkpoint.storage", checkpoint_url)] if checkpoint_url is not None else []
    for node in plan.nodes.values():
        if node.kind is NodeKind.SOURCE:
            found += [(f"source {node.name!r}", loc) for loc in node.payload.locations()]
        elif node.kind is NodeKind.SINK:
            found += [(f"sink {node.name!r}", loc) for loc in node.payload.locations()]
    return found


def check_storage_visible_from_every_host(plan, checkpoint_url: str | None, shared_paths, master: str) -> None:
    """Refuse storage that some host of the cluster ``master`` cannot see.

    Args:
        plan: the job's physical plan (its sources and sinks name their locations).
        checkpoint_url: the checkpoint storage URL; ``None`` (a temporary directory on the
            driver) is refused: the executors never see it.
        shared_paths: ``ClusterConfig.shared_paths``: local paths every host sees alike.
        master: the Spark master URL, for the message.

    Raises:
        ConfigError: listing every location that is in memory, or on a local disk outside
            ``shared_paths``, with what to do instead.
    """
    roots = [_local_path(p) for p in shared_paths]
    problems = []
    if checkpoint_url is None:
        problems.append("checkpoint.storage is not set: a temporary directory on the driver is not visible to "
                        "the executors")
    for what, url in storage_locations(plan, checkpoint_url):
        protocol = get_protocol(url)
        if protocol in _PROCESS_LOCAL:
            problems.append(f"{what}: {url} is in-memory storage of one process")
        elif protocol in _HOST_LOCAL and not _is_under(_local_path(url), roots):
            problems.append(f"{what}: {url} is on the local disk of whichever host reads or writes it")
    if problems:
        raise ConfigError(
            f"the job runs on the Spark cluster {master}, where tasks run on several hosts, and it uses storage "
            "that not every host sees:\n  - " + "\n  - ".join(problems) + "\nUse storage every host reaches "
            "(e.g. s3://bucket/path, with credentials in the executors' environment), or, for a file system "
            "mounted at the same path on every host (NFS), declare it: "
            "run(..., cluster=ClusterConfig(shared_paths=['/mnt/shared']))")
