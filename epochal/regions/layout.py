"""Which operators form which region (seed 000 §3.1), computed from the logical graph.

Seed 000: "the compiler automatically identifies the consistent region by computing the
reachability graph of the annotated operator", and "when ... their reachability graphs have
a common operator, the compiler merges the two consistent regions into one". Every
operator of a region's weakly connected component belongs to it: a stream between two
regions would put one operator in both reachability graphs, merging them — unless the
stream is an **autonomous channel** (``Stream.autonomous()``, seed 000 §3.2's autonomous
input port), which belongs to no region and never merges the two it connects. Hence:

* the regions of a job are unions of the connected components of its graph without its
  autonomous channels (feedback edges included: a loop is never split);
* a component holding annotations of several regions merges them (named ``"a+b"``), and
  their settings must agree (a setting given by one region only is the merged region's);
* the components that hold no annotation form the :data:`~epochal.regions.api.DEFAULT_REGION`,
  which runs with the job's own settings — so a job without annotations is one region and
  runs exactly as a job always did; a component without annotations that an autonomous
  channel reaches or leaves is a region of its own, named after its first operator, with
  the job's settings;
* an autonomous channel whose two ends are in one region anyway is refused (it would not
  be autonomous).

The result is deterministic (ordered by each region's first operator), so every process
computes the same layout.
"""
from __future__ import annotations

from dataclasses import dataclass

from epochal.errors import PipelineDefinitionError
from epochal.regions.api import DEFAULT_REGION, Region

#: the directory under a job's checkpoint root that holds its regions' roots
REGIONS_DIR = "regions"


@dataclass(frozen=True)
class RegionPart:
    """One region of a job: its merged :class:`Region` and its operators (graph order)."""

    region: Region
    nodes: tuple[str, ...]
    #: the annotated regions merged into this one (one name unless seed 000's merge applied)
    merged: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.region.name


def layout_of(flow) -> list[RegionPart]:
    """The regions of ``flow``: one :class:`RegionPart` per region, in graph order.

    Raises:
        PipelineDefinitionError: two annotations of one name with different settings, or
            merged regions whose settings disagree (naming both, the setting and an operator
            connecting them).
    """
    nodes = flow._nodes
    order = {name: i for i, name in enumerate(nodes)}
    parent = {name: name for name in nodes}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            if order[ra] > order[rb]:
                ra, rb = rb, ra
            parent[rb] = ra

    crossings = [(inp.node, name) for name, node in nodes.items() for inp in node.inputs if inp.autonomous]
    for name, node in nodes.items():
        for inp in node.inputs:
            if not inp.autonomous:
                union(name, inp.node)
    by_name: dict[str, Region] = {}
    for op, region in flow._regions.items():
        other = by_name.setdefault(region.name, region)
        if other != region:
            raise PipelineDefinitionError(
                f"region {region.name!r} is declared twice with different settings (on operator {op!r} and "
                "another one): declare the Region once and reuse the object")
    # components sharing a region name are one region too
    first_op: dict[str, str] = {}
    for op, region in flow._regions.items():
        if region.name in first_op:
            union(first_op[region.name], op)
        else:
            first_op[region.name] = op
    groups: dict[str, list[str]] = {}
    for name in nodes:
        groups.setdefault(find(name), []).append(name)
    annotated: dict[str, set[str]] = {}
    for op, region in flow._regions.items():
        annotated.setdefault(find(op), set()).add(region.name)
    parts: list[RegionPart] = []
    default_nodes: list[str] = []
    on_channel = {find(n) for edge in crossings for n in edge}
    for root, members in groups.items():
        names = annotated.get(root)
        if not names and root in on_channel:  # its own region behind / before an autonomous channel
            if members[0] in by_name:
                raise PipelineDefinitionError(
                    f"operator {members[0]!r} starts a region of its own (an autonomous channel reaches it) named after "
                    f"it, and a region {members[0]!r} exists too: annotate one of them with another Region name")
            parts.append(RegionPart(Region(members[0]), tuple(members), ()))
            continue
        if not names:
            default_nodes.extend(members)
            continue
        if DEFAULT_REGION in names:  # a user region named "default" takes the unannotated components
            default_nodes.extend(members)
            continue
        parts.append(RegionPart(_merge(sorted(names), by_name, members), tuple(members), tuple(sorted(names))))
    if default_nodes:
        default = by_name.get(DEFAULT_REGION, Region(DEFAULT_REGION))
        default_nodes.sort(key=order.__getitem__)
        parts.append(RegionPart(default, tuple(default_nodes), (DEFAULT_REGION,)))
    parts.sort(key=lambda p: order[p.nodes[0]])
    where = {n: part.name for part in parts for n in part.nodes}
    for producer, consumer in crossings:
        if where[producer] == where[consumer]:
            raise PipelineDefinitionError(
                f"the autonomous channel from {producer!r} into {consumer!r} has both ends in region "
                f"{where[consumer]!r} (other streams connect them, or they share a region annotation): an autonomous "
                "channel connects two regions; drop autonomous() or put its ends in different regions")
    return parts


def _merge(names: list[str], by_name: dict[str, Region], members: list[str]) -> Region:
    """One region from the annotations ``names`` that share a connected component."""
    if len(names) == 1:
        return by_name[names[0]]
    settings: dict = {}
    origin: dict[str, str] = {}
    for name in names:
        for key, value in by_name[name].settings.items():
            if key in settings and settings[key] != value:
                raise PipelineDefinitionError(
                    f"regions {origin[key]!r} and {name!r} are connected through the graph (both connect to "
                    f"operator {members[-1]!r}), so they merge into one region (seed 000 §3.1), but their {key} settings "
                    f"differ ({settings[key]!r} vs {value!r}): give them the same {key}, set it on one only, or "
                    "disconnect them")
            settings.setdefault(key, value)
            origin.setdefault(key, name)
    return Region("+".join(names), **settings)


def region_storage_url(base: str, job: str, part: RegionPart, regions: int) -> str:
    """The checkpoint storage URL region ``part`` of ``job`` runs with when the job's is
    ``base``: ``base`` itself for a job of one region (where its checkpoints always were),
    else the region's own ``CheckpointConfig.storage`` or ``<base>/<job>/regions/<region>``."""
    if regions == 1:
        own = part.region.checkpoint.storage if part.region.checkpoint is not None else None
        return own or base
    if part.region.checkpoint is not None and part.region.checkpoint.storage is not None:
        return part.region.checkpoint.storage
    return f"{base.rstrip('/')}/{job}/{REGIONS_DIR}/{part.name}"


def storage_url_of(flow, operator: str, base: str) -> str:
    """Where the checkpoints holding ``operator``'s state live when ``flow`` runs with
    checkpoint storage ``base`` (its region's; :func:`region_storage_url`)."""
    parts = layout_of(flow)
    part = next(p for p in parts if operator in p.nodes)
    return region_storage_url(base, flow.name, part, len(parts))


def regions_with_checkpoints(storage, job: str = "*") -> list[str]:
    """The regions under the job root of ``storage`` (a
    :class:`~epochal.backends.storage.CheckpointStorage`) that hold a checkpoint directory
    ``regions/<region>/<job>/chk-*``: ``job`` a glob, any job by default. Sorted; read-only."""
    found = storage.fs.glob(f"{storage.root}/{REGIONS_DIR}/*/{job}/chk-*")
    return sorted({path.split("/")[-3] for path in found})


def describe(parts: list[RegionPart], job_guarantee, job_checkpoint) -> str:
    """One line per region for the log: name, operators, guarantee and interval."""
    lines = []
    for part in parts:
        g = part.region.guarantee or job_guarantee
        c = part.region.checkpoint or job_checkpoint
        lines.append(f"region {part.name!r}: {len(part.nodes)} operator(s) ({', '.join(part.nodes)}), "
                     f"{getattr(g, 'value', g)}, checkpoint interval {c.interval}")
    return "; ".join(lines)
