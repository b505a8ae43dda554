"""The pipeline author's API: :class:`Dataflow`, and its :class:`~epochal.streams.Stream` and
:class:`~epochal.streams.KeyedStream` (re-exported here).

Building a dataflow runs nothing and never touches Spark; it appends immutable
:class:`~epochal.graph.Node` objects. Errors in the graph (duplicate names, a missing
key function, a non-callable, a stream nobody consumes) are raised while building or,
for whole-graph checks, by :meth:`Dataflow.plan`, which every run calls first.

Example:
    >>> import epochal as ep
    >>> flow = ep.Dataflow("wordcount")
    >>> words = flow.source("lines", ep.sources.CollectionSource(["a b", "b"])).flat_map("split", str.split)
    >>> counts = words.map("one", lambda w: (w, 1)).key_by(lambda p: p[0]).reduce(
    ...     "count", lambda a, b: (a[0], a[1] + b[1]))
    >>> counts.sink("out", ep.sinks.FileSink("/tmp/out"))
"""
from __future__ import annotations

from epochal.backends.keygroups import MAX_MAX_PARALLELISM
from epochal.broadcast import api as _broadcast_api  # noqa: F401  (registers Stream.connect_broadcast's builder)
from epochal.columnar import build as _columnar_build  # noqa: F401  (registers the builders of Arrow batches)
from epochal.columnar import time as _columnar_time  # noqa: F401
from epochal.columnar import windows as _columnar_windows  # noqa: F401
from epochal.coprocess import api as _coprocess_api  # noqa: F401  (registers Stream.connect's builder)
from epochal.errors import PipelineDefinitionError
from epochal.eventual import pipeline as _eventual_pipeline  # noqa: F401  (registers aggregate(checkpoints=Eventual))
from epochal.graph import FORWARD, Input, Node, NodeKind
from epochal.loops import api as _loops_api  # noqa: F401  (registers Stream.iterate's builder)
from epochal.streams import KeyedStream, Stream, ValueKey, check_name, check_parallelism
from epochal.joins import api as _joins_api  # noqa: F401  (registers the joins' builders)
from epochal.windows import api as _windows_api  # noqa: F401  (registers KeyedStream.window's builder)

__all__ = ["Dataflow", "KeyedStream", "Stream", "ValueKey"]


class Dataflow:
    """A named streaming dataflow.

    Args:
        name: job name; checkpoints live under ``<storage>/<name>/``.
        parallelism: default parallelism of sources and multi-input operators.
        max_parallelism: number of key groups (upper bound of any keyed operator's
            parallelism; fixed for the life of the job's checkpoints, seed 004 §4.2.1).
    """

    def __init__(self, name: str, *, parallelism: int = 1, max_parallelism: int = 128):
        check_name(name, "dataflow")
        check_parallelism(parallelism, f"dataflow {name!r}")
        check_parallelism(max_parallelism, f"dataflow {name!r} max_parallelism")
        if max_parallelism > MAX_MAX_PARALLELISM:
            raise PipelineDefinitionError(
                f"dataflow {name!r}: max_parallelism {max_parallelism} exceeds the limit {MAX_MAX_PARALLELISM}"
            )
        self.name = name
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self._nodes: dict[str, Node] = {}
        #: operator → its region annotation (epochal.regions; seed 000 §3.1)
        self._regions: dict = {}

    @property
    def nodes(self) -> dict[str, Node]:
        return dict(self._nodes)

    def source(self, name: str, source, *, parallelism: int | None = None, region=None) -> "Stream":
        """Add a replayable source (an :class:`epochal.sources.Source`).

        ``region``: an :class:`epochal.Region` (or its name) the source — and every operator
        connected to it — belongs to: checkpointed and restarted independently of the job's
        other regions (:mod:`epochal.regions`)."""
        from epochal.sources.base import Source

        if not isinstance(source, Source):
            raise PipelineDefinitionError(
                f"source {name!r}: expected an epochal.sources.Source, got {type(source).__name__}"
            )
        node = self._add(Node(name, NodeKind.SOURCE, (), self.parallelism if parallelism is None else parallelism,
                              source, columnar=source.schema is not None))
        if region is not None:
            self._annotate_region(node.name, region)
        return Stream(self, (Input(node.name, FORWARD),))

    def _add(self, node: Node) -> Node:
        check_name(node.name, "operator")
        for inp in node.inputs:
            if inp.node not in self._nodes:
                raise PipelineDefinitionError(
                    f"operator {node.name!r} reads from {inp.node!r}, which is not (yet) an operator of dataflow "
                    f"{self.name!r}: a stream can only read operators defined before it, so the graph stays "
                    "acyclic; build feedback loops with Stream.iterate(name, body)"
                )
        check_parallelism(node.parallelism, f"operator {node.name!r}")
        if node.name in self._nodes:
            raise PipelineDefinitionError(
                f"duplicate operator name {node.name!r} in dataflow {self.name!r}: names key the "
                "operator's state and must be unique"
            )
        if node.is_keyed and node.parallelism > self.max_parallelism:
            raise PipelineDefinitionError(
                f"operator {node.name!r}: parallelism {node.parallelism} exceeds max_parallelism "
                f"{self.max_parallelism} (the number of key groups)"
            )
        self._nodes[node.name] = node
        return node

    def remove_unread(self, name: str):
        """Drop operator ``name`` if no operator reads it, with its region annotation; returns
        that annotation (``None``: none, or the operator is read and stays). For a feature that
        takes over its upstream (eventual checkpoints read their source themselves)."""
        if any(inp.node == name for node in self._nodes.values() for inp in node.inputs):
            return None
        self._nodes.pop(name, None)
        return self._regions.pop(name, None)

    def _annotate_region(self, node: str, region) -> None:
        from epochal.regions.api import annotate

        annotate(self, node, region)

    def regions(self):
        """The job's regions (:func:`epochal.regions.layout_of`): one
        :class:`~epochal.regions.RegionPart` per region, with its operators."""
        from epochal.regions.layout import layout_of

        return layout_of(self)

    def plan(self, **kwargs):
        """Validate the whole graph and compile it to the physical task graph."""
        from epochal.plan import compile_plan

        return compile_plan(self, **kwargs)

    def start(self, **options):
        """Start the job without waiting; returns a :class:`~epochal.runtime.driver.handle.JobHandle`
        (``trigger_epoch()``, ``wait()``, ``cancel()``). Options as for :meth:`run`."""
        from epochal.runtime.driver.job import start_job

        return start_job(self, **options)

    def run(self, **options):
        """Run the job to completion and return its :class:`~epochal.runtime.driver.result.JobResult`.

        Keyword options: ``guarantee`` ("exactly-once" default, or "at-least-once"),
        ``checkpoint`` (:class:`~epochal.config.CheckpointConfig`), ``restart``
        (:class:`~epochal.config.RestartStrategy`), ``channels``
        (:class:`~epochal.config.ChannelConfig`), ``runtime`` ("spark" default, or
        "local"), ``spark`` (a SparkSession to use), ``resume`` (continue from the
        latest completed checkpoint in the storage), ``faults`` (see
        :mod:`epochal.testing`), ``backend`` ("heap" default, "rocksdb", or a
        :class:`~epochal.backends.choice.BackendSpec`), ``cluster``
        (:class:`~epochal.config.ClusterConfig`), ``allow_non_restored_state`` (restore even
        though state of operators the dataflow no longer has would be dropped; see
        :mod:`epochal.runtime.driver.compatibility`), ``metrics`` (:class:`~epochal.config.MetricsConfig`:
        live progress events, a listener, Prometheus, the terminal status line),
        ``restore_from`` (start from a savepoint or retained checkpoint URL, with the same
        compatibility rules; see :mod:`epochal.state`).

        While it blocks in a terminal, a one-line status shows epoch, records/s and the last
        checkpoint (``metrics=MetricsConfig(status=False)`` turns it off). With
        ``MetricsConfig(ui=True)`` the dashboard's address (with its token) goes to standard error.
        """
        import sys

        handle = self.start(**options)
        if handle.ui_url is not None:
            print(f"epochal: dashboard of job {self.name!r} at {handle.ui_url}", file=sys.stderr, flush=True)
        for region, url in getattr(handle, "ui_urls", {}).items():  # a job of several regions
            print(f"epochal: dashboard of region {region!r} of job {self.name!r} at {url}", file=sys.stderr, flush=True)
        config = options.get("metrics")
        status = getattr(config, "status", None)
        if status is None:
            status = sys.stderr.isatty()
        return handle.wait(status=status)
