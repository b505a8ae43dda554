"""Build-time validation of the pipeline API, run-option validation, and physical-plan facts.

Everything here is checked without running a job, except the broadcast delivery test
(one tiny local run). Every error must be an epochal error whose message names what was
wrong and where (operator, config key), and graph errors must surface before any task
process is started.
"""
from __future__ import annotations

import collections
import math
import os
import sys

import cloudpickle
import pytest

import epochal as ep
from epochal.errors import ConfigError, PipelineDefinitionError
from epochal.graph import PartitionKind
from epochal.sinks import FileSink, read_committed

# Task processes do not import this module: ship its functions by value (as __main__ code is).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _src(items=(1, 2, 3), splits=1):
    return ep.sources.CollectionSource(list(items), num_splits=splits)


def _sink(tmp_path, name="out"):
    return FileSink(str(tmp_path / name))


def _identity(x):
    return x


class _Count(ep.KeyedProcessFunction):
    def open(self, ctx):
        self.n = ctx.value_state("n", default=0)

    def process(self, key, value):
        self.n.update(self.n.value() + 1)
        yield (key, self.n.value())


@pytest.fixture
def no_tasks(monkeypatch):
    """Fail the test if a launcher (and hence any task process) is created."""
    from epochal.runtime.launch import launcher

    created = []

    def forbidden(self, *a, **k):
        created.append(self)
        raise AssertionError("a LocalLauncher was created: validation must happen before any task starts")

    monkeypatch.setattr(launcher.LocalLauncher, "__init__", forbidden)
    return created


# --------------------------------------------------------------------------- names

def test_duplicate_operator_name_names_the_duplicate(tmp_path):
    flow = ep.Dataflow("dup")
    s = flow.source("src", _src())
    s.map("twice", _identity)
    with pytest.raises(PipelineDefinitionError) as ei:
        s.map("twice", _identity)
    msg = str(ei.value)
    assert "'twice'" in msg and "duplicate" in msg and "'dup'" in msg


def test_duplicate_name_across_kinds_is_rejected(tmp_path):
    flow = ep.Dataflow("dup2")
    s = flow.source("same", _src())
    with pytest.raises(PipelineDefinitionError, match="duplicate operator name 'same'"):
        s.sink("same", _sink(tmp_path))
    # a failed _add leaves the graph unchanged
    assert list(flow.nodes) == ["same"]


@pytest.mark.parametrize("bad", ["", "has space", "a/b", "tab\t", "ünï", "x:y", None, 7, b"bytes"])
def test_invalid_operator_names(bad, tmp_path):
    flow = ep.Dataflow("names")
    with pytest.raises(PipelineDefinitionError) as ei:
        flow.source(bad, _src())
    assert repr(bad) in str(ei.value) and "invalid" in str(ei.value)
    s = flow.source("ok", _src())
    with pytest.raises(PipelineDefinitionError, match="invalid"):
        s.map(bad, _identity)
    with pytest.raises(PipelineDefinitionError, match="invalid"):
        s.key_by(_identity).reduce(bad, lambda a, b: a)
    with pytest.raises(PipelineDefinitionError, match="invalid"):
        s.sink(bad, _sink(tmp_path))


@pytest.mark.parametrize("bad", ["", "my job", "../escape", None])
def test_invalid_dataflow_names(bad):
    with pytest.raises(PipelineDefinitionError, match="dataflow name"):
        ep.Dataflow(bad)


def test_name_with_trailing_newline_rejected():
    with pytest.raises(PipelineDefinitionError):
        ep.Dataflow("job\n")


def test_valid_names_accepted(tmp_path):
    flow = ep.Dataflow("Job_1.v-2")
    flow.source("src.A-1_b", _src()).map("m.2", _identity).sink("out-3", _sink(tmp_path))
    assert list(flow.nodes) == ["src.A-1_b", "m.2", "out-3"]


# --------------------------------------------------------------------------- functions

@pytest.mark.parametrize("bad", [None, 42, "str.upper", [_identity]])
def test_key_by_requires_a_callable(bad):
    flow = ep.Dataflow("kb")
    s = flow.source("src", _src())
    with pytest.raises(PipelineDefinitionError) as ei:
        s.key_by(bad)
    msg = str(ei.value)
    assert "key function" in msg and "'src'" in msg and repr(bad) in msg


def test_key_by_after_union_names_every_producer():
    flow = ep.Dataflow("kbu")
    a, b = flow.source("a", _src()), flow.source("b", _src())
    with pytest.raises(PipelineDefinitionError, match=r"'a', 'b'"):
        a.union(b).key_by(None)


@pytest.mark.parametrize("op", ["map", "flat_map", "filter"])
@pytest.mark.parametrize("bad", [None, 1, "upper"])
def test_stateless_operators_require_callables(op, bad):
    flow = ep.Dataflow("fn")
    s = flow.source("src", _src())
    with pytest.raises(PipelineDefinitionError) as ei:
        getattr(s, op)("user_op", bad)
    msg = str(ei.value)
    assert f"{op} 'user_op'" in msg and repr(bad) in msg
    assert "user_op" not in flow.nodes


def test_reduce_requires_a_callable():
    flow = ep.Dataflow("red")
    with pytest.raises(PipelineDefinitionError, match="reduce 'r'"):
        flow.source("src", _src()).key_by(_identity).reduce("r", "sum")


@pytest.mark.parametrize("bad", [_identity, _Count, object(), None])
def test_process_requires_a_keyed_process_function_instance(bad):
    flow = ep.Dataflow("proc")
    keyed = flow.source("src", _src()).key_by(_identity)
    with pytest.raises(PipelineDefinitionError) as ei:
        keyed.process("p", bad)
    assert "process 'p'" in str(ei.value) and "KeyedProcessFunction" in str(ei.value)


def test_source_must_be_a_source():
    flow = ep.Dataflow("s")
    with pytest.raises(PipelineDefinitionError) as ei:
        flow.source("src", [1, 2, 3])
    assert "source 'src'" in str(ei.value) and "list" in str(ei.value)
    assert flow.nodes == {}


def test_sink_must_be_a_sink(tmp_path):
    flow = ep.Dataflow("k")
    s = flow.source("src", _src())
    with pytest.raises(PipelineDefinitionError) as ei:
        s.sink("out", str(tmp_path / "out"))
    assert "sink 'out'" in str(ei.value) and "str" in str(ei.value)
    with pytest.raises(PipelineDefinitionError, match="sink 'out2'"):
        s.sink("out2", print)


# --------------------------------------------------------------------------- parallelism

@pytest.mark.parametrize("bad", [0, -1, "2", True, False, 1.5, None])
def test_dataflow_parallelism_validated(bad):
    with pytest.raises(PipelineDefinitionError, match=r"parallelism must be an integer >= 1"):
        ep.Dataflow("p", parallelism=bad)
    with pytest.raises(PipelineDefinitionError, match="max_parallelism"):
        ep.Dataflow("p", max_parallelism=bad)


@pytest.mark.parametrize("bad", [
    -1, "2", True, 1.5,
    0,
    False,
])
@pytest.mark.parametrize("where", ["source", "map", "reduce", "sink"])
def test_operator_parallelism_validated(bad, where, tmp_path):
    flow = ep.Dataflow("p", parallelism=2)
    with pytest.raises(PipelineDefinitionError) as ei:
        if where == "source":
            flow.source("op", _src(), parallelism=bad)
        else:
            s = flow.source("src", _src())
            if where == "map":
                s.map("op", _identity, parallelism=bad)
            elif where == "reduce":
                s.key_by(_identity).reduce("op", lambda a, b: a, parallelism=bad)
            else:
                s.sink("op", _sink(tmp_path), parallelism=bad)
    assert "'op'" in str(ei.value) and repr(bad) in str(ei.value)


def test_keyed_parallelism_above_max_parallelism():
    flow = ep.Dataflow("kp", max_parallelism=4)
    keyed = flow.source("src", _src()).key_by(_identity)
    with pytest.raises(PipelineDefinitionError) as ei:
        keyed.reduce("count", lambda a, b: a, parallelism=5)
    msg = str(ei.value)
    assert "'count'" in msg and "5" in msg and "max_parallelism 4" in msg
    with pytest.raises(PipelineDefinitionError, match="'proc'"):
        keyed.process("proc", _Count(), parallelism=5)
    # exactly max_parallelism is fine, and non-keyed operators are not bounded by it
    keyed.reduce("ok", lambda a, b: a, parallelism=4)
    flow.source("src2", _src()).map("wide", _identity, parallelism=9)


def test_keyed_default_parallelism_above_max_parallelism():
    flow = ep.Dataflow("kp2", parallelism=8, max_parallelism=4)
    with pytest.raises(PipelineDefinitionError, match="parallelism 8 exceeds max_parallelism 4"):
        flow.source("src", _src()).key_by(_identity).reduce("count", lambda a, b: a)


def test_max_parallelism_upper_bound_checked_at_construction():
    with pytest.raises(PipelineDefinitionError, match="max_parallelism"):
        ep.Dataflow("huge", max_parallelism=1 << 16)


# --------------------------------------------------------------------------- whole-graph checks

def _dangling_flow(tmp_path):
    flow = ep.Dataflow("dangling")
    s = flow.source("src", _src())
    s.map("used", _identity).sink("out", _sink(tmp_path))
    s.map("forgotten", _identity)  # never consumed
    return flow


def test_dangling_stream_raises_from_plan(tmp_path):
    with pytest.raises(PipelineDefinitionError) as ei:
        _dangling_flow(tmp_path).plan()
    msg = str(ei.value)
    assert "'forgotten'" in msg and "not consumed" in msg
    assert "'used'" not in msg and "'src'" not in msg


def test_dangling_stream_raises_from_run_before_any_task_starts(tmp_path, no_tasks):
    ckpt = tmp_path / "ckpt"
    with pytest.raises(PipelineDefinitionError, match="'forgotten'"):
        _dangling_flow(tmp_path).run(runtime="local", checkpoint=ep.CheckpointConfig(storage=f"file://{ckpt}"))
    assert no_tasks == []
    assert not ckpt.exists()
    assert not (tmp_path / "out").exists()
    with pytest.raises(PipelineDefinitionError, match="'forgotten'"):
        _dangling_flow(tmp_path).start(runtime="local")
    assert no_tasks == []


def test_graph_without_sink(tmp_path):
    flow = ep.Dataflow("nosink")
    flow.source("src", _src()).map("m", _identity)
    with pytest.raises(PipelineDefinitionError) as ei:
        flow.plan()
    assert "'m'" in str(ei.value) and "sink" in str(ei.value)
    only_source = ep.Dataflow("onlysource")
    only_source.source("src", _src())
    with pytest.raises(PipelineDefinitionError, match="'src'"):
        only_source.plan()


def test_empty_graph(no_tasks):
    with pytest.raises(PipelineDefinitionError, match="'empty' has no operators"):
        ep.Dataflow("empty").plan()
    with pytest.raises(PipelineDefinitionError, match="no operators"):
        ep.Dataflow("empty").run(runtime="local")


def test_union_across_two_dataflows():
    f1, f2 = ep.Dataflow("one"), ep.Dataflow("two")
    a, b = f1.source("a", _src()), f2.source("b", _src())
    with pytest.raises(PipelineDefinitionError, match="same Dataflow"):
        a.union(b)
    with pytest.raises(PipelineDefinitionError, match="same Dataflow"):
        a.union(f1.source("c", _src()), b)
    with pytest.raises(PipelineDefinitionError, match="same Dataflow"):
        a.union([1, 2])


# --------------------------------------------------------------------------- config

@pytest.mark.parametrize("kwargs, key", [
    ({"interval": "abc"}, "checkpoint.interval"),
    ({"interval": "1 fortnight"}, "checkpoint.interval"),
    ({"interval": -1}, "checkpoint.interval"),
    ({"interval": "-1s"}, "checkpoint.interval"),
    ({"interval": 0}, "checkpoint.interval"),
    ({"interval": True}, "checkpoint.interval"),
    ({"timeout": -5}, "checkpoint.timeout"),
    ({"timeout": "0ms"}, "checkpoint.timeout"),
    ({"min_pause": -0.1}, "checkpoint.min_pause"),
    ({"min_pause": "soon"}, "checkpoint.min_pause"),
    ({"max_concurrent": 0}, "checkpoint.max_concurrent"),
    ({"max_concurrent": True}, "checkpoint.max_concurrent"),
    ({"max_concurrent": 1.5}, "checkpoint.max_concurrent"),
    ({"retained": 0}, "checkpoint.retained"),
    ({"tolerable_failures": -1}, "checkpoint.tolerable_failures"),
    ({"storage": 123}, "checkpoint.storage"),
])
def test_checkpoint_config_errors_name_the_key(kwargs, key):
    with pytest.raises(ConfigError) as ei:
        ep.CheckpointConfig(**kwargs)
    assert str(ei.value).startswith(key + ":"), str(ei.value)


@pytest.mark.parametrize("cls, kwargs, key", [
    (ep.RestartStrategy, {"delay": -1}, "restart.delay"),
    (ep.RestartStrategy, {"delay": "later"}, "restart.delay"),
    (ep.RestartStrategy, {"max_attempts": -1}, "restart.max_attempts"),
    (ep.RestartStrategy, {"max_attempts": True}, "restart.max_attempts"),
    (ep.ChannelConfig, {"linger": -1}, "channels.linger"),
    (ep.ChannelConfig, {"batch_size": 0}, "channels.batch_size"),
    (ep.ChannelConfig, {"credits": 0}, "channels.credits"),
])
def test_restart_and_channel_config_errors_name_the_key(cls, kwargs, key):
    with pytest.raises(ConfigError) as ei:
        cls(**kwargs)
    assert str(ei.value).startswith(key + ":"), str(ei.value)


@pytest.mark.parametrize("value, seconds", [
    (1.5, 1.5), ("200ms", 0.2), ("1s", 1.0), ("2min", 120.0), ("2m", 120.0), ("1h", 3600.0), (" 3 ", 3.0),
])
def test_durations_parse(value, seconds):
    assert ep.CheckpointConfig(interval=value).interval == pytest.approx(seconds)


def test_interval_none_disables_periodic_epochs():
    assert ep.CheckpointConfig(interval=None).interval is None


@pytest.mark.parametrize("make", [
    lambda: ep.CheckpointConfig(interval=math.nan),
    lambda: ep.CheckpointConfig(timeout=math.nan),
    lambda: ep.RestartStrategy(delay=math.nan),
], ids=["checkpoint.interval", "checkpoint.timeout", "restart.delay"])
def test_nan_durations_rejected(make):
    with pytest.raises(ConfigError):
        make()


@pytest.mark.parametrize("make", [
    lambda: ep.CheckpointConfig(timeout=None),
    lambda: ep.CheckpointConfig(min_pause=None),
    lambda: ep.RestartStrategy(delay=None),
    lambda: ep.ChannelConfig(linger=None),
], ids=["checkpoint.timeout", "checkpoint.min_pause", "restart.delay", "channels.linger"])
def test_none_rejected_for_required_durations(make):
    with pytest.raises(ConfigError):
        make()


def test_guarantee_exactly_twice_names_the_key(tmp_path, no_tasks):
    with pytest.raises(ConfigError) as ei:
        ep.Guarantee.parse("exactly_twice")
    assert str(ei.value).startswith("guarantee:") and "exactly_twice" in str(ei.value)
    flow = ep.Dataflow("g")
    flow.source("src", _src()).sink("out", _sink(tmp_path))
    with pytest.raises(ConfigError, match=r"^guarantee:.*exactly_twice"):
        flow.run(runtime="local", guarantee="exactly_twice")
    assert no_tasks == []


def test_guarantee_spellings():
    assert ep.Guarantee.parse("EXACTLY_ONCE") is ep.Guarantee.EXACTLY_ONCE
    assert ep.Guarantee.parse("at-least-once") is ep.Guarantee.AT_LEAST_ONCE
    assert ep.Guarantee.parse(ep.Guarantee.AT_LEAST_ONCE) is ep.Guarantee.AT_LEAST_ONCE


@pytest.mark.parametrize("option, value, key", [
    ("checkpoint", {"interval": 1}, "checkpoint"),
    ("restart", 3, "restart"),
    ("channels", ep.CheckpointConfig(), "channels"),
    ("runtime", "yarn", "runtime"),
])
def test_run_options_validated_before_tasks_start(option, value, key, tmp_path, no_tasks):
    flow = ep.Dataflow("opts")
    flow.source("src", _src()).sink("out", _sink(tmp_path))
    with pytest.raises(ConfigError) as ei:
        flow.run(**{"runtime": "local", option: value})
    assert str(ei.value).startswith(key + ":")
    assert no_tasks == []


# --------------------------------------------------------------------------- physical plan

def test_forward_equal_parallelism_operators_are_chained(tmp_path):
    flow = ep.Dataflow("chain", parallelism=2)
    (flow.source("src", _src(splits=2)).map("m", _identity).filter("f", bool)
     .flat_map("fm", lambda x: [x]).sink("out", _sink(tmp_path)))
    plan = flow.plan()
    assert [t.id for t in plan.tasks] == ["src[0]", "src[1]"]
    assert all(t.chain == ("src", "m", "f", "fm", "out") for t in plan.tasks)
    assert [t.subtask for t in plan.tasks] == [0, 1]
    assert all(t.inputs == () and t.outputs == () for t in plan.tasks)
    assert plan.channels == {}
    assert plan.source_tasks == ["src[0]", "src[1]"]


def test_fan_out_and_union_break_chains(tmp_path):
    flow = ep.Dataflow("fan", parallelism=1)
    s = flow.source("src", _src())
    a = s.map("a", _identity)
    b = s.map("b", _identity)  # src feeds two consumers: neither chains into it
    a.union(b).map("merged", _identity).sink("out", _sink(tmp_path))  # two inputs: a new task
    plan = flow.plan()
    chains = {t.chain for t in plan.tasks}
    assert chains == {("src",), ("a",), ("b",), ("merged", "out")}
    assert len(plan.task("merged[0]").inputs) == 2


def test_differing_parallelism_becomes_rebalance(tmp_path):
    flow = ep.Dataflow("rebal", parallelism=2)
    flow.source("src", _src(splits=2)).map("wide", _identity, parallelism=3).sink("out", _sink(tmp_path))
    plan = flow.plan()
    assert [t.chain for t in plan.tasks] == [("src",)] * 2 + [("wide", "out")] * 3
    for up in range(2):
        (gate,) = plan.task(f"src[{up}]").outputs
        assert gate.consumer == "wide"
        assert gate.partitioning.kind is PartitionKind.REBALANCE  # not FORWARD
        assert len(gate.channels) == 3
    for down in range(3):
        assert len(plan.task(f"wide[{down}]").inputs) == 2
    assert len(plan.channels) == 6


def test_key_by_is_hash_with_one_channel_per_producer_consumer_pair(tmp_path):
    flow = ep.Dataflow("hash", parallelism=2, max_parallelism=16)
    (flow.source("src", _src(splits=2)).key_by(_identity)
     .reduce("count", lambda a, b: a, parallelism=3).sink("out", _sink(tmp_path)))
    plan = flow.plan()
    pairs = collections.Counter()
    for up in range(2):
        (gate,) = plan.task(f"src[{up}]").outputs
        assert gate.partitioning.kind is PartitionKind.HASH
        assert gate.partitioning.key_fn is _identity
        assert [plan.channels[c].consumer for c in gate.channels] == [f"count[{d}]" for d in range(3)]
        for c in gate.channels:
            ch = plan.channels[c]
            assert ch.producer == f"src[{up}]"
            pairs[(ch.producer, ch.consumer)] += 1
    assert len(pairs) == 6 and set(pairs.values()) == {1}
    assert len(plan.channels) == 6
    # consumers own disjoint key-group ranges that cover every key group
    groups = [plan.task(f"count[{d}]").key_groups for d in range(3)]
    assert sorted(g for r in groups for g in r) == list(range(16))
    assert all(plan.task(f"src[{u}]").key_groups == range(0) for u in range(2))
    # each consumer input list has one channel per producer, in a deterministic order
    for d in range(3):
        assert [plan.channels[c].producer for c in plan.task(f"count[{d}]").inputs] == ["src[0]", "src[1]"]


def test_plan_is_deterministic(tmp_path):
    def build():
        flow = ep.Dataflow("det", parallelism=2)
        s = flow.source("src", _src(splits=4))
        s.key_by(_identity).reduce("r", lambda a, b: a, parallelism=3).rebalance().map(
            "m", _identity).sink("out", _sink(tmp_path))
        return flow.plan()

    p1, p2 = build(), build()
    assert [(t.id, t.chain, t.inputs, t.source_splits, t.key_groups) for t in p1.tasks] == \
        [(t.id, t.chain, t.inputs, t.source_splits, t.key_groups) for t in p2.tasks]
    assert p1.channels == p2.channels
    # splits are dealt round-robin over the source subtasks
    assert p1.task("src[0]").source_splits == (0, 2) and p1.task("src[1]").source_splits == (1, 3)


def test_broadcast_plan_and_delivery(tmp_path):
    flow = ep.Dataflow("bcast", parallelism=2)
    items = list(range(10))
    (flow.source("src", _src(items, splits=2)).broadcast()
     .map("m", _identity, parallelism=3).sink("out", _sink(tmp_path)))
    plan = flow.plan()
    for up in range(2):
        (gate,) = plan.task(f"src[{up}]").outputs
        assert gate.partitioning.kind is PartitionKind.BROADCAST and len(gate.channels) == 3

    flow.run(runtime="local", checkpoint=ep.CheckpointConfig(storage=f"file://{tmp_path / 'ckpt'}"),
             restart=ep.RestartStrategy(max_attempts=0))
    got = read_committed(str(tmp_path / "out"))
    assert len(got) == len(items) * 3
    assert collections.Counter(got) == collections.Counter({i: 3 for i in items})
    assert os.path.isdir(tmp_path / "ckpt" / "bcast")
