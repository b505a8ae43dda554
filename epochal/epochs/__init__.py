"""Epochs: barriers and the driver-side epoch coordinator (seed 004 §3.4, §4.1.3)."""
from epochal.epochs.barrier import Barrier

__all__ = ["Barrier"]
