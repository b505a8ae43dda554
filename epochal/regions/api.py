"""The pipeline author's region vocabulary: :class:`Region` and where it is placed.

A region is declared on an operator (``flow.source(..., region=...)`` or
``stream.region(...)``, which annotates the operators producing the stream); seed 000
§3.1's ``@consistent``. Its settings override the job's ``run()`` settings for the
operators of the region; a setting left ``None`` is the job's.
"""
from __future__ import annotations

from dataclasses import dataclass

from epochal.config import CheckpointConfig, Guarantee, RestartStrategy
from epochal.errors import PipelineDefinitionError

#: the region of every operator connected to no annotated one: the job's own settings
DEFAULT_REGION = "default"


@dataclass(frozen=True)
class Region:
    """A consistent region: the operators connected to the annotated one, checkpointed and
    restarted on their own (seed 000 §3.1: "each region establishes consistent states
    independently ... the failure of an operator in one region does not cause the reset of
    operators in other regions").

    Args:
        name: the region's name; it names the region's checkpoint directory
            (``<storage>/<job>/regions/<name>/``), its log lines and errors.
        guarantee: ``"exactly-once"`` or ``"at-least-once"`` for this region; ``None``: the job's.
        checkpoint: this region's :class:`~epochal.config.CheckpointConfig` (interval,
            timeout, retention, ...; its ``storage``, when set, is the region's own root);
            ``None``: the job's, with the storage under the job's root.
        restart: this region's :class:`~epochal.config.RestartStrategy` (attempts count per
            region); ``None``: the job's.
    """

    name: str
    guarantee: str | Guarantee | None = None
    checkpoint: CheckpointConfig | None = None
    restart: RestartStrategy | None = None

    def __post_init__(self):
        from epochal.streams import check_name

        for part in str(self.name).split("+") if isinstance(self.name, str) else [self.name]:  # "a+b": merged
            if part != self.name and not part:
                check_name(self.name, "region")
            try:
                check_name(part, "region")
            except PipelineDefinitionError:
                check_name(self.name, "region")
        if self.guarantee is not None:
            try:
                object.__setattr__(self, "guarantee", Guarantee.parse(self.guarantee))
            except Exception as exc:
                raise PipelineDefinitionError(f"region {self.name!r}: {exc}") from None
        for field, value, cls in (("checkpoint", self.checkpoint, CheckpointConfig),
                                  ("restart", self.restart, RestartStrategy)):
            if value is not None and not isinstance(value, cls):
                raise PipelineDefinitionError(
                    f"region {self.name!r}: {field}: expected {cls.__name__}, got {type(value).__name__}")

    @property
    def settings(self) -> dict:
        """The settings this region overrides (``None`` ones omitted)."""
        return {k: v for k, v in (("guarantee", self.guarantee), ("checkpoint", self.checkpoint),
                                  ("restart", self.restart)) if v is not None}


@dataclass(frozen=True)
class Autonomous(Region):
    """An autonomous region (seed 000 §3.2's ``@autonomous``): it takes no periodic snapshot
    and coordinates nothing — at-least-once (its sinks write directly, its tasks track
    barriers without aligning) with no periodic epoch (``CheckpointConfig(interval=None)``;
    a bounded input still ends with the one final epoch). A failed task restarts the region
    from its sources' start positions, since nothing was snapshotted: output of the region
    may repeat (duplicates downstream), and what it handed over an autonomous channel is
    handed over again. Use it for parts of a job that need no guarantee — enrichment
    feeds, monitoring — beside consistent regions that keep theirs.

    Args:
        name: the region's name, as for :class:`Region`.
        restart: its :class:`~epochal.config.RestartStrategy`; ``None``: the job's.

    Raises:
        PipelineDefinitionError: a guarantee (it is always at-least-once), or a checkpoint
            interval (an autonomous region takes no periodic snapshot).
    """

    def __post_init__(self):
        if self.guarantee is not None:  # it has one guarantee: none is chosen here
            raise PipelineDefinitionError(f"autonomous region {self.name!r}: guarantee={self.guarantee!r}: an "
                                          "autonomous region takes no snapshot, so it is always at-least-once and "
                                          "takes no guarantee; use epochal.Region for a consistent one")
        if self.checkpoint is not None and self.checkpoint.interval is not None:
            raise PipelineDefinitionError(f"autonomous region {self.name!r}: checkpoint.interval="
                                          f"{self.checkpoint.interval}: an autonomous region takes no periodic "
                                          "snapshot; use epochal.Region for a consistent one")
        object.__setattr__(self, "guarantee", Guarantee.AT_LEAST_ONCE)
        if self.checkpoint is None:
            object.__setattr__(self, "checkpoint", CheckpointConfig(interval=None))
        super().__post_init__()


def as_region(region, where: str) -> Region:
    """``region`` (a :class:`Region` or a name) as a Region; ``where`` names the operator."""
    if isinstance(region, Region):
        return region
    if isinstance(region, str):
        return Region(region)
    raise PipelineDefinitionError(f"{where}: region: expected an epochal.Region or a name, got {type(region).__name__}")


def annotate(flow, node: str, region) -> None:
    """Place ``region`` on operator ``node`` of ``flow`` (build time). An operator carries at
    most one annotation; two regions reaching one operator merge (:mod:`epochal.regions.layout`)."""
    region = as_region(region, f"operator {node!r}")
    placed = flow._regions.get(node)
    if placed is not None and placed != region:
        raise PipelineDefinitionError(
            f"operator {node!r} is already in region {placed.name!r}; it cannot also be placed in {region.name!r}")
    flow._regions[node] = region
