"""Where the latency of a Kafka → Kafka exactly-once run goes (issue 34): reads the stage
events :mod:`epochal.connectors.kafka.trace` wrote (run the job or ``benchmarks/kafka.py``
with ``EPOCHAL_KAFKA_TRACE=<dir>``) and prints, per stage, p50/p99 over epochs (or over
fetches) in milliseconds:

* ``fetch lag``: a fetched batch's oldest record, from its Kafka timestamp to the fetch;
* ``epoch length``: between consecutive seals of one subtask;
* ``oldest → seal``: an epoch's oldest record, from its Kafka timestamp to the seal (fetch
  lag + the time the record waits in its epoch);
* ``seal → complete``: the checkpoint completion path (every task acknowledged, the
  coordinator completed the epoch, the writer was told);
  it splits into ``seal → flushed`` (the durability step: every record of the epoch
  acknowledged by the broker) and ``flushed → complete`` (the engine's part);
* ``complete → commit sent``: waiting for the commit thread (earlier commits);
* ``commit sent → ack``: the Kafka commit itself (marker offsets + commit_transaction);
  ``produced at commit``: the same for the epochs that found no free producer and were
  produced from their handle at commit (``n`` counts them); ``joined at commit``: those
  of them committed together with others, when the commit thread fell behind;
* ``oldest → ack``: the sum, for an epoch's oldest record: its latency up to visibility
  (the read_committed reader adds its own poll delay).

    python benchmarks/kafka_trace.py DIR [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def load(folder: Path) -> list[dict]:
    events = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                events.append(json.loads(line))
    return events


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[max(0, min(len(values) - 1, int(q / 100.0 * len(values) + 0.999999) - 1))], 1)


def breakdown(events: list[dict], skip_s: float = 1.0) -> dict:
    """Per-stage p50/p99 (ms); the first ``skip_s`` seconds after the first write (start-up)
    are left out."""
    first_write = min((e["t"] for e in events if e["kind"] == "write"), default=0.0)
    start = first_write + skip_s
    fetch = [1000 * e["t"] - e["min_ts"] for e in events
             if e["kind"] == "fetch" and e.get("min_ts") is not None and e["t"] >= start]
    fetch_n = [e["n"] for e in events if e["kind"] == "fetch" and e["t"] >= start]
    epochs: dict[tuple, dict] = defaultdict(dict)
    for e in events:
        if "epoch" in e:
            epochs[(e["subtask"], e["epoch"])].setdefault(e["kind"], e)
    stages: dict[str, list[float]] = defaultdict(list)
    seals: dict[int, list[float]] = defaultdict(list)
    for (subtask, _epoch), ev in sorted(epochs.items()):
        seal = ev.get("seal")
        if seal is None or seal["t"] < start:
            continue
        seals[subtask].append(seal["t"])
        if not seal.get("count"):
            continue
        complete, sent, ack = ev.get("complete"), ev.get("commit_sent"), ev.get("commit_ack")
        if seal.get("min_ts") is not None:
            stages["oldest -> seal"].append(1000 * seal["t"] - seal["min_ts"])
            if ack is not None:
                stages["oldest -> ack"].append(1000 * ack["t"] - seal["min_ts"])
        if complete is not None:
            stages["seal -> complete"].append(1000 * (complete["t"] - seal["t"]))
        flushed = ev.get("flushed")
        if flushed is not None:
            stages["seal -> flushed"].append(1000 * (flushed["t"] - seal["t"]))
            if complete is not None:
                stages["flushed -> complete"].append(1000 * (complete["t"] - flushed["t"]))
        if complete is not None and sent is not None:
            stages["complete -> commit sent"].append(1000 * (sent["t"] - complete["t"]))
        if sent is not None and ack is not None:
            stages["commit sent -> ack"].append(1000 * (ack["t"] - sent["t"]))
            if not sent.get("streamed", True):
                stages["produced at commit"].append(1000 * (ack["t"] - sent["t"]))
            if sent.get("joined", 1) > 1:
                stages["joined at commit"].append(1000 * (ack["t"] - sent["t"]))
    for ts in seals.values():
        stages["epoch length"] += [1000 * (b - a) for a, b in zip(ts, ts[1:])]
    out = {"fetch lag": {"p50": pct(fetch, 50), "p99": pct(fetch, 99), "n": len(fetch)},
           "fetch batch records": {"p50": pct(fetch_n, 50), "p99": pct(fetch_n, 99), "n": len(fetch_n)}}
    for name in ("epoch length", "oldest -> seal", "seal -> complete", "seal -> flushed", "flushed -> complete",
                 "complete -> commit sent",
                 "commit sent -> ack", "produced at commit", "joined at commit", "oldest -> ack"):
        xs = stages.get(name, [])
        out[name] = {"p50": pct(xs, 50), "p99": pct(xs, 99), "n": len(xs)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = breakdown(load(args.folder))
    for name, row in result.items():
        print(f"{name:26s} p50 {row['p50']!s:>8}  p99 {row['p99']!s:>8}  (n={row['n']})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
