"""LocalLauncher.cancel kills every task process its unit started, including one still
starting when the cancel ran (its pid not known yet), found by the campaign's review (issue 46).

The zygote is paused (SIGSTOP) so the launch's ``run`` message waits in its pipe: the cancel
runs while the task has no pid, and the zygote forks it only after the cancel began. The
"task" is an attempt whose unpickling sleeps (a task process alive and not yet connected);
the test reads its pid from the zygote's own ``("pid", index, pid)`` message."""
from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time

from epochal.runtime.launch import zygote as zygote_protocol
from epochal.runtime.launch.launcher import LocalLauncher

DEADLINE = 60.0


class _Sleeper:
    """Unpickled in the task process: sleeps ``seconds`` (a task that is slow to start)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __reduce__(self):
        return exec, (f"import time\ntime.sleep({self.seconds})",)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait(condition, what: str):
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"not within {DEADLINE:.0f} s: {what}")


def _in_wait(thread: threading.Thread) -> bool:
    """``thread`` is blocked in a ``wait`` inside ``cancel``: the cancel has looked for the
    unit's processes and now waits for the unit's end."""
    frame = sys._current_frames().get(thread.ident)
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return bool(names) and names[0] == "wait" and "cancel" in names


def test_cancel_kills_a_task_that_registers_its_pid_after_the_cancel_began(monkeypatch):
    read, started = zygote_protocol.read_message, []

    def spy(fd):  # the launcher's reader: every message the zygote sends passes here
        msg = read(fd)
        if msg and msg[0] == "pid":
            started.append(msg[2])
        return msg

    monkeypatch.setattr(zygote_protocol, "read_message", spy)
    launcher = LocalLauncher()
    zygote = launcher._proc.pid
    pid, exits = None, []
    try:
        os.kill(zygote, signal.SIGSTOP)  # the run message waits in the pipe: no pid until SIGCONT
        unit = launcher.launch(pickle.dumps(_Sleeper(300)), [0], lambda ok, cause, **_: exits.append(ok))
        canceller = threading.Thread(target=launcher.cancel, args=(unit,), daemon=True)
        canceller.start()
        # the cancel has taken its snapshot of the unit's pids (none) and waits for the unit's end
        _wait(lambda: _in_wait(canceller), "the cancel to wait for the unit's end")
        assert not started  # the task had no pid when the cancel began
        os.kill(zygote, signal.SIGCONT)
        pid = _wait(lambda: started and started[0], "the zygote to fork the task")
        canceller.join(DEADLINE)
        assert not canceller.is_alive(), "cancel did not return"
        assert not _alive(pid), f"task process {pid} started during the cancel and outlived it"
        assert exits == [False]  # its end was reported once, as a killed task's
    finally:
        os.kill(zygote, signal.SIGCONT)
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)
        launcher.close()
