"""Run-time configuration: the guarantee, checkpointing and restarts.

These objects are passed to ``Dataflow.run``; they are never part of the graph. Every
validation error names the offending config key.
"""
from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass

from epochal.errors import ConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")
_UNIT = {None: 1.0, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(value, key: str, *, optional: bool = False) -> float | None:
    """Seconds from ``1.5``, ``"200ms"``, ``"1s"``, ``"2min"``; ``None`` only if ``optional``.

    Raises:
        ConfigError: naming ``key`` when the value is missing, negative, not finite or
            unparseable.
    """
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key}: a duration is required, got None")
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a duration, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value))
        if not m:
            raise ConfigError(f"{key}: cannot parse duration {value!r} (use e.g. 0.5, '200ms', '1s', '2min')")
        seconds = float(m.group(1)) * _UNIT[m.group(2)]
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"{key}: duration must be finite and >= 0, got {value!r}")
    return seconds


class Guarantee(enum.Enum):
    """Processing guarantee of a run. Read in exactly one place:
    :func:`epochal.alignment.factory.components_for`."""

    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"

    @classmethod
    def parse(cls, value) -> "Guarantee":
        if isinstance(value, Guarantee):
            return value
        for g in cls:
            if str(value).lower().replace("_", "-") == g.value:
                return g
        raise ConfigError(f"guarantee: expected 'exactly-once' or 'at-least-once', got {value!r}")


@dataclass(frozen=True)
class CheckpointConfig:
    """How epochs are triggered and where their snapshots go.

    Attributes:
        interval: seconds (or a duration string) between periodic epoch triggers;
            ``None`` disables periodic epochs (manual and source-requested triggers, and
            the final epoch at end of input, still happen).
        storage: fsspec URL of the checkpoint root (``file:///...``, ``memory://...``,
            ``s3://...``); each job writes under ``<storage>/<job name>/``. ``None`` uses a
            fresh temporary directory.
        timeout: an epoch not complete after this many seconds is aborted.
        max_concurrent: at most this many epochs pending at once.
        min_pause: minimum seconds between the completion of one epoch and the next trigger.
        tolerable_failures: consecutive failed (aborted/declined) epochs tolerated before the
            job fails and restarts.
        retained: completed checkpoints kept; older ones are deleted.
    """

    interval: float | str | None = 1.0
    storage: str | None = None
    timeout: float | str = 60.0
    max_concurrent: int = 1
    min_pause: float | str = 0.0
    tolerable_failures: int = 0
    retained: int = 2

    def __post_init__(self):
        object.__setattr__(self, "interval", parse_duration(self.interval, "checkpoint.interval", optional=True))
        if self.interval is not None and self.interval <= 0:
            raise ConfigError("checkpoint.interval: must be > 0 (or None to disable periodic epochs)")
        object.__setattr__(self, "timeout", parse_duration(self.timeout, "checkpoint.timeout"))
        if self.timeout <= 0:
            raise ConfigError("checkpoint.timeout: must be > 0")
        object.__setattr__(self, "min_pause", parse_duration(self.min_pause, "checkpoint.min_pause"))
        for key in ("max_concurrent", "retained"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"checkpoint.{key}: must be an integer >= 1, got {v!r}")
        t = self.tolerable_failures
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise ConfigError(f"checkpoint.tolerable_failures: must be an integer >= 0, got {t!r}")
        if self.storage is not None and not isinstance(self.storage, str):
            raise ConfigError(f"checkpoint.storage: expected an fsspec URL string, got {self.storage!r}")


@dataclass(frozen=True)
class RestartStrategy:
    """Fixed-delay restart: after a failure, wait ``delay`` seconds and restart every task
    from the latest completed epoch; give up after ``max_attempts`` restarts."""

    max_attempts: int = 3
    delay: float | str = 0.0

    def __post_init__(self):
        if not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool) or self.max_attempts < 0:
            raise ConfigError(f"restart.max_attempts: must be an integer >= 0, got {self.max_attempts!r}")
        object.__setattr__(self, "delay", parse_duration(self.delay, "restart.delay"))


@dataclass(frozen=True)
class ChannelConfig:
    """Data-plane tuning.

    Attributes:
        batch_size: records per batch before it is cut and sent.
        linger: seconds a partially filled batch may wait before it is sent.
        credits: batches a receiver buffers per channel; a sender with no credit blocks
            (credit-based flow control → back-pressure).
    """

    batch_size: int = 512
    linger: float | str = 0.005
    credits: int = 8

    def __post_init__(self):
        object.__setattr__(self, "linger", parse_duration(self.linger, "channels.linger"))
        for key in ("batch_size", "credits"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"channels.{key}: must be an integer >= 1, got {v!r}")
