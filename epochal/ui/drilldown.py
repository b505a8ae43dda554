"""The dashboard's drill-down views, built from what the driver already holds (pure, no HTTP).

* :func:`subtasks` — an operator's page: one row per subtask (the task that runs it; chained
  operators share a task) with its records in / out per second *of that operator*, its
  task's back-pressure, CPU, resident memory, watermark, queued batches, and the state
  size that task acknowledged for the newest completed epoch, and ``reader``, the figures of
  its source reader when the operator is the task's source and its reader reports some (the
  CEC window operator's open windows, extent lag, footprints); and :func:`spread`, the
  lowest and highest of a figure over the subtasks, so an operator's box never hides a
  skew behind one number.
* :func:`exceptions` — every failed attempt (its cause and the traceback text the task
  sent, as the driver kept it in the attempt timeline; at most :data:`TRACE_LINES` lines
  and :data:`TRACE_CHARS` characters) and every failover region that restarted alone
  (the driver keeps the first line of its cause only).
* :func:`checkpoint_tasks` — a completed checkpoint's page: every task's acknowledgement
  (its phases, the bytes it uploaded, the size of its snapshot); :data:`ACK_FIGURES` says
  which figures an acknowledgement carries, a figure a task did not report is ``None``.

Each function is called per request on copies the model made; none mutates its input.
"""
from __future__ import annotations

import re

__all__ = ["ACK_FIGURES", "TRACE_CHARS", "TRACE_LINES", "checkpoint_tasks", "exceptions", "spread", "subtasks",
           "subtask_index"]

#: a failure's traceback text kept per row (the first lines: where it was raised is last in a
#: Python traceback, so the bound keeps the head and the tail)
TRACE_LINES, TRACE_CHARS = 40, 4000
#: the figures of one task's acknowledgement of an epoch (``completion._task_sample``), seconds or bytes
ACK_FIGURES = ("barrier_s", "alignment_s", "sync_s", "upload_wait_s", "upload_s", "durable_s", "ack_s", "bytes",
               "state_bytes", "snapshot_kind", "channel_state_records")
_INDEX = re.compile(r"\[(\d+)\]$")


def subtask_index(task: str) -> int | None:
    """``3`` for the task id ``"count[3]"``; ``None`` for an id without an index."""
    m = _INDEX.search(task)
    return int(m.group(1)) if m else None


def subtasks(operator: str, chains: dict[str, tuple], progress: dict, acked: dict | None) -> list[dict]:
    """The rows of ``operator``'s page, ordered by subtask. ``chains``: task id → the operators
    it runs; ``progress``: the newest progress event; ``acked``: task id → its acknowledgement
    of the newest completed epoch (``None``: no epoch completed yet)."""
    tasks = progress.get("tasks", {})
    rows = []
    for task, chain in chains.items():
        if operator not in chain:
            continue
        t = tasks.get(task)
        if t is None:
            rows.append({"task": task, "subtask": subtask_index(task), "reported": False,
                         "state_bytes": (acked or {}).get(task, {}).get("state_bytes")})
            continue
        op = (t.get("operators") or {}).get(operator)
        own = op if op is not None else t  # an operator the task reports no counters for: the task's figures
        rows.append({"task": task, "subtask": subtask_index(task), "reported": True, "host": t.get("host"),
                     "pid": t.get("pid"), "chained": list(chain),
                     "records_in": own.get("records_in"), "records_out": own.get("records_out"),
                     "records_in_per_s": own.get("records_in_per_s"), "records_out_per_s": own.get("records_out_per_s"),
                     "backpressure": t.get("backpressure_ratio"), "cpu_load": t.get("cpu_load"),
                     "rss_bytes": t.get("rss_bytes"), "watermark": t.get("watermark"),
                     "queued_batches": t.get("queued_batches"), "idle": t.get("idle", False),
                     "state_bytes": (acked or {}).get(task, {}).get("state_bytes"),
                     "reader": t.get("reader") if chain and chain[0] == operator else None})
    return sorted(rows, key=lambda r: (r["subtask"] is None, r["subtask"] or 0, r["task"]))


def spread(rows: list[dict], key: str) -> dict | None:
    """``{"min", "max", "argmin", "argmax"}`` of ``key`` over the rows that report it (subtask
    numbers for the arg…), ``None`` when none does."""
    known = [(r[key], r["subtask"]) for r in rows if r.get(key) is not None]
    if not known:
        return None
    lo, hi = min(known, key=lambda x: x[0]), max(known, key=lambda x: x[0])
    return {"min": lo[0], "max": hi[0], "argmin": lo[1], "argmax": hi[1], "count": len(known)}


def _bounded(text: str) -> str:
    lines = text.splitlines()
    if len(lines) > TRACE_LINES:
        half = TRACE_LINES // 2
        lines = lines[:half] + [f"… {len(lines) - TRACE_LINES} lines left out …"] + lines[-half:]
    out = "\n".join(lines)
    return out if len(out) <= TRACE_CHARS else out[:TRACE_CHARS // 2] + "\n…\n" + out[-TRACE_CHARS // 2:]


def exceptions(timeline: list[dict], failovers: list[dict]) -> list[dict]:
    """One row per failure, oldest first: ``kind`` (``attempt`` or ``failover``), ``generation``,
    ``time_s`` (since the job started, when known), ``tasks`` (a failover's region),
    ``cause`` (its first line), ``traceback`` (the rest as the driver kept it, bounded; ``""``
    when it kept one line only), ``restored_epoch`` (what the next run restored)."""
    rows = []
    for i, e in enumerate(timeline):
        cause = e.get("cause")
        if not cause:
            continue
        first, _, rest = cause.partition("\n")
        after = timeline[i + 1] if i + 1 < len(timeline) else {}
        rows.append({"kind": "attempt", "generation": e.get("generation"), "time_s": e.get("failed_s"),
                     "tasks": [], "cause": first[:500], "traceback": _bounded(rest.strip("\n")),
                     "restored_epoch": after.get("restored_epoch")})
    for f in failovers:
        rows.append({"kind": "failover", "generation": f.get("generation"), "time_s": None,
                     "tasks": list(f.get("tasks", ())), "cause": (f.get("cause") or "")[:500], "traceback": "",
                     "restored_epoch": f.get("restored_epoch")})
    return rows


def checkpoint_tasks(row: dict, chains: dict[str, tuple]) -> dict:
    """The page of one checkpoint row (the model's row with its ``tasks`` acknowledgements):
    the row's figures and ``tasks``, one per acknowledging task with every :data:`ACK_FIGURES`
    and the operators it runs; ``missing`` names the figures no task reported."""
    acks = row.get("tasks") or {}
    tasks = [{"task": t, "subtask": subtask_index(t), "operators": list(chains.get(t, ())),
              **{k: a.get(k) for k in ACK_FIGURES}} for t, a in sorted(acks.items())]
    missing = [k for k in ACK_FIGURES if tasks and all(t[k] is None for t in tasks)]
    doc = {k: v for k, v in row.items() if k != "tasks"}
    doc.update({"tasks": tasks, "missing": missing})
    if row.get("status") != "completed":
        doc["note"] = "an aborted or declined epoch: its tasks' acknowledgements are not kept, only its reason"
    return doc
