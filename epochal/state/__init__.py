"""Offline access to checkpoints and savepoints: read state without running the job, and
savepoints (DESIGN.md "state access").

* :func:`open_checkpoint` — a savepoint, a ``chk-<epoch>`` directory or a job's checkpoint
  directory (its newest completed checkpoint), by URL (:mod:`~epochal.state.location`);
* :func:`read` — an operator's keyed state as a ``pyarrow.Table`` (:mod:`~epochal.state.reader`);
  :func:`read_spark` — the same as a Spark DataFrame;
* :func:`list_sink_transactions`, :func:`list_loop_logs`, :func:`list_channel_state`,
  :func:`list_source_offsets`, :func:`describe` (:mod:`~epochal.state.listing`);
* :class:`QueryClient` — look up queryable state of a *running* job (:mod:`epochal.query`);
* :func:`write_savepoint` — copy a completed checkpoint into a self-contained, relocatable
  savepoint (:mod:`~epochal.state.savepoint`). A running job takes one with
  ``JobHandle.savepoint(url)`` / ``stop_with_savepoint(url)``; ``flow.run(restore_from=url)``
  starts a job from one.
"""
from epochal.state.listing import (describe, list_channel_state, list_loop_logs, list_sink_transactions,
                                   list_source_offsets)
from epochal.query.client import QueryClient, QueryResult
from epochal.state.location import Checkpoint, open_checkpoint
from epochal.state.reader import read
from epochal.state.savepoint import write_savepoint

__all__ = ["Checkpoint", "QueryClient", "QueryResult", "describe", "list_channel_state", "list_loop_logs", "list_sink_transactions",
           "list_source_offsets", "open_checkpoint", "read", "read_spark", "write_savepoint"]


def read_spark(spark, url, operator: str, **options):
    """:func:`read` as a Spark DataFrame on ``spark`` (a ``SparkSession``); options as for
    :func:`read`. Pickled columns (``encoding="pickle"``, or ``"auto"`` falling back to it)
    become binary columns."""
    from epochal.runtime.launch.state_spark import read_spark as _read_spark

    return _read_spark(spark, url, operator, **options)
