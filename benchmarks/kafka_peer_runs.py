"""The caller's side of the peer engines in ``benchmarks/kafka.py``: start one engine's own
Kafka → Kafka job (:mod:`kafka_peers`) in a process of its own — Spark's in epochal's
interpreter with Spark's connector on ``spark.jars``, PyFlink's in its own virtualenv — and
stop it, with a deadline, whatever it is doing.

:func:`prepare` resolves what each engine needs once per invocation (jars from Maven Central,
PyFlink's virtualenv: :mod:`kafka_peer_jars`) and says, per engine, why it cannot run when it
cannot; the benchmark records that reason in place of the engine's figures.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kafka_peer_jars
from kafka_peers import ENGINES, GUARANTEES

RUNNER = Path(__file__).resolve().parent / "kafka_peers.py"
__all__ = ["ENGINES", "GUARANTEES", "PeerJob", "prepare"]


def prepare(engines) -> dict:
    """``{engine: {"python", "jars", "versions"} or {"unavailable": why}}`` for ``engines``."""
    out: dict = {}
    spark = [e for e in engines if e.startswith("spark-")]
    if spark:
        pyspark = kafka_peer_jars.pyspark_version()
        jars, version, why = kafka_peer_jars.spark_connector(pyspark)
        for e in spark:
            out[e] = ({"unavailable": why} if jars is None else
                      {"python": sys.executable, "jars": jars,
                       "versions": {"pyspark": pyspark, "spark-sql-kafka-0-10_2.13": version}})
            if version and version != pyspark:
                out[e]["note"] = (f"Maven Central has no spark-sql-kafka-0-10_2.13 {pyspark}; the newest it serves, "
                                  f"{version}, runs on pyspark {pyspark}")
    if "pyflink" in engines:
        jars, why = kafka_peer_jars.flink_connector()
        python, why_py = kafka_peer_jars.pyflink_python() if jars else (None, None)
        out["pyflink"] = ({"unavailable": why or why_py} if jars is None or python is None else
                          {"python": python, "jars": jars,
                           "versions": {"apache-flink": kafka_peer_jars.FLINK_VERSION,
                                        "flink-sql-connector-kafka": kafka_peer_jars.FLINK_CONNECTOR_VERSION}})
    return out


class PeerJob:
    """One engine's job in its own process group. :meth:`stop` is idempotent: it asks the job
    to stop (the stop file), waits up to ``grace`` s for it to exit, then kills the group."""

    def __init__(self, setup: dict, engine: str, servers: str, src: str, out: str, start: dict[int, int],
                 interval_ms: int, tmp: str, bounded: bool = False):
        self.engine = engine
        self.work = Path(tempfile.mkdtemp(prefix=f"{engine}-", dir=tmp))
        self.stop_file, self.result_file = self.work / "stop", self.work / "result.json"
        self.log = self.work / "engine.log"
        cmd = [setup["python"], str(RUNNER), engine, "--servers", servers, "--src", src, "--out", out,
               "--start", json.dumps({str(p): o for p, o in start.items()}), "--interval-ms", str(interval_ms),
               "--work", str(self.work), "--stop", str(self.stop_file), "--result", str(self.result_file),
               "--jars", ",".join(setup["jars"])] + (["--bounded"] if bounded else [])
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} if engine == "pyflink" else dict(os.environ)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> bool:
        """True once the process exited by itself within ``timeout`` s."""
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop(self, grace: float = 60.0) -> dict:
        """Stop the job; its result (``ok``, ``error``, ``versions``), or why there is none."""
        self.stop_file.touch()
        if not self.wait(grace):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            return {"ok": False, "error": f"{self.engine}: did not stop within {grace:.0f} s (killed); log {self.log}"}
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # what the engine left behind (Beam workers, a JVM)
        if not self.result_file.exists():
            return {"ok": False, "error": f"{self.engine}: exited with {self.proc.returncode} and no result; "
                                          f"log ends: {self.log_tail()}"}
        rec = json.loads(self.result_file.read_text())
        if rec.get("error"):
            rec["error"] += f" (log {self.log})"
        return rec

    def log_tail(self, chars: int = 800) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-chars:]
        return ""


def wait_output(broker, topic: str, records: int, job: PeerJob, timeout: float) -> bool:
    """Until ``topic`` holds ``records`` records (end offsets; a transactional writer's commit
    markers count too, so callers check the committed count after) or the job exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.alive():
        if sum(broker.end_offsets(topic).values()) >= records:
            return True
        time.sleep(0.2)  # polling the topic's end offsets: a progress check, not a protocol step
    return sum(broker.end_offsets(topic).values()) >= records
