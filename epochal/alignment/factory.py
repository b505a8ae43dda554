"""The one place where the processing guarantee becomes components.

Exactly-once versus at-least-once is a single swap (seed 004 §4.5.4: the relaxed mode is
Alg. 6 without channel blocking) plus the matching sink mode; exactly-once snapshots are
aligned (Alg. 6), unaligned, or aligned with a timeout that switches them to unaligned
(:mod:`epochal.alignment.unaligned`) — read from the checkpoint configuration here, and
only here. Deciding it here, once, keeps
every other module free of ``if exactly_once:`` branches: the runtime asks the
:class:`GuaranteeComponents` it was handed for a barrier handler and a sink mode and never
looks at the guarantee itself. Adding a mode (e.g. unaligned checkpoints) means adding one
row to the tables below.

>>> from epochal.alignment.factory import components_for
>>> c = components_for("at-least-once")
>>> type(c.barrier_handler(num_channels=2)).__name__, c.sink_mode.value
('BarrierTracker', 'direct')
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass

from epochal.alignment.handlers import AlignedBarrierHandler, BarrierHandler, BarrierTracker, Clock
from epochal.alignment.unaligned import UnalignedBarrierHandler
from epochal.config import Guarantee
from epochal.errors import ConfigError


class SinkMode(enum.Enum):
    """How sinks publish output.

    TRANSACTIONAL: two-phase commit, pre-commit at the barrier, commit when the epoch
        completes (output of rolled-back epochs is never visible).
    DIRECT: write immediately (after recovery, replayed records are written again).
    """

    TRANSACTIONAL = "transactional"
    DIRECT = "direct"


_HANDLERS: dict[Guarantee, type[BarrierHandler]] = {
    Guarantee.EXACTLY_ONCE: AlignedBarrierHandler,  # seed 004 Alg. 6
    Guarantee.AT_LEAST_ONCE: BarrierTracker,  # seed 004 §4.5.4
}
_SINK_MODES: dict[Guarantee, SinkMode] = {
    Guarantee.EXACTLY_ONCE: SinkMode.TRANSACTIONAL,
    Guarantee.AT_LEAST_ONCE: SinkMode.DIRECT,
}


@dataclass(frozen=True)
class GuaranteeComponents:
    """The protocol pieces a run uses for its guarantee; build with :func:`components_for`.

    Raises:
        ConfigError: for an unknown guarantee or sink mode, or for the illegal combination
            exactly-once + DIRECT sinks (direct writes of an epoch that is later rolled back
            would be repeated after recovery, i.e. duplicated output).
    """

    guarantee: Guarantee
    sink_mode: SinkMode
    #: exactly-once only: switch an epoch to unaligned after this many seconds of alignment
    #: (0: always unaligned; None: always aligned)
    aligned_timeout: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "guarantee", Guarantee.parse(self.guarantee))
        try:
            object.__setattr__(self, "sink_mode", SinkMode(self.sink_mode))
        except ValueError:
            modes = ", ".join(repr(m.value) for m in SinkMode)
            raise ConfigError(f"sink_mode: expected one of {modes}, got {self.sink_mode!r}") from None
        if self.guarantee is Guarantee.EXACTLY_ONCE and self.sink_mode is SinkMode.DIRECT:
            raise ConfigError(
                "sink_mode: 'direct' sinks cannot give exactly-once output (records replayed "
                "after recovery would be written twice); use 'transactional' sinks or "
                "guarantee='at-least-once'")
        if self.aligned_timeout is not None and self.guarantee is not Guarantee.EXACTLY_ONCE:
            raise ConfigError(
                "checkpoint.unaligned / checkpoint.aligned_timeout: unaligned checkpoints make exactly-once "
                "checkpoints fast under back-pressure; at-least-once never blocks on alignment anyway, so they "
                "do not apply — use guarantee='exactly-once' or drop the option")

    @property
    def priority_barriers(self) -> bool:
        """Tasks take barriers as they arrive, ahead of queued data, and forward theirs
        without waiting for credit (unaligned snapshots)."""
        return self.aligned_timeout is not None

    @property
    def snapshot_modes(self) -> str:
        """How snapshots are taken: ``"aligned"``, ``"unaligned"`` or ``"aligned-timeout"``
        (exactly-once), ``"tracked"`` (at-least-once)."""
        if self.guarantee is not Guarantee.EXACTLY_ONCE:
            return "tracked"
        if self.aligned_timeout is None:
            return "aligned"
        return "unaligned" if self.aligned_timeout == 0 else "aligned-timeout"

    def barrier_handler(self, num_channels: int, clock: Clock = time.monotonic) -> BarrierHandler:
        """A fresh handler for a task with ``num_channels`` input channels (0 for sources)."""
        if self.aligned_timeout is not None:
            return UnalignedBarrierHandler(num_channels, clock, aligned_timeout=self.aligned_timeout or None)
        return _HANDLERS[self.guarantee](num_channels, clock)


def components_for(guarantee: Guarantee | str, checkpoint=None) -> GuaranteeComponents:
    """Components for ``guarantee``: exactly-once → aligned handler (or, per ``checkpoint``
    ``unaligned`` / ``aligned_timeout``, the unaligned one) + transactional sinks;
    at-least-once → barrier tracker + direct sinks.

    Args:
        guarantee: a :class:`~epochal.config.Guarantee` or its name
            (``"exactly-once"``, ``"at_least_once"``, ...).
        checkpoint: the run's :class:`~epochal.config.CheckpointConfig` (None: defaults).

    Raises:
        ConfigError: naming the ``guarantee`` key when the value is not a guarantee, or the
            unaligned options with at-least-once.
    """
    g = Guarantee.parse(guarantee)
    timeout = None
    if checkpoint is not None:
        timeout = 0.0 if checkpoint.unaligned else checkpoint.aligned_timeout
    return GuaranteeComponents(guarantee=g, sink_mode=_SINK_MODES[g], aligned_timeout=timeout)
