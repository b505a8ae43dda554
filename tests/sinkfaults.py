"""Fault helpers shared by the scripted two-phase-commit sink tests (FileSink, LogSink)."""
from __future__ import annotations

import errno


def lossy(fail_durable_at: set, w, staged_paths):
    """Wrap ``w.pre_commit`` so the durability step of an epoch in ``fail_durable_at`` does
    its work, then loses the data — truncates every ``(fs, path)`` of
    ``staged_paths(txn)``, as a kernel dropping dirty pages after a failed writeback would —
    and raises EIO. A writer that went on to commit the transaction would lose records."""
    pre_commit = w.pre_commit

    def sealing(txn):
        step = pre_commit(txn)
        if step is None or txn.epoch not in fail_durable_at:
            return step
        fail_durable_at.discard(txn.epoch)

        def failing():
            step()
            for fs, path in staged_paths(txn):
                with fs.open(path, "wb"):
                    pass
            raise OSError(errno.EIO, f"injected fsync failure in epoch {txn.epoch}")
        return failing
    return sealing
