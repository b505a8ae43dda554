"""A randomized campaign of job histories, checked against a plain-Python model (issue 46).

The suite's scenario tests cover what their authors foresaw. A campaign draws *histories*
instead — a topology, a sink, a guarantee and a schedule of what users and failures do to
the job while it runs — runs each on the local runtime, and compares the committed output
with what a model in plain Python says it must be after that history. Like Jepsen's
randomized fault schedules and Flink's randomized checkpointing ITCases, it finds the
combinations nobody wrote down; every history is reproducible from its printed seed.

A history (:func:`draw`):

* **topology** (``tests/campaign_topologies.py``): ``count``, a keyed running count of a
  throttled generator of four splits; ``windows``, event-time tumbling windows; ``join``, an
  inner interval join; ``loop``, a Collatz loop with keyed state in its body; ``failover``,
  four forward-only pipelines, each a failover region restarted alone; ``columnar``,
  event-time tumbling windows over Arrow batches; ``regions``, Figure 1(c) — two consistent
  regions and an autonomous channel between them (no ``drain``: its cut's clicks are not
  decided by offsets);
* **sink**: ``file`` (:class:`~epochal.sinks.FileSink`, ``rollback="remove"``), ``log`` (the
  transactional log), ``postgres``, ``kafka``, ``delta``, ``iceberg`` — each read back by an
  independent reader;
* **guarantee**: exactly-once or at-least-once, and parallelism 1–3;
* **actions**, each once the sources had read a drawn fraction of the input at a completed
  checkpoint (progress observed in the checkpoint storage, not wall time), asserted to have
  landed while the job ran with input left:
  ``kill`` (SIGKILL of a task process from outside), ``kill-twice`` (a kill, then another of
  the restarted attempt's processes as soon as they exist), ``stop-restore`` (stop with a
  savepoint, restore it, maybe at another parallelism), ``cancel-resume`` (cancel, then
  ``resume=True``), ``rollback`` (take a savepoint, run on, stop, restore the *older*
  savepoint: every sink), ``switch`` (stop with a savepoint, restore under the other
  guarantee), ``driver-kill`` (the job moves to a driver in its own process — stop with a
  savepoint, that process restores it — which is SIGKILLed mid-run; then ``resume=True``
  here from its storage), ``second-launch`` (the same job started again onto its running
  storage: must be refused at start, the first run unharmed), ``drain`` (stop with a drained
  savepoint; a drained job cannot run on, so it ends the history), ``storage-outage`` (the
  checkpoint storage, a small tmpfs, filled up until checkpoints failed for it, then freed),
  ``restore-checkpoint`` (stop with a savepoint, then restore a *checkpoint* drawn at random
  among those the storage retained, older ones included, maybe at another parallelism;
  drawn only when named: :data:`ACTIONS_LATER`).

The model (:class:`_Runner` keeps it, :func:`check` compares): exactly-once histories end
with the oracle's multiset plus what the documented rollback semantics add — ``remove``
(files): nothing; ``keep`` (the others): the parent's output of the epochs
after the restored savepoint, once more, computed from the two savepoints' source offsets
(``windows``, ``loop``, where offsets do not decide what was emitted: every row a true
one, none lost). ``regions`` has its own model (``campaign_regions.check``, docs/regions.md).
A drain ends with the oracle of the input below the drained savepoint's offsets. A history
with an at-least-once run ends with no input lost (:func:`pipelines.no_count_lost`). A run
not ending within :data:`RUN_BOUND` is a wedge; a history whose storage changes after its
last job's handle returned (:data:`QUIET`) is a ``late-write``. Failures are reported, never
retried away.
"""
from __future__ import annotations

import collections
import dataclasses
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
from epochal.backends.storage import CheckpointStorage
from campaign_faults import DriverProcess, SmallDisk
from campaign_regions import per_region
from campaign_topologies import TOPOLOGIES, Target, everything, source_offsets
import campaign_topologies

cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: the first campaign's actions and sinks (the default slice's early seeds draw from these)
ACTIONS_V1 = ("kill", "kill-twice", "stop-restore", "cancel-resume", "rollback", "switch")
ACTIONS = ACTIONS_V1 + ("driver-kill", "second-launch", "drain", "storage-outage")
#: actions added since: drawn only when named (``draw(actions=...)``, the campaign's
#: ``--actions``), so that the seeds of earlier reports still draw the histories they ran
ACTIONS_LATER = ("restore-checkpoint",)
SINKS_V1 = ("file", "log", "postgres", "kafka")
SINKS = SINKS_V1 + ("delta", "iceberg")
#: seconds a run may take before the history counts as wedged
RUN_BOUND = 180.0
SPLITS = campaign_topologies.SPLITS


@dataclasses.dataclass
class History:
    seed: int
    sink: str
    guarantee: str
    parallelism: int
    actions: list  # [(action, at fraction of the output, new parallelism or None)]
    topology: str = "count"
    n_lines: int = 1200
    rate: float = 60.0  # lines/s per split: 1200 lines over 4 splits ≈ 5 s of input per run
    speed: float = 1.0  # every topology's source rate times this (a shorter run)

    def describe(self) -> str:
        acts = ", ".join(f"{a}@{at:.2f}" + (f"->p{p}" if p else "") for a, at, p in self.actions)
        fast = f" x{self.speed:g}" if self.speed != 1.0 else ""
        return f"seed={self.seed} {self.topology}/{self.sink}/{self.guarantee}/p{self.parallelism}{fast} [{acts}]"


def draw(seed: int, sinks=SINKS, actions=ACTIONS, max_actions: int = 3, topologies=("count",),
         rollback_sinks=SINKS, speed: float = 1.0) -> History:
    """The history of ``seed``: the same seed gives the same history (the topology is drawn
    apart, so a seed keeps its sink, guarantee and actions whatever ``topologies`` offers).
    A ``drain`` ends the schedule (a drained job cannot run on)."""
    topology = random.Random(seed ^ 0x5EED).choice(list(topologies))
    rng = random.Random(seed)
    sink = rng.choice(list(sinks))
    allowed = [a for a in actions if (a != "rollback" or sink in rollback_sinks)
               and (a != "drain" or TOPOLOGIES[topology].drained is not None)
               and a not in TOPOLOGIES[topology].excluded]
    chosen = []
    for _ in range(rng.randint(1, max_actions)):
        action = rng.choice(allowed)
        rescale = rng.choice([None, 1, 2, 3]) if action in ("stop-restore", "rollback", "switch",
                                                            "restore-checkpoint") else None
        chosen.append((action, round(rng.uniform(0.15, 0.7), 2), rescale))
        if action == "drain":
            break
    return History(seed, sink, rng.choice(["exactly-once", "at-least-once"]), rng.choice([1, 2, 3]), chosen,
                   topology, speed=speed)


def draw_v1(seed: int, topology: str = "count") -> History:
    """A history of the first campaign (six actions, rollback on files only)."""
    return draw(seed, sinks=SINKS_V1, actions=ACTIONS_V1, topologies=(topology,), rollback_sinks=("file",))


def flow(history: History, target, parallelism: int) -> ep.Dataflow:
    return TOPOLOGIES[history.topology].flow(history, target, parallelism)


def oracle(history: History) -> collections.Counter:
    """Plain Python: the exactly-once output of one whole run."""
    return TOPOLOGIES[history.topology].oracle(history)


# ------------------------------------------------------------------------------ running
@dataclasses.dataclass
class Report:
    history: str
    seed: int
    sink: str
    guarantee: str
    actions: list
    landed: list = dataclasses.field(default_factory=list)  # per action: did it land mid-run
    outcome: str = "ok"  # ok | lost | duplicated | wedged | error | late-write | not-landed
    detail: str = ""
    seconds: float = 0.0
    runs: int = 0
    restored_checkpoints: list = dataclasses.field(default_factory=list)  # [epoch, retained epochs] each


class _Runner:
    def __init__(self, history: History, workdir: str, services: dict):
        self.h, self.workdir = history, workdir
        self.topology = TOPOLOGIES[history.topology]
        self.target = Target(history.sink, workdir, services, self.topology.columns)
        self.guarantee, self.parallelism = history.guarantee, history.parallelism
        self.guarantees_used = {history.guarantee}
        self.disk = SmallDisk() if any(a == "storage-outage" for a, _, _ in history.actions) else None
        self.storage = self._new_storage()
        self.handle = None
        self.runs = 0
        self.truth = oracle(history)
        # the model: what the committed output must be after the history so far
        self.expected = collections.Counter(self.truth)  # exactly-once
        self.loose = False  # True: a rollback whose re-emitted rows the offsets cannot say (windows)
        #: an autonomous channel's guarantee so far: what kills and resumes made of it (docs/regions.md)
        self.crossing: set = set()
        self.restored_checkpoints: list = []  # [epoch restored, epochs retained] per restore-checkpoint

    def _new_storage(self) -> str:
        root = self.disk.path if self.disk else self.workdir
        return "file://" + os.path.join(root, f"ckpt-{uuid.uuid4().hex[:6]}")

    def options(self, **options) -> dict:
        tolerable = 1000 if self.disk else 0  # an outage declines its checkpoints; the job runs on
        return dict(guarantee=self.guarantee,
                    checkpoint=ep.CheckpointConfig(interval=0.2, storage=self.storage, retained=3,
                                                   tolerable_failures=tolerable),
                    restart=ep.RestartStrategy(max_attempts=6, delay=0.0, **self.topology.restart), **options)

    def start(self, **options):
        self.runs += 1
        self.started = time.monotonic()
        self.handle = flow(self.h, self.target, self.parallelism).start(runtime="local", **self.options(**options))

    def committed(self) -> int:
        """Progress in the target: committed rows, less what a rollback added on purpose."""
        return sum(self.target.read().values()) - (sum(self.expected.values()) - sum(self.truth.values()))

    def read_fraction(self) -> float:
        """Progress: the share of the input the sources had read at the current storage's
        latest completed checkpoint (0 before the first one); for a loop, the share of its
        distinct output rows committed (one per number: a rollback's kept rows add none)."""
        if self.topology.by_output:
            return len(set(self.target.read()) & set(self.truth)) / len(set(self.truth))
        try:
            read = source_offsets(f"{self.storage}/{self.topology.checkpoints}", self.h)
        except Exception:  # noqa: BLE001 - none yet, or retention removed it while it was read
            return 0.0
        return sum(read.values()) / sum(everything(self.h).values())

    def wait_for(self, fraction: float) -> bool:
        """Wait until the sources had read ``fraction`` of the input at a completed
        checkpoint of this run; False if the job ended first. Progress, not wall time: a slow
        machine delays the action with the job instead of letting the job finish before it."""
        deadline = time.monotonic() + RUN_BOUND
        while self.handle.running and time.monotonic() < deadline:
            if self.handle.completed_epochs and self.read_fraction() >= fraction:
                return True
            time.sleep(0.05)
        return False

    def task_pids(self) -> dict:
        return {(region, name): t.get("pid") for region, m in per_region(self.handle.metrics())
                for name, t in (m.get("tasks") or {}).items() if t.get("pid") and t.get("pid") != os.getpid()}

    def generation(self) -> tuple:  # one per region, as task_pids' and aborted's
        return tuple(m.get("generation") for _, m in per_region(self.handle.metrics()))

    def aborted(self) -> int:
        return sum((m.get("checkpoints") or {}).get("aborted", 0) for _, m in per_region(self.handle.metrics()))

    def _crossed(self, cause) -> None:
        """The model: what a kill in region ``cause``, or a ``"resume"``, does to an autonomous channel."""
        self.crossing.update([self.topology.crossing[cause]] if cause in self.topology.crossing else [])

    def landed(self) -> bool:
        """The job runs, its latest checkpoint has input left to read, and it has not
        committed all of its output yet (read from the target)."""
        return self.handle.running and self.read_fraction() < 1.0 and self._output_left()

    def _output_left(self) -> bool:
        """Not all output committed yet; not asked after a rollback the model cannot price
        (``loose``): the kept windows of the parent then count beyond the truth."""
        return self.loose or self.committed() < sum(self.truth.values())

    # ---------------------------------------------------------------- the actions
    def act(self, action: str, rng: random.Random, rescale) -> bool:
        """Do ``action`` now; True when it landed while the job ran with input left."""
        return getattr(self, "_" + action.replace("-", "_"))(rng, rescale)

    def _kill(self, rng, rescale, twice: bool = False) -> bool:
        pids = self.task_pids()
        if not pids or not self.landed():
            return False
        victim = rng.choice(sorted(pids, key=str))
        generation = self.generation()
        if not _sigkill(pids[victim]):
            return False  # it had exited (its region's input ended): nothing killed
        self._crossed(victim[0])
        if not twice:
            return True
        deadline = time.monotonic() + 60  # the restarted attempt's processes, as soon as they exist
        while time.monotonic() < deadline and self.handle.running:
            fresh = {n: p for n, p in self.task_pids().items() if p not in pids.values()}
            if fresh and self.generation() != generation:
                second = rng.choice(sorted(fresh, key=str))
                if not _sigkill(fresh[second]):
                    return False  # it had exited meanwhile (the campaign's regions seed 30035)
                self._crossed(second[0])
                return True
            time.sleep(0.005)
        return False

    def _kill_twice(self, rng, rescale) -> bool:
        return self._kill(rng, rescale, twice=True)

    def _cancel_resume(self, rng, rescale) -> bool:
        ok = self.landed()
        self.handle.cancel()
        self._wait_end(cancelled=True)
        self._crossed("resume")
        self.start(resume=True)
        return ok

    def _stop_restore(self, rng, rescale, switch: bool = False) -> bool:
        ok = self.landed()
        url = self._savepoint(stop=True)
        if url is None:  # the job finished before it could stop: nothing left to restore
            return False
        if switch:
            self.guarantee = "at-least-once" if self.guarantee == "exactly-once" else "exactly-once"
            self.guarantees_used.add(self.guarantee)
        self.parallelism = rescale or self.parallelism
        self.storage = self._new_storage()
        self.start(restore_from=url)
        return ok

    def _switch(self, rng, rescale) -> bool:
        return self._stop_restore(rng, rescale, switch=True)

    def _rollback(self, rng, rescale) -> bool:
        ok = self.landed()
        older = self._savepoint(stop=False)
        if older is None:
            return False
        # run on for a while past the savepoint: the future the branch will abandon
        seen, deadline = len(self.handle.completed_epochs), time.monotonic() + 0.15 * self.run_seconds()
        while self.handle.running and (time.monotonic() < deadline or len(self.handle.completed_epochs) < seen + 2):
            time.sleep(0.02)
        stopped = self._savepoint(stop=True) if self.handle.running else None
        if stopped is None:
            self._wait_end()
        if self.target.rollback == "keep":  # the parent's epochs after `older` stay; the branch re-emits them
            cut = self.topology.cut
            if cut is None:
                self.loose = True
            else:
                at_stop = source_offsets(stopped, self.h) if stopped else everything(self.h)
                self.expected += cut(self.h, at_stop) - cut(self.h, source_offsets(older, self.h))
        self.parallelism = rescale or self.parallelism
        self.storage = self._new_storage()
        self.start(restore_from=older)
        return ok

    def _restore_checkpoint(self, rng, rescale) -> bool:
        """Stop with a savepoint (so what the parent committed is known: every epoch up to
        it), then ``restore_from`` a *checkpoint* drawn at random among those the stopped
        job's storage retained (``chk-*``, older ones included) into fresh storage, maybe at
        another parallelism; the model rolls back to that checkpoint's cut as for a
        rollback (``remove``: nothing added; ``keep``: the parent's output between the
        checkpoint's and the stop's offsets once more). Landed: the job ran with input left
        and the checkpoint restored has input left after it."""
        ok = self.landed()
        stopped = self._savepoint(stop=True)
        if stopped is None:  # the job finished before it could stop
            return False
        storage = CheckpointStorage(self.storage, "campaign")
        retained = storage.completed_checkpoints()
        assert retained, f"the stopped job's storage {self.storage} retained no checkpoint"
        epoch = rng.choice(retained)
        url = storage.file_url(f"chk-{epoch:010d}")
        if self.target.rollback == "keep":
            if self.topology.cut is None:
                self.loose = True
            else:
                self.expected += self.topology.cut(self.h, source_offsets(stopped, self.h)) \
                    - self.topology.cut(self.h, source_offsets(url, self.h))
        left = self.topology.by_output or sum(source_offsets(url, self.h).values()) < sum(everything(self.h).values())
        self.restored_checkpoints.append([epoch, retained])
        self.parallelism = rescale or self.parallelism
        self.storage = self._new_storage()
        self.start(restore_from=url)
        return ok and left

    def _driver_kill(self, rng, rescale) -> bool:
        ok = self.landed()
        url = self._savepoint(stop=True)
        if url is None:
            return False
        self.storage = self._new_storage()
        child = DriverProcess(flow(self.h, self.target, self.parallelism), self.workdir,
                              **self.options(restore_from=url))
        try:
            # SIGKILL once the child's job completed a checkpoint (its resume has one to restore)
            ok = child.wait_epochs(1, RUN_BOUND) and ok
            ok = ok and child.running and self.read_fraction() < 1.0 and self._output_left()
        finally:
            if child.running:
                child.kill()
            else:  # ended on its own (or failed): its storage holds the end, the resume finds it
                child.proc.wait()
        self.runs += 1
        self._crossed("resume")
        self.start(resume=True)
        return ok

    def _second_launch(self, rng, rescale) -> bool:
        """The same job started twice onto its running storage: from scratch and with
        ``resume=True`` (the same script run again); each must be refused at start."""
        ok = self.landed()
        for options in ({}, {"resume": True}):
            try:
                second = flow(self.h, self.target, self.parallelism).start(runtime="local", **self.options(**options))
            except ep.ConfigError as exc:
                if "already running" not in str(exc) and options:
                    raise
                continue
            second.cancel()  # not refused: stop it and wait for its end (it writes to the storage until then)
            try:
                second.wait(RUN_BOUND)
            except ep.JobFailedError:
                pass
            try:  # the first job may have ended (a loop reads its input at once) and released its lease
                self.handle.wait(5.0)
            except TimeoutError:
                raise AssertionError(f"a second launch ({options or 'fresh'}) onto the running job's storage was "
                                     f"not refused") from None
            return False  # the first job had ended: the launch was rightly taken, the action did not land
        return ok and self.handle.running

    def _drain(self, rng, rescale) -> bool:
        ok = self.landed()
        url = self._savepoint(stop=True, drain=True)
        if url is None:
            return False
        read = source_offsets(url, self.h)
        self.expected = self.expected - self.truth + self.topology.drained(self.h, read)
        self.truth = self.topology.drained(self.h, read)
        return ok and sum(read.values()) < sum(everything(self.h).values())

    def _storage_outage(self, rng, rescale) -> bool:
        ok = self.landed()
        aborted = self.aborted()
        self.disk.fill()
        try:
            deadline = time.monotonic() + 0.2 * self.run_seconds() + 2
            while self.handle.running and time.monotonic() < deadline:
                if self.aborted() >= aborted + 3:  # three checkpoints failed for it
                    break
                time.sleep(0.05)
            hit = self.aborted() > aborted
        finally:
            self.disk.free()
        return ok and hit  # checkpoints failed for it while the job ran with input left

    def run_seconds(self) -> float:
        """How long a whole run reads its input (the sources are throttled)."""
        return self.h.n_lines / (SPLITS * self.h.rate * self.h.speed)

    def _savepoint(self, stop: bool, drain: bool = False) -> str | None:
        """A savepoint (then stop), as a user would take it: a savepoint whose epoch a task
        failure aborted (``SavepointError``, the job restarting from its latest checkpoint)
        is asked for again once the restarted attempt completed an epoch. ``None``: the job
        finished on its own first."""
        for attempt in range(5):
            url = os.path.join(self.workdir, f"sp-{uuid.uuid4().hex[:6]}")
            seen = len(self.handle.completed_epochs)
            try:
                if stop:
                    return self.handle.stop_with_savepoint(url, timeout=RUN_BOUND, drain=drain)
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

    def end_job(self) -> None:
        """Cancel a job still running and wait for its end (its driver writes to the storage
        until then). Idempotent."""
        if self.handle is not None and self.handle.running:
            self.handle.cancel()
            try:
                self.handle.wait(RUN_BOUND)
            except Exception:  # noqa: BLE001 - cancelled, or it failed: the report already says
                pass

    def listing(self) -> dict:
        """Every file and directory the history's jobs wrote here (the work directory and the
        small disk), with its size and modification time: compared after the job's end."""
        out = {}
        for root in [self.workdir] + ([self.disk.path] if self.disk else []):
            for d, dirs, files in os.walk(root):
                for name in files + dirs:
                    p = os.path.join(d, name)
                    try:
                        st = os.lstat(p)
                    except FileNotFoundError:  # removed while listed: a change the next listing shows
                        continue
                    out[p] = (st.st_size, st.st_mtime_ns) if name in files else "dir"
        return out

    def close(self) -> None:
        """:meth:`end_job`, then unmount the small disk."""
        self.end_job()
        if self.disk is not None:
            self.disk.close()


def _sigkill(pid: int) -> bool:
    """SIGKILL ``pid``; False when it had exited already (a task whose input ended)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


#: seconds the storage is watched after the last job's handle returned: nothing may change there
QUIET = 1.0


def late_writes(before: dict, after: dict) -> str:
    """What changed between two :meth:`_Runner.listing` s ("" when nothing did)."""
    added, removed = sorted(set(after) - set(before)), sorted(set(before) - set(after))
    changed = sorted(p for p in set(before) & set(after) if before[p] != after[p])
    if not (added or removed or changed):
        return ""
    return (f"the storage changed after the job's handle returned: {len(added)} added (e.g. {added[:3]}), "
            f"{len(removed)} removed (e.g. {removed[:3]}), {len(changed)} rewritten (e.g. {changed[:3]})")


def run(history: History, services: dict | None = None, workdir: str | None = None,
        quiet: float = QUIET) -> Report:
    """Run ``history`` and check it against the model; never raises for a finding. Once
    the last job's handle returned, the history's storage (work directory, small disk) is
    listed and listed again ``quiet`` seconds later (after the check): any change is the
    outcome ``late-write`` — something of a job still wrote after its end."""
    services = services or {}
    report = Report(history.describe(), history.seed, history.sink, history.guarantee,
                    [a for a, _, _ in history.actions])
    t0 = time.monotonic()
    rng = random.Random(history.seed * 7 + 1)
    workdir = workdir or tempfile.mkdtemp(prefix="campaign-")
    runner, ended = None, None  # ended: (listing, time) when the last job's handle returned
    try:
        runner = _Runner(history, workdir, services)
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
            return report
        ended = (runner.listing(), time.monotonic())
        report.runs, report.restored_checkpoints = runner.runs, runner.restored_checkpoints
        got = runner.target.read()
        own, used = runner.topology.check, runner.guarantees_used
        report.outcome, report.detail = (own(got, runner.expected, runner.truth, used, runner.loose, runner.crossing)
                                         if own else check(got, runner.expected, runner.truth, used, history.topology,
                                                           runner.loose, oracle(history)))
        if report.outcome == "ok" and not all(report.landed):
            report.outcome = "not-landed"
            report.detail = f"actions that did not land mid-run: {[a for a, ok in zip(report.actions, report.landed) if not ok]}"
    except TimeoutError as exc:
        report.outcome, report.detail = "wedged", f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - a finding, reported with its history
        report.outcome, report.detail = "error", f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        if runner is not None:
            runner.end_job()
            if report.outcome != "wedged":  # a wedged job may still write: that is its finding
                ended = ended or (runner.listing(), time.monotonic())
                time.sleep(max(0.0, ended[1] + quiet - time.monotonic()))  # the window watched, not a protocol step
                late = late_writes(ended[0], runner.listing())
                if late:
                    report.detail = f"{late}; {report.outcome}: {report.detail}" if report.detail else late
                    report.outcome = "late-write"
            runner.close()
        report.seconds = round(time.monotonic() - t0, 1)
    return report


def check(got: collections.Counter, expected: collections.Counter, truth: collections.Counter, guarantees: set,
          topology: str = "count", loose: bool = False, whole: collections.Counter | None = None) -> tuple[str, str]:
    """The model: exactly-once throughout → ``got == expected`` (the truth plus what the
    documented rollbacks re-emit), or, when a rollback's re-emitted rows are not decided by
    offsets (``loose``), every true row there and no row that is not a true one (of
    ``truth`` or of the ``whole`` input's oracle); any
    at-least-once run → no input lost: every key's final running count reaches the truth
    (``count``), every window fired with at least its true count (``windows``), every number
    through the loop with its true steps and at least its true passes (``loop``), every row
    at least as often as in the truth (``join``)."""
    if guarantees == {"exactly-once"}:
        if loose:
            # a true row: of the truth, or (a drain after a rollback) of the whole input's oracle,
            # which the parent's epochs after the savepoint fired
            lost, invented = truth - got, set(got) - set(truth) - set(whole or ())
            if not lost and not invented:
                return "ok", ""
            return ("lost" if lost else "duplicated"), f"{sum(lost.values())} lost (e.g. {list(lost)[:3]}), " \
                                                       f"{len(invented)} rows no window has (e.g. {list(invented)[:3]})"
        if got == expected:
            return "ok", ""
        lost, extra = expected - got, got - expected
        outcome = "lost" if lost else "duplicated"
        return outcome, f"{sum(lost.values())} lost (e.g. {list(lost)[:3]}), {sum(extra.values())} extra " \
                        f"(e.g. {list(extra)[:3]})"
    if topology in ("windows", "columnar"):
        best: dict = {}
        for k, s, e, c, _ in got:
            best[(k, s, e)] = max(best.get((k, s, e), 0), c)
        short = [(k, s, e, c) for k, s, e, c, _ in truth if best.get((k, s, e), 0) < c]
        return ("lost", f"{len(short)} windows missing or short, e.g. {short[:3]}") if short else ("ok", "")
    if topology == "count":
        problem = pipelines.no_count_lost(collections.Counter({(w, n): c for (w, n), c in got.items()}), truth)
        return ("lost", problem) if problem else ("ok", "")
    if topology == "loop":
        return _loop_at_least_once(got, truth)
    lost = truth - got  # a join: every pair at least once
    return ("lost", f"{sum(lost.values())} rows missing, e.g. {list(lost)[:3]}") if lost else ("ok", "")


def _loop_at_least_once(got: collections.Counter, truth: collections.Counter) -> tuple[str, str]:
    """What an at-least-once loop promises: every number ends its Collatz run, with its true
    step count, and no row has steps that no run has. ``passes`` is keyed state: an
    at-least-once snapshot may hold passes of records after its barrier, and what the source
    replays after a restore goes round again, so a number's passes may overshoot — as a
    running count's do (:func:`pipelines.no_count_lost`) — but never fall short: a pass
    short is a visit's state lost. (Comparing whole rows called an overshoot a loss: seed
    50083's "56 rows missing" were the longest runs, 27, 54, 73, …)"""
    true_steps = {n: steps for n, _, steps, _ in truth}
    best: dict = {}
    wrong = []
    for row in got:
        n, current, steps, passes = row
        if current != 1:
            continue
        if true_steps.get(n) != steps:
            wrong.append(row)
        best[n] = max(best.get(n, -1), passes)
    short = sorted((n, best.get(n), p) for n, _, _, p in truth if best.get(n, -1) < p)
    if short or wrong:
        return "lost", (f"{len(short)} numbers missing or short of passes (n, best, true), e.g. {short[:3]}; "
                        f"{len(wrong)} rows with steps no run has, e.g. {wrong[:3]}")
    over = [n for n, _, _, p in truth if best[n] > p]
    only_over = sum(1 for row in truth if row[0] in over and row not in got)  # whole rows would call these lost
    return "ok", (f"{len(over)} numbers took more passes than their steps (at-least-once), {only_over} of them "
                  "with no row of the true passes") if over else ""
