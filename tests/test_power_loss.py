"""Durable publication (issue "No silent data loss", item 4): after a power loss, no
committed record is lost or duplicated.

A power loss cannot be had in a test, so it is simulated from a journal
(``tests/powerloss/sitecustomize.py``, loaded by every process of the job): every rename,
hard link and new file under the job's directories, and every directory fsync, in order.
The job — a keyed word count into a FileSink, checkpoints on local files — runs in its own
process group, is SIGKILLed after it committed output, and then the test undoes what a
power loss may undo: a name change is kept only if its directory was fsynced after it.
The adversary picks the worst of the undoable outcomes for exactly-once: it loses every
non-durable change of the checkpoint storage but keeps every one of the sink's (a commit
survives, the checkpoint it belongs to does not). The job is then resumed.

With directory fsyncs (epochal's code) the resumed output equals the plain-Python oracle.
The control records no directory fsync — a system that never fsyncs directories — and the
same adversary then yields duplicated records: the test proves the fsyncs matter.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time


from epochal.sinks import read_committed

from pipelines import canon, running_counts

HERE = os.path.dirname(os.path.abspath(__file__))
LINES = 3200

JOB = textwrap.dedent(f'''
    import sys
    sys.path.insert(0, {HERE!r})
    import cloudpickle, pipelines
    cloudpickle.register_pickle_by_value(pipelines)
    import epochal as ep
    from epochal.sinks import FileSink
    out, ckpt, resume = sys.argv[1], sys.argv[2], sys.argv[3] == "resume"
    flow = ep.Dataflow("powerloss", parallelism=2)
    (flow.source("lines", ep.sources.GeneratorSource(pipelines.lines_from, num_splits=4, limit={LINES} // 4,
                                                     records_per_second=200.0))
        .flat_map("split", str.split).map("pair", lambda w: (w, 1)).key_by(lambda p: p[0])
        .reduce("count", lambda a, b: (a[0], a[1] + b[1]))
        # take_over: the control's resumed run must be able to write where the lost checkpoints
        # left committed output (epochal would otherwise refuse the directory, see
        # test_output_ownership) — so the duplicates it produces become visible
        .sink("out", FileSink(out, take_over=True)))
    flow.run(runtime="local", resume=resume, checkpoint=ep.CheckpointConfig(interval=0.25, storage="file://" + ckpt))
''')


def _committed_parts(out):
    return [n for n in os.listdir(out) if n.startswith("part-")] if os.path.isdir(out) else []


def _metadata(ckpt):
    root = os.path.join(ckpt, "powerloss")
    return [d for d in (os.listdir(root) if os.path.isdir(root) else [])
            if os.path.exists(os.path.join(root, d, "_metadata"))]


def _undo(journal, ckpt):
    """Undo what the adversary chooses (see the module docstring); returns the counts."""
    events = [json.loads(line) for line in open(journal)] if os.path.exists(journal) else []
    synced_after = {}  # directory -> index of its last fsync
    for i, e in enumerate(events):
        if e[0] == "fsyncdir":
            synced_after[e[1]] = i
    ckpt_root = os.path.realpath(ckpt) + os.sep
    undone = kept = 0
    for i in reversed(range(len(events))):
        e = events[i]
        if e[0] == "fsyncdir":
            continue
        name = e[2] if e[0] in ("rename", "link") else e[1]
        durable = synced_after.get(os.path.dirname(name), -1) > i
        if durable:
            continue
        if not name.startswith(ckpt_root):
            kept += 1  # the adversary keeps the sink's changes
            continue
        undone += 1
        if e[0] == "rename":
            src, dst, backup = e[1], e[2], e[3]
            if os.path.exists(dst):
                os.makedirs(os.path.dirname(src), exist_ok=True)
                os.rename(dst, src)
            if backup:
                os.link(backup, dst)
        elif os.path.exists(name):  # "link", "create": the new name is gone
            os.unlink(name)
    return undone, kept


def _run_and_lose_power(tmp_path, ignore_dirsync: bool):
    out, ckpt, journal = tmp_path / "out", tmp_path / "ckpt", tmp_path / "journal"
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = dict(os.environ, EPOCHAL_POWERLOSS_JOURNAL=str(journal), EPOCHAL_POWERLOSS_ROOT=str(tmp_path),
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "powerloss"), os.getcwd(),
                                           os.environ.get("PYTHONPATH", "")]))
    if ignore_dirsync:
        env["EPOCHAL_POWERLOSS_IGNORE_DIRSYNC"] = "1"
    proc = subprocess.Popen([sys.executable, str(script), str(out), str(ckpt), "fresh"], env=env,
                            start_new_session=True, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (len(_metadata(ckpt)) >= 2 and len(_committed_parts(out)) >= 4):
        assert proc.poll() is None, f"the job ended before the power loss: {proc.stderr.read().decode()[-2000:]}"
        assert time.monotonic() < deadline, "no committed output within 60 s"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver, its zygote and every task: power is gone
    proc.wait(10)
    time.sleep(0.2)
    undone, kept = _undo(str(journal), str(ckpt))
    resume = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(script), str(out), str(ckpt), "resume"], env=resume,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return canon(read_committed(str(out))), undone, kept


def test_after_a_power_loss_committed_output_is_exactly_once(tmp_path):
    got, undone, kept = _run_and_lose_power(tmp_path, ignore_dirsync=False)
    want = canon(running_counts(LINES))
    assert got == want, f"{sum((got - want).values())} extra, {sum((want - got).values())} missing"


def test_control_without_directory_fsyncs_duplicates_committed_records(tmp_path):
    got, undone, kept = _run_and_lose_power(tmp_path, ignore_dirsync=True)
    assert undone > 0 and kept > 0, "the simulated power loss changed nothing"
    want = canon(running_counts(LINES))
    assert got - want, "without directory fsyncs the adversary's power loss should duplicate records"
