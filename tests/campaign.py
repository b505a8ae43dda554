"""A randomized campaign of job histories, checked against a plain-Python model (issue 46).

The suite's scenario tests cover what their authors foresaw. A campaign draws *histories*
instead — a topology, a sink, a guarantee and a schedule of what users and failures do to
the job while it runs — runs each on the local runtime, and compares the committed output
with what a model in plain Python says it must be after that history. Like Jepsen's
randomized fault schedules and Flink's randomized checkpointing ITCases, it finds the
combinations nobody wrote down; every history is reproducible from its printed seed.

A history (:func:`draw`):

* **topology** ``count``: a keyed running count (``(word, n)`` for n = 1..count(word)) of a
  throttled generator of four splits — its output is one deterministic multiset whatever
  the arrival order, so a run can be compared record for record;
* **sink**: ``file`` (:class:`~epochal.sinks.FileSink`, ``rollback="remove"``), ``log`` (the
  transactional log), ``postgres``, ``kafka`` — each read back by an independent reader;
* **guarantee**: exactly-once or at-least-once, and parallelism 1–3;
* **actions**, each at a random point while the job runs (asserted: the job was running and
  its input not finished when the action landed):
  ``kill`` (SIGKILL of a task process from outside), ``kill-twice`` (a kill, then another
  one of the restarted attempt's processes as soon as they exist: a fault during recovery),
  ``stop-restore`` (stop with a savepoint, then a new run ``restore_from`` it, maybe at
  another parallelism: a rescale), ``cancel-resume`` (cancel, then ``resume=True`` from the
  storage: a driver that went away), ``rollback`` (take a savepoint, run on, stop, then
  restore from the *older* savepoint: a branch that abandons a future — file sink only,
  whose ``rollback="remove"`` makes the directory one history), ``switch`` (stop with a
  savepoint and restore it under the other guarantee).

The model (:func:`expected`): exactly-once histories end with the oracle's multiset exactly;
a history with any at-least-once run ends with every key at a final count ≥ the truth (no
input lost; :func:`pipelines.no_count_lost`). A run that does not end within its bound is a
wedge. Failures are reported, never retried away.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import random
import signal
import sys
import tempfile
import time
import uuid

import cloudpickle

import epochal as ep
import pipelines
import test_event_time
from test_event_time import SumCount, event  # shipped by value: never the module object itself
from epochal.sinks import FileSink, LogSink, read_committed

# tasks unpickle the job's functions by value: this module and the pipelines it draws from
cloudpickle.register_pickle_by_value(pipelines)
cloudpickle.register_pickle_by_value(test_event_time)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ACTIONS = ("kill", "kill-twice", "stop-restore", "cancel-resume", "rollback", "switch")
SINKS = ("file", "log", "postgres", "kafka")
#: seconds a run may take before the history counts as wedged
RUN_BOUND = 180.0
SPLITS = 4


@dataclasses.dataclass
class History:
    seed: int
    sink: str
    guarantee: str
    parallelism: int
    actions: list  # [(action, at fraction of the input, new parallelism or None)]
    topology: str = "count"
    n_lines: int = 1200
    rate: float = 60.0  # lines/s per split: 1200 lines over 4 splits ≈ 5 s of input per run

    def describe(self) -> str:
        acts = ", ".join(f"{a}@{at:.2f}" + (f"->p{p}" if p else "") for a, at, p in self.actions)
        return f"seed={self.seed} {self.topology}/{self.sink}/{self.guarantee}/p{self.parallelism} [{acts}]"


def draw(seed: int, sinks=SINKS, actions=ACTIONS, max_actions: int = 3, topologies=("count",)) -> History:
    """The history of ``seed``: the same seed gives the same history (the topology is drawn
    apart, so a seed keeps its sink, guarantee and actions whatever ``topologies`` offers)."""
    topology = random.Random(seed ^ 0x5EED).choice(list(topologies))
    rng = random.Random(seed)
    sink = rng.choice(list(sinks))
    allowed = [a for a in actions if a != "rollback" or sink == "file"]
    chosen = []
    for _ in range(rng.randint(1, max_actions)):
        action = rng.choice(allowed)
        rescale = rng.choice([None, 1, 2, 3]) if action in ("stop-restore", "rollback", "switch") else None
        chosen.append((action, round(rng.uniform(0.15, 0.7), 2), rescale))
    return History(seed, sink, rng.choice(["exactly-once", "at-least-once"]), rng.choice([1, 2, 3]), chosen,
                   topology)


# ------------------------------------------------------------------------------ the job
class Count(ep.KeyedProcessFunction):
    """A running count per word: ``(word, n)``."""

    def open(self, ctx):
        self.n = ctx.value_state("n", default=0)

    def process(self, word, value):
        self.n.update(self.n.value() + 1)
        yield (word, self.n.value())


def flow(history: History, target, parallelism: int) -> ep.Dataflow:
    return TOPOLOGIES[history.topology][0](history, target, parallelism)


def oracle(history: History) -> collections.Counter:
    """Plain Python: the exactly-once output of one whole run."""
    return TOPOLOGIES[history.topology][1](history)


def _count_flow(history: History, target, parallelism: int) -> ep.Dataflow:
    f = ep.Dataflow("campaign", parallelism=parallelism)
    source = ep.sources.GeneratorSource(pipelines.lines_from, num_splits=SPLITS, limit=history.n_lines // SPLITS,
                                        records_per_second=history.rate)
    (f.source("lines", source).flat_map("split", str.split).key_by(lambda w: w)
      .process("count", Count()).sink("out", target.sink()))
    return f


def _count_oracle(history: History) -> collections.Counter:
    return collections.Counter(tuple(r) for r in pipelines.running_counts(history.n_lines, SPLITS))


#: events per split of the ``windows`` topology, and its rate (events/s per split): ≈ 5 s a run
WINDOW_EVENTS, WINDOW_RATE, WINDOW_SIZE = 1500, 300.0, 1.0


def _window_events(split: int, offset: int):
    return (event(split, i) for i in range(offset, WINDOW_EVENTS))


def _event_time(e) -> float:
    return e[1]


def _as_row(r) -> tuple:
    return (r.key, r.start, r.end, r.value[0], r.value[1])


def _windows_flow(history: History, target, parallelism: int) -> ep.Dataflow:
    """Event-time tumbling windows of out-of-order events (bounded disorder, so none late):
    ``(key, start, end, count, sum)`` per key and window."""
    from epochal.windows import Tumbling

    f = ep.Dataflow("campaign", parallelism=parallelism)
    splits, bound = test_event_time.SPLITS, test_event_time.BOUND
    source = ep.sources.GeneratorSource(_window_events, num_splits=splits, limit=WINDOW_EVENTS,
                                        records_per_second=WINDOW_RATE)
    (f.source("events", source, parallelism=splits)
      .with_watermarks("ts", timestamp=_event_time, max_out_of_orderness=bound)
      .key_by(lambda e: e[0]).window(Tumbling(WINDOW_SIZE)).aggregate("win", SumCount())
      .map("row", _as_row).sink("out", target.sink()))
    return f


def _windows_oracle(history: History) -> collections.Counter:
    events = [test_event_time.event(s, i) for s in range(test_event_time.SPLITS) for i in range(WINDOW_EVENTS)]
    return collections.Counter((k, s, e, c, total) for k, s, e, (c, total)
                               in test_event_time.pane_oracle(WINDOW_SIZE, WINDOW_SIZE, events))


#: topology → (its dataflow, its plain-Python oracle, its PostgreSQL columns)
TOPOLOGIES = {
    "count": (_count_flow, _count_oracle, "word text NOT NULL, n bigint NOT NULL"),
    "windows": (_windows_flow, _windows_oracle,
                "k text NOT NULL, s double precision, e double precision, c bigint, total bigint"),
}


# ----------------------------------------------------------------------------- targets
class Target:
    """One sink and its independent reader: ``read()`` → multiset of ``(word, n)``."""

    def __init__(self, kind: str, workdir: str, services: dict, columns: str):
        self.kind, self.services = kind, services
        if kind == "file":
            self.path = os.path.join(workdir, "out")
        elif kind == "log":
            self.root = os.path.join(workdir, "log")
        elif kind == "postgres":
            self.pg = services["postgres"]
            self.table = self.pg.new_table(columns)
        elif kind == "kafka":
            self.broker = services["kafka"]
            self.topic = self.broker.create_topic(None, 2)
        else:
            raise ValueError(kind)

    def sink(self):
        if self.kind == "file":
            return FileSink(self.path, rollback="remove")
        if self.kind == "log":
            return LogSink(self.root, "counts", partitions=2)
        if self.kind == "postgres":
            from epochal.sinks import PostgresSink

            return PostgresSink(self.services["postgres"].dsn, self.table)
        from epochal.sinks import KafkaSink

        return KafkaSink(self.broker.servers, self.topic, key=lambda r: r[0], serializer=_json)

    def read(self) -> collections.Counter:
        if self.kind == "file":
            return collections.Counter(tuple(r) for r in read_committed(self.path))
        if self.kind == "log":
            from epochal.sources.log import read_committed_log

            return collections.Counter(tuple(r) for rs in read_committed_log(self.root, "counts").values() for r in rs)
        if self.kind == "postgres":
            return collections.Counter(tuple(r) for r in self.pg.execute(f"SELECT * FROM {self.table}"))
        return collections.Counter(tuple(json.loads(v)) for v in self.broker.values(self.topic))


def _json(record) -> bytes:
    return json.dumps(record).encode()


# ------------------------------------------------------------------------------ running
@dataclasses.dataclass
class Report:
    history: str
    seed: int
    sink: str
    guarantee: str
    actions: list
    landed: list = dataclasses.field(default_factory=list)  # per action: did it land mid-run
    outcome: str = "ok"  # ok | lost | duplicated | wedged | error | not-landed
    detail: str = ""
    seconds: float = 0.0
    runs: int = 0


class _Runner:
    def __init__(self, history: History, workdir: str, services: dict):
        self.h, self.workdir = history, workdir
        self.target = Target(history.sink, workdir, services, TOPOLOGIES[history.topology][2])
        self.guarantee, self.parallelism = history.guarantee, history.parallelism
        self.guarantees_used = {history.guarantee}
        self.storage = self._new_storage()
        self.handle = None
        self.runs = 0
        self.truth = oracle(history)

    def _new_storage(self) -> str:
        return "file://" + os.path.join(self.workdir, f"ckpt-{uuid.uuid4().hex[:6]}")

    def start(self, **options):
        self.runs += 1
        self.started = time.monotonic()
        self.handle = flow(self.h, self.target, self.parallelism).start(
            runtime="local", guarantee=self.guarantee,
            checkpoint=ep.CheckpointConfig(interval=0.2, storage=self.storage, retained=3),
            restart=ep.RestartStrategy(max_attempts=6, delay=0.0), **options)

    def run_seconds(self) -> float:
        """How long a whole run reads its input (the sources are throttled)."""
        return self.h.n_lines / (SPLITS * self.h.rate)

    def wait_for(self, fraction: float) -> bool:
        """Wait until ``fraction`` of a whole run's input time passed in this run and it has
        completed an epoch; False if the job ended first."""
        due = self.started + fraction * self.run_seconds()
        deadline = time.monotonic() + RUN_BOUND
        while self.handle.running and time.monotonic() < deadline:
            if time.monotonic() >= due and self.handle.completed_epochs:
                return True
            time.sleep(0.02)
        return False

    def task_pids(self) -> dict:
        tasks = (self.handle.metrics().get("tasks") or {})
        return {name: t.get("pid") for name, t in tasks.items() if t.get("pid") and t.get("pid") != os.getpid()}

    def landed(self) -> bool:
        """The job runs and has not committed all of its output yet (read from the target)."""
        if not self.handle.running:
            return False
        return sum(self.target.read().values()) < sum(self.truth.values())

    # ---------------------------------------------------------------- the actions
    def act(self, action: str, rng: random.Random, rescale) -> bool:
        """Do ``action`` now; True when it landed while the job ran with input left."""
        if action in ("kill", "kill-twice"):
            pids = self.task_pids()
            if not pids or not self.landed():
                return False
            victim = rng.choice(sorted(pids))
            generation = self.handle.metrics().get("generation")
            os.kill(pids[victim], signal.SIGKILL)
            if action == "kill-twice":  # the restarted attempt's processes, as soon as they exist
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and self.handle.running:
                    m = self.handle.metrics()
                    fresh = {n: t.get("pid") for n, t in (m.get("tasks") or {}).items()
                             if t.get("pid") and t.get("pid") not in pids.values()}
                    if fresh and m.get("generation") != generation:
                        os.kill(fresh[rng.choice(sorted(fresh))], signal.SIGKILL)
                        return True
                    time.sleep(0.005)
                return False
            return True
        if action == "cancel-resume":
            ok = self.landed()
            self.handle.cancel()
            self._wait_end(cancelled=True)
            self.start(resume=True)
            return ok
        if action in ("stop-restore", "switch"):
            ok = self.landed()
            url = self._savepoint(stop=True)
            if url is None:  # the job finished before it could stop: nothing left to restore
                return False
            if action == "switch":
                self.guarantee = "at-least-once" if self.guarantee == "exactly-once" else "exactly-once"
                self.guarantees_used.add(self.guarantee)
            self.parallelism = rescale or self.parallelism
            self.storage = self._new_storage()
            self.start(restore_from=url)
            return ok
        if action == "rollback":
            ok = self.landed()
            older = self._savepoint(stop=False)
            if older is None:
                return False
            # run on for a while past the savepoint: the future the branch will abandon
            seen, deadline = len(self.handle.completed_epochs), time.monotonic() + 0.15 * self.run_seconds()
            while self.handle.running and (time.monotonic() < deadline or len(self.handle.completed_epochs) < seen + 2):
                time.sleep(0.02)
            if self.handle.running:
                self._savepoint(stop=True)
            else:
                self._wait_end()
            self.parallelism = rescale or self.parallelism
            self.storage = self._new_storage()
            self.start(restore_from=older)
            return ok
        raise ValueError(action)

    def _savepoint(self, stop: bool) -> str | None:
        """A savepoint (then stop), as a user would take it: a savepoint whose epoch a task
        failure aborted (``SavepointError``, the job restarting from its latest checkpoint)
        is asked for again once the restarted attempt completed an epoch. ``None``: the job
        finished on its own first."""
        for attempt in range(5):
            url = os.path.join(self.workdir, f"sp-{uuid.uuid4().hex[:6]}")
            seen = len(self.handle.completed_epochs)
            try:
                if stop:
                    return self.handle.stop_with_savepoint(url, timeout=RUN_BOUND)
                return self.handle.savepoint(url, timeout=RUN_BOUND)
            except ep.SavepointError:
                if not self.handle.running:
                    self._wait_end()  # it finished on its own meanwhile (a failure raises here)
                    return None
                if attempt == 4:
                    raise
                deadline = time.monotonic() + RUN_BOUND
                while self.handle.running and len(self.handle.completed_epochs) <= seen \
                        and time.monotonic() < deadline:
                    time.sleep(0.02)
        raise AssertionError("unreachable")

    def _wait_end(self, cancelled: bool = False):
        try:
            return self.handle.wait(RUN_BOUND)
        except ep.JobFailedError as exc:
            if cancelled and "cancelled" in str(exc):
                return None
            raise


def run(history: History, services: dict | None = None, workdir: str | None = None) -> Report:
    """Run ``history`` and check it against the model; never raises for a finding."""
    services = services or {}
    report = Report(history.describe(), history.seed, history.sink, history.guarantee,
                    [a for a, _, _ in history.actions])
    t0 = time.monotonic()
    rng = random.Random(history.seed * 7 + 1)
    workdir = workdir or tempfile.mkdtemp(prefix="campaign-")
    runner = _Runner(history, workdir, services)
    try:
        runner.start()
        for action, at, rescale in history.actions:
            if not runner.wait_for(at):
                report.landed.append(False)
                continue
            report.landed.append(runner.act(action, rng, rescale))
        try:
            runner._wait_end()
        except TimeoutError as exc:
            report.outcome, report.detail = "wedged", str(exc)
            runner.handle.cancel()
            return report
        report.runs = runner.runs
        got, truth = runner.target.read(), oracle(history)
        report.outcome, report.detail = check(got, truth, runner.guarantees_used, history.topology)
        if report.outcome == "ok" and not all(report.landed):
            report.outcome = "not-landed"
            report.detail = f"actions that did not land mid-run: {[a for a, ok in zip(report.actions, report.landed) if not ok]}"
    except TimeoutError as exc:
        report.outcome, report.detail = "wedged", f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - a finding, reported with its history
        report.outcome, report.detail = "error", f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        report.seconds = round(time.monotonic() - t0, 1)
        if runner.handle is not None and runner.handle.running:
            runner.handle.cancel()
    return report


def check(got: collections.Counter, truth: collections.Counter, guarantees: set,
          topology: str = "count") -> tuple[str, str]:
    """The model: exactly-once throughout → ``got == truth``; any at-least-once run → no
    input lost: every key's final running count reaches the truth (``count``), every window
    fired with at least its true count (``windows``: a replay may fire it again, counting
    records twice)."""
    if guarantees == {"exactly-once"}:
        if got == truth:
            return "ok", ""
        lost, extra = truth - got, got - truth
        outcome = "lost" if lost else "duplicated"
        return outcome, f"{sum(lost.values())} lost (e.g. {list(lost)[:3]}), {sum(extra.values())} extra " \
                        f"(e.g. {list(extra)[:3]})"
    if topology == "windows":
        best: dict = {}
        for k, s, e, c, _ in got:
            best[(k, s, e)] = max(best.get((k, s, e), 0), c)
        short = [(k, s, e, c) for k, s, e, c, _ in truth if best.get((k, s, e), 0) < c]
        return ("lost", f"{len(short)} windows missing or short, e.g. {short[:3]}") if short else ("ok", "")
    problem = pipelines.no_count_lost(collections.Counter({(w, n): c for (w, n), c in got.items()}), truth)
    return ("lost", problem) if problem else ("ok", "")
