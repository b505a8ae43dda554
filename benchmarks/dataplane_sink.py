"""The discarding sink of ``dataplane.py``: counts records and stamps time and CPU.

Shipped to the sink task by value (``cloudpickle.register_pickle_by_value``): task
processes cannot import ``benchmarks/``.
"""
from __future__ import annotations

import json
import os
import time

from epochal.sinks import Sink, SinkWriter


class CountingSink(Sink):
    """Discards records; counts them and stamps every ``stamp_every``-th with
    ``(count, perf_counter, CPU s of this task, CPU s of the other tasks of the job)``;
    writes count and stamps as JSON into ``directory`` at ``close``. Checks the id of every
    stamped record against its position (records are ``(id, blob)``, or objects with an
    ``id``, in order from 0), so loss or reordering shows. CPU is read at most every
    ``CPU_PERIOD`` s; "other tasks" are the sink's sibling processes (forked from the same
    zygote: runtime local only)."""

    def __init__(self, directory: str, stamp_every: int):
        self.directory = directory
        self.stamp_every = stamp_every

    def create_writer(self, ctx):
        return _CountingWriter(os.path.join(self.directory, f"sink-{ctx.subtask}-g{ctx.generation}.json"),
                               self.stamp_every)


CPU_PERIOD = 0.02


class _CountingWriter(SinkWriter):
    def __init__(self, path: str, every: int):
        self.path, self.every = path, every
        self.n, self.next_stamp, self.bad = 0, every, 0
        self.stamps: list[tuple] = []
        self.siblings: list[int] | None = None
        self.next_cpu = 0.0

    def restore(self, state) -> None:
        self.n = state or 0
        self.next_stamp = self.n + self.every

    def write(self, record) -> None:
        self.n += 1
        if self.n >= self.next_stamp:
            self._stamp()
            self.bad += (record[0] if type(record) is tuple else record.id) != self.n - 1
            self.next_stamp += self.every

    def write_batch(self, batch) -> None:
        """A stream of Arrow batches: count its rows (the ids repeat: no order check)."""
        self.n += batch.num_rows
        if self.n >= self.next_stamp:
            self._stamp()
            self.next_stamp = (self.n // self.every + 1) * self.every

    def _stamp(self) -> None:
        now = time.perf_counter()
        if now < self.next_cpu:
            self.stamps.append((self.n, now))
            return
        if self.siblings is None:
            self.siblings = _siblings()
        self.stamps.append((self.n, now, time.process_time(), sum(_proc_cpu(p) for p in self.siblings)))
        self.next_cpu = now + CPU_PERIOD

    def snapshot(self, epoch: int):
        return self.n

    def notify_epoch_complete(self, epoch: int) -> None:
        pass

    def close(self) -> None:
        self.next_cpu = 0.0
        self._stamp()
        with open(self.path, "w") as f:
            json.dump({"count": self.n, "bad": self.bad, "siblings": len(self.siblings or ()),
                       "stamps": self.stamps}, f)


def _siblings() -> list[int]:
    """Other children of this process's parent (the zygote: the job's other tasks)."""
    me, parent, found = os.getpid(), os.getppid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == parent:
                found.append(int(entry))
    return found


def _proc_cpu(pid: int) -> float:
    """utime + stime of a process in seconds (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
