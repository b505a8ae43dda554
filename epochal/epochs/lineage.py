"""Lineages: which run of a job an epoch belongs to.

Epoch numbers alone do not name output. A job run twice from fresh checkpoint storage
counts epochs from 1 both times; a job restored from an older savepoint counts again from
the savepoint's epoch, while the external systems still hold what the abandoned future
committed. If a connector asked Kafka, PostgreSQL, Delta or Iceberg "do you hold epoch 7?"
by number only, it would hear "yes" about *another run's* epoch 7 and skip its own — silent
loss (issue 36).

So every run of a job is a **lineage**: a random id drawn when a driver starts (a fresh run,
``resume=True``, ``restore_from=``), kept by every failure restart inside that run, and
written into each checkpoint's ``_metadata``. A run that restores a checkpoint written by
lineage P is a *branch* of P: :attr:`Lineage.parent` is P and :attr:`Lineage.forked_at` the
restored epoch. Every connector's recovery record (Kafka markers and transactional ids,
PostgreSQL progress rows and gids, Delta app ids, Iceberg snapshot properties) names the
lineage that wrote it, and recovery answers "does the system hold epoch e?" only from
records of the lineage that produced epoch e (each pending transaction carries it). Epochs
a branch produces after its fork point are new output, even where the parent committed
epochs with the same numbers: a rollback re-emits them, as Flink does (seed 004 §4.1.3.1
only ever re-commits what the restored checkpoint itself promised).

Why a new lineage per driver and not only per fresh run: a resume or restore might not
continue from the newest epoch the external system holds (a damaged newest checkpoint, an
older savepoint). One rule for every start keeps every case right; the cost is one new
recovery record per sink subtask per run.
"""
from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

#: a lineage id: 12 lower-case hex digits (48 random bits)
LINEAGE_ID = re.compile(r"^[0-9a-f]{12}$")

#: the lineage of checkpoints and recovery records written before lineages existed
LEGACY = ""


@dataclass(frozen=True)
class Lineage:
    """The run a task belongs to. ``id``: this run's; ``parent``: the lineage that wrote the
    checkpoint this run restored (None for a fresh run, :data:`LEGACY` for a checkpoint of
    an epochal version without lineages); ``forked_at``: that checkpoint's epoch."""

    id: str
    parent: str | None = None
    forked_at: int | None = None

    def __post_init__(self):
        if not LINEAGE_ID.match(self.id):
            raise ValueError(f"lineage id {self.id!r}: expected 12 hex digits")

    @classmethod
    def begin(cls, restored: dict | None = None, epoch: int | None = None) -> Lineage:
        """A new lineage for a run starting now; ``restored``: the ``_metadata`` of the
        checkpoint it restores (its ``epoch``), None for a fresh run."""
        if restored is None:
            return cls(secrets.token_hex(6))
        return cls(secrets.token_hex(6), parent=lineage_of(restored), forked_at=epoch)

    def describe(self) -> str:
        if self.parent is None:
            return f"lineage {self.id} (a fresh run)"
        parent = self.parent or "(written before lineages)"
        return f"lineage {self.id}, a branch of lineage {parent} at epoch {self.forked_at}"


def lineage_of(meta: dict) -> str:
    """The lineage that wrote a checkpoint's ``_metadata`` (:data:`LEGACY` if none)."""
    value = meta.get("lineage", LEGACY)
    return value if isinstance(value, str) and (value == LEGACY or LINEAGE_ID.match(value)) else LEGACY
