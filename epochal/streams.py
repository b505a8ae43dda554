"""Streams of a dataflow: :class:`Stream` and :class:`KeyedStream`, the operators a
pipeline author chains (see :mod:`epochal.dataflow` for the :class:`~epochal.dataflow.Dataflow`
they belong to). Each method appends an immutable :class:`~epochal.graph.Node` to the flow
and returns the stream of its output; nothing runs.

Some operations are built by the feature they belong to, which registers its builder here
when imported (:func:`register_builder`; :mod:`epochal.dataflow` imports them all), so this
module never imports them back: ``Stream.iterate`` (:func:`epochal.loops.api.build_loop`),
``KeyedStream.window`` (:class:`epochal.windows.api.WindowedStream`) and, on streams of
Arrow batches, ``with_watermarks``, ``to_records``' event time, ``window`` and ``aggregate``
(:mod:`epochal.columnar.time`, :mod:`epochal.columnar.windows`, :mod:`epochal.columnar.build`).
"""
from __future__ import annotations

import re
from typing import Any, Callable

from epochal.errors import PipelineDefinitionError
from epochal.graph import FORWARD, Input, Node, NodeKind, PartitionKind, Partitioning

__all__ = ["KeyedStream", "Stream", "ValueKey", "check_callable", "check_name", "check_parallelism",
           "builder", "register_builder"]

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_API = {"hash": "key_by", "rebalance": "rebalance", "broadcast": "broadcast", "forward": "forward"}
_MISSING = object()

#: operation → its builder, registered by the module that owns the feature
_BUILDERS: dict[str, Callable] = {}


def register_builder(operation: str):
    """Decorator: register the builder of ``operation`` (``"iterate"``: ``builder(stream,
    name, body, parallelism, log_memory_records)``; ``"window"`` and ``"columnar.window"``:
    ``builder(keyed_stream, assigner, allowed_lateness, ttl)``; ``"columnar.watermarks"``,
    ``"columnar.event_time"``, ``"columnar.aggregate"``: see the call sites). Called once,
    when the owning module is imported."""
    def register(builder):
        _BUILDERS[operation] = builder
        return builder
    return register


def builder(operation: str) -> Callable:
    """The builder registered for ``operation`` (for features that extend another's API, e.g.
    ``window(...).aggregate(checkpoints=...)``)."""
    return _BUILDERS[operation]


class Stream:
    """A stream of records flowing out of one or more operators (several after ``union``)."""

    def __init__(self, flow, ports: tuple[Input, ...]):
        self._flow = flow
        self._ports = ports

    @property
    def flow(self):
        return self._flow

    def region(self, region) -> "Stream":
        """Place the operators producing this stream — and so every operator connected to
        them — in ``region`` (an :class:`epochal.Region` or its name; seed 000 §3.1's
        ``@consistent``); returns this stream. See :mod:`epochal.regions`."""
        for port in self._ports:
            self._flow._annotate_region(port.node, region)
        return self

    def autonomous(self, name: str | None = None) -> "Stream":
        """This stream as an **autonomous channel** (seed 000 §3.2): the operators reading the
        returned stream may be in another region than the ones producing it, and the two
        regions stay independent — no barrier crosses, neither waits for the other, each
        checkpoints and restarts on its own. Records cross at most once into a region that
        restarts behind the channel and may cross twice out of one that restarts before it
        (:mod:`epochal.regions.relay`). ``name``: the channel's operator (a pass-through in
        the reading region; default ``"<producer>.autonomous"``).

        Raises:
            PipelineDefinitionError: the stream carries event time (watermarks do not cross an
                autonomous channel: call ``with_watermarks`` after it) or is already
                partitioned (call ``key_by`` / ``rebalance`` / ``broadcast`` after it).
        """
        import dataclasses

        from epochal.regions.relay import pass_through

        producers = ", ".join(repr(p.node) for p in self._ports)
        name = name if name is not None else ".".join(p.node for p in self._ports) + ".autonomous"
        if self._timed(name):
            raise PipelineDefinitionError(
                f"autonomous channel {name!r} after {producers}: the stream carries event time, and watermarks do not "
                "cross an autonomous channel (the regions are not coordinated): call with_watermarks(...) after "
                "autonomous()")
        partitioned = [p for p in self._ports if p.partitioning.kind is not PartitionKind.FORWARD or p.feedback]
        if partitioned:
            raise PipelineDefinitionError(
                f"autonomous channel {name!r} after {producers}: the stream is already partitioned "
                f"({partitioned[0].partitioning.kind.value}); call key_by / rebalance / broadcast after autonomous()")
        crossing = Stream(self._flow, tuple(dataclasses.replace(p, autonomous=True) for p in self._ports))
        columnar = self._columnar(name)
        node = crossing._then(NodeKind.MAP_BATCHES if columnar else NodeKind.MAP, name, pass_through, None,
                              accepts="any")
        return Stream(self._flow, (Input(node.name, FORWARD),))

    def _default_parallelism(self) -> int:
        ps = {self._flow._nodes[p.node].parallelism for p in self._ports}
        return ps.pop() if len(ps) == 1 else self._flow.parallelism

    @property
    def has_event_time(self) -> bool:
        """Whether this stream's records carry timestamps (it descends from
        :meth:`with_watermarks`): event-time windows and timers need it."""
        return self._timed(None)

    def _timed(self, consumer: str | None) -> bool:
        """Whether the records of every port carry timestamps; a mix is an error."""
        nodes = self._flow._nodes
        kinds = {p.node: _port_timed(nodes[p.node], p.port) for p in self._ports}
        if len(set(kinds.values())) > 1:
            timed = sorted(n for n, t in kinds.items() if t)
            untimed = sorted(n for n, t in kinds.items() if not t)
            raise PipelineDefinitionError(
                f"{consumer or 'a stream'!r} reads streams with event time ({', '.join(map(repr, timed))}) and "
                f"without ({', '.join(map(repr, untimed))}): call with_watermarks on the ones without, so every "
                "record has a timestamp, before merging them")
        return kinds.popitem()[1] if kinds else False

    @property
    def is_columnar(self) -> bool:
        """Whether this stream carries ``pyarrow.RecordBatch``es (:mod:`epochal.columnar`)."""
        return self._columnar(None)

    def _columnar(self, consumer: str | None) -> bool:
        nodes = self._flow._nodes
        # a columnar operator's side outputs carry batches too (a window's late rows), not its dead letters
        kinds = {p.node: p.port != "dead_letters" and nodes[p.node].columnar for p in self._ports}
        if len(set(kinds.values())) > 1:
            raise PipelineDefinitionError(
                f"{consumer or 'a stream'!r} reads streams of Arrow batches "
                f"({', '.join(repr(n) for n, c in sorted(kinds.items()) if c)}) and of records "
                f"({', '.join(repr(n) for n, c in sorted(kinds.items()) if not c)}): convert one side with "
                "to_batches(...) or to_records(...) before merging them")
        return kinds.popitem()[1] if kinds else False

    def _then(self, kind: NodeKind, name: str, payload, parallelism, key_fn=None, extra=(),
              timed: bool | None = None, dead_letters: bool = False, accepts: str = "records",
              columnar: bool | None = None) -> Node:
        """Add a node reading this stream; its output carries timestamps if its input does
        (``timed`` overrides: True for nodes that assign them), and Arrow batches if its input
        does (``columnar`` overrides). ``accepts``: ``"records"``, ``"batches"`` or ``"any"``."""
        timed_in = self._timed(name)
        columnar_in = self._columnar(name)
        if accepts == "records" and columnar_in:
            raise PipelineDefinitionError(
                f"{kind.value} {name!r}: its input carries Arrow batches, and {kind.value} works on records — use "
                "map_batches / filter / select / with_column / key_by(column).aggregate on batches, or "
                "to_records(...) first")
        if accepts == "batches" and not columnar_in:
            raise PipelineDefinitionError(
                f"{kind.value} {name!r} works on Arrow batches but its input carries records — convert with "
                "to_batches(name, schema) first, or read a source that produces batches")
        if not isinstance(dead_letters, bool):
            raise PipelineDefinitionError(f"operator {name!r}: dead_letters must be True or False, got {dead_letters!r}")
        return self._flow._add(
            Node(name, kind, self._ports, self._default_parallelism() if parallelism is None else parallelism,
                 payload, key_fn, extra, timed_in=timed_in, timed=timed_in if timed is None else timed,
                 dead_letters=dead_letters, columnar=columnar_in if columnar is None else columnar)
        )

    # -- columnar streams (epochal.columnar) ---------------------------------------------
    def map_batches(self, name: str, fn: Callable, *, parallelism: int | None = None,
                    dead_letters: bool = False) -> "Stream":
        """``fn(batch)`` → a ``pyarrow.RecordBatch``, a ``pyarrow.Table`` or ``None``, for
        every Arrow batch of this stream (vectorized work: ``pyarrow.compute``)."""
        check_callable(fn, name, "map_batches")
        node = self._then(NodeKind.MAP_BATCHES, name, fn, parallelism, dead_letters=dead_letters, accepts="batches")
        return Stream(self._flow, (Input(node.name, FORWARD),))

    def select(self, name: str, *columns: str, parallelism: int | None = None) -> "Stream":
        """Keep (and order) ``columns`` of every batch."""
        from epochal.columnar.api import Select

        return self.map_batches(name, Select(columns), parallelism=parallelism)

    def with_column(self, name: str, column: str, fn: Callable, *, parallelism: int | None = None) -> "Stream":
        """Add (or replace) ``column`` = ``fn(batch)`` (an array or scalar) in every batch."""
        from epochal.columnar.api import WithColumn

        check_callable(fn, name, "with_column")
        return self.map_batches(name, WithColumn(column, fn), parallelism=parallelism)

    def to_records(self, name: str, *, parallelism: int | None = None) -> "Stream":
        """Arrow batches → one ``dict`` per row (a record stream); with event time (a column,
        :mod:`epochal.columnar.time`) the records carry it as the record path's do."""
        time = None
        if self._timed(name):
            time = _BUILDERS["columnar.event_time"](self, f"to_records {name!r}")
        node = self._then(NodeKind.TO_RECORDS, name, time, parallelism, accepts="batches", columnar=False)
        return Stream(self._flow, (Input(node.name, FORWARD),))

    def to_batches(self, name: str, schema=None, *, parallelism: int | None = None) -> "Stream":
        """Records (dicts, or tuples in ``schema`` order) → one Arrow batch per input batch."""
        import pyarrow as pa

        if schema is not None and not isinstance(schema, pa.Schema):
            raise PipelineDefinitionError(f"to_batches {name!r}: schema must be a pyarrow.Schema, got {schema!r}")
        if self._timed(name):
            raise PipelineDefinitionError(f"to_batches {name!r}: its records carry event time, which batches keep in "
                                          "a column: convert records without it, then with_watermarks(name, "
                                          "timestamp='column') on the batches")
        node = self._then(NodeKind.TO_BATCHES, name, schema, parallelism, columnar=True)
        return Stream(self._flow, (Input(node.name, FORWARD),))

    def dead_letters(self) -> "Stream":
        """The records the operator before this point failed on, as
        :class:`~epochal.operators.base.DeadLetter` ``(operator, error, record)``, when it was
        built with ``dead_letters=True`` — the job then goes on past poison records instead
        of failing (a dead-letter queue). Sink them somewhere you will look."""
        nodes = self._flow._nodes
        if len(self._ports) != 1 or self._ports[0].port != "main" or not nodes[self._ports[0].node].dead_letters:
            names = ", ".join(repr(p.node) for p in self._ports)
            raise PipelineDefinitionError(
                f"dead_letters() after {names}: only the output of one operator built with dead_letters=True "
                "has dead letters (e.g. stream.map('parse', fn, dead_letters=True).dead_letters())")
        return Stream(self._flow, (Input(self._ports[0].node, FORWARD, port="dead_letters"),))

    def with_watermarks(self, name: str, *, timestamp: Callable, max_out_of_orderness=0, idle_timeout=None,
                        timestamp_unit: str = "s", parallelism: int | None = None,
                        dead_letters: bool = False) -> "Stream":
        """Assign each record its event time and emit watermarks (:mod:`epochal.time`).

        Args:
            name: the operator's name (its state: the highest timestamp seen).
            timestamp: ``fn(record)`` → a number in ``timestamp_unit`` (seconds by default) or
                a ``datetime`` (naive = UTC). Records keep their value; the timestamp travels
                with them.
            timestamp_unit: ``"s"``, ``"ms"``, ``"us"`` or ``"ns"`` for numeric timestamps
                (epoch milliseconds, as Kafka and Flink use: ``"ms"``). A timestamp beyond the
                year 10000 fails naming the unit it was read in (e.g. milliseconds read as
                seconds).
            max_out_of_orderness: how far (a duration: seconds or ``"5s"``) a record may
                arrive behind the highest timestamp seen and still be on time; the
                watermark is ``max timestamp - max_out_of_orderness - 1 µs``.
            idle_timeout: after this much processing time without records, this subtask
                stops holding back downstream event time (a quiet partition must not stall
                windows); ``None``: never idle. The end of a bounded input always ends
                event time (every window and event-time timer fires).

        Chained right after a source (same parallelism), it runs in the source's tasks.
        Watermarks arriving from upstream are replaced by this operator's, except the end
        of input, which passes.

        Raises:
            PipelineDefinitionError: ``timestamp`` is not callable or a duration is invalid,
                naming the operator.
        """
        from epochal.time.assign import WatermarkSpec

        if self._columnar(name):  # Arrow batches: timestamp= names the event-time column (epochal.columnar.time)
            return _BUILDERS["columnar.watermarks"](self, name, timestamp, max_out_of_orderness, idle_timeout,
                                                    timestamp_unit, parallelism, dead_letters)
        check_callable(timestamp, name, "with_watermarks")
        spec = WatermarkSpec.build(name, timestamp, max_out_of_orderness, idle_timeout, timestamp_unit)
        node = self._then(NodeKind.WATERMARKS, name, spec, parallelism, timed=True, dead_letters=dead_letters)
        return Stream(self._flow, (Input(node.name, FORWARD),))

    def map(self, name: str, fn: Callable, *, parallelism: int | None = None,
               dead_letters: bool = False) -> "Stream":
        """Emit ``fn(record)`` for every record."""
        check_callable(fn, name, "map")
        node = self._then(NodeKind.MAP, name, fn, parallelism, dead_letters=dead_letters)
        return Stream(self._flow, (Input(node.name, FORWARD),))

    def flat_map(self, name: str, fn: Callable, *, parallelism: int | None = None,
                    dead_letters: bool = False) -> "Stream":
        """Emit every element of ``fn(record)`` (an iterable; ``None`` emits nothing)."""
        check_callable(fn, name, "flat_map")
        node = self._then(NodeKind.FLAT_MAP, name, fn, parallelism, dead_letters=dead_letters)
        return Stream(self._flow, (Input(node.name, FORWARD),))

    def filter(self, name: str, fn: Callable, *, parallelism: int | None = None,
                  dead_letters: bool = False) -> "Stream":
        """Keep the records for which ``fn(record)`` is truthy."""
        if self._columnar(name):  # Arrow batches: a pyarrow.compute expression, or fn(batch) -> mask
            from epochal.columnar.api import Filter

            return self.map_batches(name, Filter.of(name, fn), parallelism=parallelism, dead_letters=dead_letters)
        check_callable(fn, name, "filter")
        node = self._then(NodeKind.FILTER, name, fn, parallelism, dead_letters=dead_letters)
        return Stream(self._flow, (Input(node.name, FORWARD),))

    def key_by(self, key_fn: Callable | str) -> "KeyedStream":
        """Partition by ``key_fn(record)`` (hash of the key → key group → subtask).

        ``key_fn`` must be deterministic; keys must be str/int/float/bytes/bool/None or
        tuples of them (they are hashed identically in every process).
        """
        if self._columnar("key_by"):
            from epochal.columnar.keys import ColumnKey

            if not isinstance(key_fn, str) or not key_fn:
                raise PipelineDefinitionError(
                    f"key_by after {', '.join(repr(p.node) for p in self._ports)}: a stream of Arrow batches is keyed "
                    f"by a column name, got {key_fn!r}")
            key = ColumnKey(key_fn)
            return KeyedStream(self._flow, self._repartition(Partitioning(PartitionKind.HASH, key)), key)
        if key_fn is None or not callable(key_fn):
            producers = ", ".join(repr(p.node) for p in self._ports)
            raise PipelineDefinitionError(
                f"key_by after {producers}: a key function is required (got {key_fn!r})"
            )
        route_fn = ValueKey(key_fn) if self._timed("key_by") else key_fn  # routes (timestamp, value) pairs
        return KeyedStream(self._flow, self._repartition(Partitioning(PartitionKind.HASH, route_fn)), key_fn)

    def window(self, assigner, **_):
        """Windows are per key: ``stream.key_by(fn).window(...)``."""
        producers = ", ".join(repr(p.node) for p in self._ports)
        raise PipelineDefinitionError(
            f"window after {producers}: windows are kept per key — call key_by(...) first "
            "(key_by(lambda r: 0) puts every record in one key, at parallelism 1)")

    def rebalance(self) -> "Stream":
        """Distribute records round-robin over the next operator's subtasks.

        Each producer subtask counts its records across batches: its n-th record goes to
        subtask ``n mod parallelism`` (starting at 0), so the subtasks it feeds receive
        counts that differ by at most one.
        """
        return Stream(self._flow, self._repartition(Partitioning(PartitionKind.REBALANCE)))

    def broadcast(self) -> "Stream":
        """Send every record to every subtask of the next operator."""
        return Stream(self._flow, self._repartition(Partitioning(PartitionKind.BROADCAST)))

    def _repartition(self, partitioning: Partitioning) -> tuple[Input, ...]:
        replaced = [p for p in self._ports if p.partitioning.kind is not PartitionKind.FORWARD]
        if replaced:
            first = replaced[0].partitioning.kind.value
            raise PipelineDefinitionError(
                f"after {replaced[0].node!r}: a {partitioning.kind.value} partitioning follows a {first} one "
                f"(e.g. .{_API[first]}().{_API[partitioning.kind.value]}(...)); the second would silently replace "
                "the first — keep only the one you mean")
        # a side output (late records, dead letters) stays the port it is: only the routing changes
        return tuple(Input(p.node, partitioning, p.feedback, p.port) for p in self._ports)

    def union(self, *others: "Stream") -> "Stream":
        """Merge this stream with others (no operator: the next operator reads all inputs)."""
        ports = list(self._ports)
        for other in others:
            if not isinstance(other, Stream) or other._flow is not self._flow:
                raise PipelineDefinitionError("union: every stream must belong to the same Dataflow")
            ports.extend(other._ports)
        return Stream(self._flow, tuple(ports))

    def connect_broadcast(self, rules: "Stream"):
        """Connect this stream with ``rules``, whose every element reaches every subtask of
        the next operator and is kept in its broadcast state: ``.process(name, fn)`` with a
        :class:`~epochal.broadcast.BroadcastProcessFunction` (a
        :class:`~epochal.broadcast.KeyedBroadcastProcessFunction` on a keyed stream). See
        docs/ttl-broadcast.md."""
        return _BUILDERS["connect_broadcast"](self, rules)

    def connect(self, other: "Stream"):
        """Read this stream and ``other`` in one two-input operator: ``a.connect(b).process(name,
        CoProcessFunction)``; keyed, ``a.key_by(f).connect(b.key_by(g)).process(name,
        KeyedCoProcessFunction)`` (state and timers per key, shared by both inputs).
        See :mod:`epochal.coprocess`."""
        return _BUILDERS["connect"](self, other)

    def iterate(self, name: str, body: Callable, *, parallelism: int | None = None,
                log_memory_records: int = 100_000) -> "Stream":
        """A feedback loop: ``body(loop_input)`` returns ``(feedback, output)``.

        Records of this stream enter the loop; ``feedback`` records go back to the loop's
        input (the loop head, ``name``) and ``output`` leaves the loop. Loops may nest
        (call ``iterate`` inside a body). Exactly-once and at-least-once both hold for
        records in flight inside the loop: the head logs records arriving on the feedback
        edge while an epoch's barrier circulates (seed 004 Alg. 7) and replays the log
        on restore (§4.1.3.1). The in-memory log is bounded by ``log_memory_records``
        per epoch; beyond it the log spills to local disk and is uploaded in segments.

        Example (Collatz step counts; each record loops until it reaches 1)::

            def body(s):
                step = s.map("step", lambda r: r if r[1] == 1 else
                             (r[0], r[1] // 2 if r[1] % 2 == 0 else 3 * r[1] + 1, r[2] + 1))
                return step.filter("more", lambda r: r[1] != 1), step.filter("done", lambda r: r[1] == 1)
            steps = numbers.map("init", lambda n: (n, n, 0)).iterate("collatz", body)

        Raises:
            PipelineDefinitionError: ``body`` does not return two streams of this dataflow,
                ``feedback`` does not depend on the loop's input, or is the input unchanged.
        """
        return _BUILDERS["iterate"](self, name, body, parallelism, log_memory_records)

    def sink(self, name: str, sink, *, parallelism: int | None = None) -> None:
        """Write the stream to an :class:`epochal.sinks.Sink`."""
        from epochal.sinks.base import Sink

        if not isinstance(sink, Sink):
            raise PipelineDefinitionError(f"sink {name!r}: expected an epochal.sinks.Sink, got {type(sink).__name__}")
        self._then(NodeKind.SINK, name, sink, parallelism, accepts="any")


class KeyedStream(Stream):
    """A stream partitioned by key; keyed operators keep state per key."""

    def __init__(self, flow, ports: tuple[Input, ...], key_fn: Callable):
        super().__init__(flow, ports)
        self._key_fn = key_fn

    def reduce(self, name: str, fn: Callable, *, initial: Any = _MISSING, parallelism: int | None = None,
               dead_letters: bool = False, ttl=None, queryable: bool = False) -> Stream:
        """Rolling reduce per key: ``acc = fn(acc, record)``; emits each new ``acc``.

        Without ``initial`` the key's first record is its first accumulator. ``ttl`` (a
        duration or :class:`~epochal.ttl.StateTtl`): a key's accumulator expires that long
        after its last update, and the key starts afresh (docs/ttl-broadcast.md).
        ``queryable``: a running job answers lookups of each key's accumulator, as state
        ``"acc"`` (``handle.query(name, "acc", key)``, docs/queryable-state.md); with a
        ``ttl``, an accumulator expired at the answered version's clock reads as ``None``.
        """
        check_callable(fn, name, "reduce")
        from epochal.query.readers import QueryableFlag
        from epochal.ttl.expiry import EVENT, StateTtl

        config = StateTtl.coerce(ttl, f"reduce {name!r}")
        if config is not None and config.time == EVENT and not self._timed(name):
            raise PipelineDefinitionError(f"reduce {name!r}: event-time ttl needs event time on its input; call "
                                          "with_watermarks upstream or use time='processing'")
        if not isinstance(queryable, bool):
            raise PipelineDefinitionError(f"reduce {name!r}: queryable must be True or False, got {queryable!r}")
        extra = ((() if initial is _MISSING else (initial,)) + (() if config is None else (config,))
                 + ((QueryableFlag(),) if queryable else ()))
        node = self._then(NodeKind.REDUCE, name, fn, parallelism, self._key_fn, extra, dead_letters=dead_letters)
        return Stream(self._flow, (Input(node.name, FORWARD),))

    def window(self, assigner, *, allowed_lateness=0, ttl=None):
        """Cut each key's records into windows: ``Tumbling(size)``, ``Sliding(size, slide)``
        or ``Session(gap)`` from :mod:`epochal.windows`; finish with ``.reduce``,
        ``.aggregate`` or ``.process``. Event-time windows need :meth:`with_watermarks`
        upstream. ``allowed_lateness`` (a duration) keeps a window's state after it fired:
        records up to that much behind the watermark update it (it fires again); later ones
        go to the result's ``.late()`` side output. ``ttl`` (a duration or
        :class:`~epochal.ttl.StateTtl`, processing or event time): a key's pending windows
        are dropped unfired once the key had no record for that long (docs/ttl-broadcast.md)."""
        if self._columnar("window"):  # Arrow batches: vectorized windows (epochal.columnar.windows)
            return _BUILDERS["columnar.window"](self, assigner, allowed_lateness, ttl)
        return _BUILDERS["window"](self, assigner, allowed_lateness, ttl)

    def interval_join(self, other: "KeyedStream", lower, upper, *, how: str = "inner", ttl=None):
        """Pair each record ``l`` of this stream with every record ``r`` of ``other`` of the
        same key with ``l.t + lower <= r.t <= l.t + upper`` (event time; durations); finish
        with ``.apply(name, fn)``. ``how``: ``"inner"``, ``"left"``, ``"right"`` or
        ``"full"`` (a row the watermark proves unmatched comes out with ``None``).
        See :mod:`epochal.joins`. ``ttl`` is refused: the watermark already bounds the buffers."""
        return _BUILDERS["interval_join"](self, other, lower, upper, how, ttl)

    def window_join(self, other: "KeyedStream", assigner, *, how: str = "inner", ttl=None):
        """Pair the records of this stream and ``other`` with the same key in the same
        event-time window (``Tumbling``, ``Sliding`` or ``Session`` from
        :mod:`epochal.windows`); finish with ``.apply(name, fn)``. See :mod:`epochal.joins`.
        ``ttl`` is refused: the watermark already bounds the buffers."""
        return _BUILDERS["window_join"](self, other, assigner, how, ttl)

    def temporal_join(self, table: "KeyedStream", *, how: str = "inner", is_delete: Callable | str | None = None,
                      ttl=None):
        """Pair each record of this stream with the latest row of the changelog stream
        ``table`` with its key as of the record's event time; finish with ``.apply(name,
        fn)``. ``is_delete``: ``row -> bool`` on records, the name of a boolean column on
        Arrow batches (:mod:`epochal.columnar.temporal_join`). ``ttl`` (a duration or
        :class:`~epochal.ttl.StateTtl`, processing or event time; records only): a key's
        table expires after that long without a new row of the key (docs/ttl-broadcast.md).
        See :mod:`epochal.joins`."""
        return _BUILDERS["temporal_join"](self, table, how, is_delete, ttl)

    def aggregate(self, name: str, *, parallelism: int | None = None, local: bool | None = None,
                  budget_bytes: int = 64 << 20, queryable: bool = False, **aggregations) -> Stream:
        """Vectorized keyed aggregation of Arrow batches (:mod:`epochal.columnar.aggregates`):
        ``key_by("word").aggregate("counts", n=count(), bytes=sum("size"))``.

        Output: just before each barrier, one batch of the keys whose aggregates changed
        since the previous emission, with their current values (the key column and one
        column per aggregation) — and earlier when the partials buffered since then exceed
        ``budget_bytes`` (per subtask). ``local`` (default: when every aggregation combines
        in Arrow): pre-aggregate in the producing tasks before the shuffle
        (:mod:`epochal.columnar.build`). ``ttl=`` (a duration or processing-time
        :class:`~epochal.ttl.StateTtl`): a key's accumulators expire that long after the
        last merge that updated it, and it starts afresh (:mod:`epochal.columnar.ttl`).
        ``queryable``: a running job answers lookups of each key's results, as state
        ``"results"`` (:mod:`epochal.columnar.queries`)."""
        ttl = aggregations.pop("ttl", None)
        return _BUILDERS["columnar.aggregate"](self, name, parallelism, aggregations, local, budget_bytes, ttl,
                                               queryable)

    def process(self, name: str, function, *, parallelism: int | None = None, dead_letters: bool = False) -> Stream:
        """Run a :class:`~epochal.operators.keyed.KeyedProcessFunction` with keyed state."""
        from epochal.operators.keyed import KeyedProcessFunction

        if not isinstance(function, KeyedProcessFunction):
            raise PipelineDefinitionError(
                f"process {name!r}: expected a KeyedProcessFunction instance, got {type(function).__name__}"
            )
        node = self._then(NodeKind.PROCESS, name, function, parallelism, self._key_fn, dead_letters=dead_letters)
        return Stream(self._flow, (Input(node.name, FORWARD),))


class ValueKey:
    """The key function of a stream with event time as the router applies it: records are
    ``(timestamp, value)`` pairs and the user's ``key_fn`` takes the value."""

    __slots__ = ("key_fn",)

    def __init__(self, key_fn: Callable):
        self.key_fn = key_fn

    def __call__(self, record):
        return self.key_fn(record[1])

    def __reduce__(self):
        return ValueKey, (self.key_fn,)


def _port_timed(node: Node, port: str) -> bool:
    """Whether records of ``node``'s output ``port`` carry timestamps: the main output's
    are ``node.timed``; side outputs (late records, dead letters) carry input records."""
    if port == "dead_letters":
        return False  # DeadLetter records carry the failed value, not its timestamp
    return node.timed if port == "main" else node.timed_in


def check_name(name, what: str) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise PipelineDefinitionError(
            f"{what} name {name!r} is invalid: use letters, digits, '_', '-', '.'"
        )


def check_parallelism(p, where: str) -> None:
    if not isinstance(p, int) or isinstance(p, bool) or p < 1:
        raise PipelineDefinitionError(f"{where}: parallelism must be an integer >= 1, got {p!r}")


def check_callable(fn, name, op: str) -> None:
    if not callable(fn):
        raise PipelineDefinitionError(f"{op} {name!r}: expected a function, got {fn!r}")
