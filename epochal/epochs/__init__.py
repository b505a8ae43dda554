"""Epochs: barriers and the driver-side epoch coordinator (seed 004 §3.4, §4.1.3)."""
from epochal.epochs.barrier import Barrier
from epochal.epochs.coordinator import EpochCoordinator, Progress
from epochal.epochs.pending import (AbortedEpoch, AbortReason, AckOutcome, CompletedEpoch, PendingEpoch,
                                    TriggerReason)

__all__ = ["AbortReason", "AbortedEpoch", "AckOutcome", "Barrier", "CompletedEpoch", "EpochCoordinator",
           "PendingEpoch", "Progress", "TriggerReason"]
