"""Kafka to Kafka under SIGKILLs from outside: does every run recover within seconds, exactly?

Issue 36's scenario: a keyed running count (``--records`` lines over 2 partitions) read by
``KafkaSource`` and written by ``KafkaSink`` exactly-once, on embedded Spark. The input is
produced in ``--kills + 1`` parts; after each of the first ``--kills`` parts, once the
current attempt has completed a checkpoint, the benchmark waits a random 0–``--jitter``
seconds (a different kill time every run) and SIGKILLs one task process running count → sink
(chained: the process that holds the Kafka producers), then waits for the restart and a
checkpoint of the new attempt before it sends the next part — so every kill lands mid-run.

Per run it records each recovery (kill → first completed checkpoint of the new attempt), the
attempts, and whether the committed output (read back by an independent read_committed
consumer) equals the plain-Python count. A restored writer that waited for a killed
producer's transaction would take ``transaction.timeout.ms`` (15 min) to recover.

    python benchmarks/kafka_kills.py [--runs 10] [--records 40000] [--kills 3] [--runtime spark] [--smoke]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import harness  # noqa: E402
from kafka_broker import BROKER_NAME, start_broker  # noqa: E402

import epochal as ep  # noqa: E402
from epochal.sinks import KafkaSink  # noqa: E402
from epochal.sources import KafkaSource  # noqa: E402

WORDS = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen", "ibis", "jay", "koi"]


def text(p: int, i: int) -> str:
    x = (p * 1_000_003 + i * 7919 + 12345) * 1103515245 % (1 << 31)
    return " ".join(WORDS[(x >> (3 + j)) % len(WORDS)] for j in range(1 + x % 5))


class Count(ep.KeyedProcessFunction):
    """Running count per word; each process that opens it leaves its pid in ``pid_dir``."""

    def __init__(self, pid_dir: str):
        self.pid_dir = pid_dir

    def open(self, ctx):
        self.n = ctx.value_state("n", default=0)
        open(os.path.join(self.pid_dir, str(os.getpid())), "w").close()

    def process(self, word, value):
        self.n.update(self.n.value() + 1)
        yield [word, self.n.value()]


def oracle(lines) -> collections.Counter:
    words = collections.Counter(w for line in lines for w in line.split())
    return collections.Counter((w, k) for w, c in words.items() for k in range(1, c + 1))


def wait(predicate, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def one_run(broker, args, run: int, rnd: random.Random, spark) -> dict:
    per_part = args.records // 2 // (args.kills + 1)
    topic, out = broker.create_topic(None, 2), broker.create_topic(None, 2)
    lines = {p: [text(p + 2 * run, i) for i in range(per_part * (args.kills + 1))] for p in range(2)}
    pids = tempfile.mkdtemp(prefix="epochal-kills-")
    flow = ep.Dataflow(f"kills-{run}", parallelism=2)
    stops = {(topic, p): len(lines[p]) for p in range(2)}
    (flow.source("lines", KafkaSource(broker.servers, topic, deserializer=bytes.decode, stopping_offsets=stops))
         .flat_map("split", lambda r: r.value.split())
         .key_by(lambda w: w)
         .process("count", Count(pids))
         .sink("out", KafkaSink(broker.servers, out, key=lambda r: r[0])))

    def send(k: int) -> None:
        for p in range(2):
            broker.produce(topic, lines[p][k * per_part:(k + 1) * per_part], partition=p)

    send(0)
    t0 = time.monotonic()
    options = {"spark": spark} if args.runtime == "spark" else {"runtime": "local"}
    handle = flow.start(checkpoint=ep.CheckpointConfig(interval=args.interval, storage="file://" + tempfile.mkdtemp()),
                        restart=ep.RestartStrategy(max_attempts=args.kills + 2, delay=0.1), **options)
    rec = {"run": run, "kills": [], "recovery_s": []}
    try:
        for k in range(1, args.kills + 1):
            attempt = handle.metrics().get("attempt", 0)
            wait(lambda: handle.completed_epochs and os.listdir(pids), "no checkpoint before the kill", 120)
            time.sleep(rnd.uniform(0, args.jitter))  # a different kill time every run
            victims = sorted(os.listdir(pids))
            for name in victims:
                os.remove(os.path.join(pids, name))
            before = max(e["epoch"] for e in handle.completed_epochs)
            for name in rnd.sample(victims, len(victims)):
                try:
                    os.kill(int(name), signal.SIGKILL)
                except ProcessLookupError:
                    continue
                rec["kills"].append(round(time.monotonic() - t0, 2))
                break
            t_kill = time.monotonic()
            wait(lambda: handle.metrics().get("attempt", 0) > attempt, "the kill caused no restart", 120)
            wait(lambda: any(e["epoch"] > before for e in handle.completed_epochs), "no checkpoint after the restart",
                 args.recovery_timeout)
            rec["recovery_s"].append(round(time.monotonic() - t_kill, 3))
            send(k)
        result = handle.wait(args.recovery_timeout + 300)
    except BaseException as exc:
        handle.cancel()
        rec["error"] = f"{type(exc).__name__}: {exc}"
        return rec
    got = collections.Counter(tuple(json.loads(v)) for v in broker.values(out))
    want = oracle(lines[0] + lines[1])
    rec.update(attempts=result.attempts, duration_s=round(result.duration_s, 2), exact=got == want,
               missing=sum((want - got).values()), extra=sum((got - want).values()),
               open_transactions=len(broker.open_transactions(out)))
    return rec


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--records", type=int, default=40_000, help="input lines in all")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--jitter", type=float, default=1.0, help="seconds of random delay before each kill")
    parser.add_argument("--interval", type=float, default=0.1, help="checkpoint interval (s)")
    parser.add_argument("--recovery-timeout", type=float, default=180.0)
    parser.add_argument("--runtime", choices=["spark", "local"], default="spark")
    parser.add_argument("--seed", type=int, default=36)
    parser.add_argument("--smoke", action="store_true", help="one small run")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "kafka_kills.json")
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.records, args.kills = 1, 2_000, 1
    spark = None
    if args.runtime == "spark":
        from epochal.runtime.launch.spark import _local_session

        spark = _local_session(8)
    rnd = random.Random(args.seed)
    broker = start_broker()
    info = harness.machine()
    doc = harness.new_doc("kafka_kills", args, info)
    doc["broker"] = BROKER_NAME
    try:
        doc["runs"] = []
        for run in range(args.runs):
            rec = one_run(broker, args, run, rnd, spark)
            print(json.dumps(rec), flush=True)
            doc["runs"].append(rec)
    finally:
        broker.stop()
    recoveries = [r for rec in doc["runs"] for r in rec.get("recovery_s", [])]
    doc["summary"] = {"runs": len(doc["runs"]), "exact": sum(bool(r.get("exact")) for r in doc["runs"]),
                      "errors": [r["error"] for r in doc["runs"] if "error" in r],
                      "recovery_s": harness.summary(recoveries) if recoveries else None,
                      "max_recovery_s": max(recoveries, default=None)}
    harness.finish(doc, info)
    harness.write_json(args.out, doc)
    print(json.dumps(doc["summary"]))
    ok = doc["summary"]["exact"] == len(doc["runs"]) and not doc["summary"]["errors"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
