"""Stage timestamps of the Kafka connectors, for finding where latency goes (issue 34).

Off unless the environment variable ``EPOCHAL_KAFKA_TRACE`` names a directory when the
module is first imported (every process of a job inherits it: local processes and Spark's
Python workers alike). Then each process appends one JSON line per event to
``<dir>/<pid>.jsonl``: wall-clock seconds ``t`` (``time.time()``, comparable across the
processes of one host) and the event's fields. Events are per poll batch or per epoch,
never per record, so tracing costs little; with tracing off each call site costs one
truth test of :data:`ON`.

Events (``benchmarks/kafka_trace.py`` reads them):

* ``fetch``: the source moved ``n`` messages from its consumer; ``min_ts``/``max_ts`` are
  their Kafka timestamps (ms);
* ``write``: the sink wrote ``n`` records of ``epoch`` (the first batch of an epoch, with
  its records' oldest Kafka timestamp ``min_ts`` when they are ``KafkaRecord``);
* ``seal``: ``pre_commit`` of ``epoch`` (``count`` records, oldest Kafka timestamp
  ``min_ts``);
* ``complete``: the writer learnt the epoch's checkpoint completed (``commit`` hook);
* ``commit_sent`` / ``commit_ack``: the commit thread began / finished the epoch's commit;
* ``producer``: the sink created and initialised (``init_transactions``) the transactional
  producer of ``slot``, taking ``init_s`` seconds.
"""
from __future__ import annotations

import json
import os
import threading
import time

_DIR = os.environ.get("EPOCHAL_KAFKA_TRACE") or None
#: whether tracing is on (test it before building an event's fields)
ON = _DIR is not None
_lock = threading.Lock()
_files: dict[int, object] = {}


def event(kind: str, **fields) -> None:
    """Append one event (thread-safe; a no-op with tracing off)."""
    if _DIR is None:
        return
    line = json.dumps({"kind": kind, "t": time.time(), "pid": os.getpid(), **fields}) + "\n"
    with _lock:
        out = _files.get(os.getpid())
        if out is None:
            os.makedirs(_DIR, exist_ok=True)
            out = _files[os.getpid()] = open(os.path.join(_DIR, f"{os.getpid()}.jsonl"), "a", buffering=1)  # noqa: SIM115
        out.write(line)  # type: ignore[attr-defined]
