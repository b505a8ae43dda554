"""Consistent regions (seed 000, IBM Streams): parts of one job that establish consistent
states independently — their own epochs, guarantee, checkpoint interval and storage, and
their own restarts — so that a failure in one region never resets another.

``flow.source(..., region=ep.Region("payments", checkpoint=ep.CheckpointConfig(interval=0.1)))``
or ``stream.region("payments")`` annotates an operator (``ep.Autonomous("feed")``: a region
that takes no periodic snapshot); :func:`~epochal.regions.layout.layout_of`
computes the regions of a dataflow; :mod:`epochal.runtime.driver.regions` runs one job
driver per region. A pure graph-layer package: it never imports the runtime.
"""
from epochal.regions.api import DEFAULT_REGION, Autonomous, Region
from epochal.regions.layout import RegionPart, layout_of

__all__ = ["DEFAULT_REGION", "Autonomous", "Region", "RegionPart", "layout_of"]
