"""``start_job(..., launcher=...)``: the seam through which ``benchmarks/scale`` runs the real
driver with simulated tasks (issue 50). The driver must use the launcher it is given — with
the secure defaults of a cluster when the launcher says it is one — and refuse it where it
cannot apply, naming the option."""
from __future__ import annotations

import pytest

import epochal as ep
from epochal.config import RestartStrategy
from epochal.errors import ConfigError
from epochal.runtime.launch.launcher import Launcher
from epochal.sinks import FileSink
from epochal.sources.collection import CollectionSource


class FailingLauncher(Launcher):
    """Every launch fails at once, naming itself (no task ever runs)."""

    is_cluster = True

    def __init__(self):
        self.launches: list[list[int]] = []

    def launch(self, attempt: bytes, tasks: list[int], on_exit) -> object:
        self.launches.append(list(tasks))
        on_exit(False, "the given launcher refused to start anything", True)
        return None

    def cancel(self, unit: object = None) -> None:
        pass


def _flow(tmp_path, p=2):
    flow = ep.Dataflow("seam")
    flow.source("src", CollectionSource([1, 2, 3], num_splits=p), parallelism=p).sink(
        "out", FileSink(str(tmp_path / "out"), format="jsonl"))
    return flow


def test_the_driver_launches_through_the_given_launcher(tmp_path):
    launcher = FailingLauncher()
    checkpoint = ep.CheckpointConfig(storage=f"file://{tmp_path}/ckpt", signing_key=b"k" * 32)
    handle = _flow(tmp_path).start(runtime="local", launcher=launcher, checkpoint=checkpoint,
                                   restart=RestartStrategy(max_attempts=0))
    with pytest.raises(Exception, match="the given launcher refused"):
        handle.wait(60)
    assert launcher.launches, "the driver never called the given launcher"
    assert sorted(i for unit in launcher.launches for i in unit) == [0, 1]  # every task, once
    # is_cluster: encrypted as on a cluster (secure defaults), though the tasks never ran
    assert handle._driver.encrypted


def test_a_launcher_needs_the_local_runtime(tmp_path):
    with pytest.raises(ConfigError, match="launcher: .*runtime='local'"):
        _flow(tmp_path).start(runtime="spark", launcher=FailingLauncher())


def test_a_launcher_must_be_a_launcher(tmp_path):
    with pytest.raises(ConfigError, match="launcher: expected .*Launcher, got object"):
        _flow(tmp_path).start(runtime="local", launcher=object())
