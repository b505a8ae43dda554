"""Per-task barrier alignment (seed 004 Alg. 6, §4.5.4) and the guarantee factory."""
from epochal.alignment.factory import GuaranteeComponents, SinkMode, components_for
from epochal.alignment.handlers import (
    AlignedBarrierHandler,
    BarrierHandler,
    BarrierOutcome,
    BarrierTracker,
    CollectingBarriers,
    HandlerResult,
    ProtocolError,
    WaitingForFirstBarrier,
)

__all__ = [
    "AlignedBarrierHandler",
    "BarrierHandler",
    "BarrierOutcome",
    "BarrierTracker",
    "CollectingBarriers",
    "GuaranteeComponents",
    "HandlerResult",
    "ProtocolError",
    "SinkMode",
    "WaitingForFirstBarrier",
    "components_for",
]
