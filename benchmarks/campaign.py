"""The randomized campaign of job histories (issue 46; the harness is ``tests/campaign.py``).

Draws ``--histories`` histories from consecutive seeds (a keyed running count, event-time
windows, an interval join, a loop, failover regions, columnar windows or two regions with an
autonomous channel; into a file, transactional-log, PostgreSQL, Kafka, Delta or
Iceberg sink; exactly-once or at-least-once; with up to ``--max-actions`` actions — SIGKILLs
of task processes from outside, one during a recovery, stop and restore with a rescale,
cancel and resume, a rollback to an older savepoint, a guarantee switch, a SIGKILLed driver
then a resume, a second launch, a drain, the checkpoint storage full for a while; named with
``--actions``: a restore from a retained checkpoint drawn at random), runs each
on the local runtime against its own PostgreSQL server and Kafka broker, and checks each
against the plain-Python model. Writes a report: every history with its seed and outcome;
per topology × sink × action how many landed mid-run and the outcomes (ok, lost, duplicated,
wedged, error, late-write — the history's storage changed after its job's handle returned —,
not-landed); per sink × action the same, for docs/lifecycle.md.

    python benchmarks/campaign.py --histories 300 --out benchmarks/results/campaign.json
    python benchmarks/campaign.py --seeds 29 26        # replay histories by seed (same flags)
    python benchmarks/campaign.py --merge a.json b.json --out all.json   # one report of earlier runs

A seed replays only with the flags it was drawn with (``--topologies``, ``--max-actions``,
``--speed``: the report's ``command``).

A history whose output differs from the model is a defect: fix it, then add its seed to
``tests/test_campaign.py``'s slice.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import campaign  # noqa: E402


#: sink → (its test-server module, the function that starts it, the one that says why it cannot)
SERVERS = {"postgres": ("postgres_server", "start_server", "cannot_start_server"),
           "kafka": ("kafka_broker", "start_broker", "cannot_start_broker")}


def services(sinks) -> tuple[dict, list]:
    """The servers the histories need, started here; ``(services, stoppers)``. A sink whose
    server cannot start here is dropped with a message (the report lists the sinks run)."""
    import importlib

    out, stop = {}, []
    for sink, (module, start, cannot) in SERVERS.items():
        if sink not in sinks:
            continue
        server = importlib.import_module(module)
        why = getattr(server, cannot)()
        if why:
            print(f"campaign: no {sink} histories: {why}", file=sys.stderr)
            continue
        out[sink] = getattr(server, start)()
        stop.append(out[sink].stop)
    return out, stop


def summary(reports: list) -> dict:
    """Per topology × sink × action: actions, how many landed mid-run, outcomes."""
    table: dict = collections.defaultdict(lambda: collections.Counter())
    for r in reports:
        for action, landed in zip(r["actions"], r["landed"] or [False] * len(r["actions"])):
            cell = table[f"{r['history'].split()[1].split('/')[0]} × {r['sink']} × {action}"]
            cell["actions"] += 1
            cell["landed"] += bool(landed)
            cell[r["outcome"]] += 1
    outcomes = collections.Counter(r["outcome"] for r in reports)
    per_action = collections.Counter(a for r in reports for a, ok in zip(r["actions"], r["landed"]) if ok)
    by_sink: dict = collections.defaultdict(lambda: collections.Counter())
    for r in reports:  # per sink × action: the histories in which it landed, by outcome
        for action in {a for a, ok in zip(r["actions"], r["landed"]) if ok}:
            by_sink[f"{r['sink']} × {action}"][r["outcome"]] += 1
    return {"histories": len(reports), "outcomes": dict(outcomes), "landed_per_action": dict(per_action),
            "per_topology_sink_action": {k: dict(v) for k, v in sorted(table.items())},
            "per_sink_action_landed": {k: dict(v) for k, v in sorted(by_sink.items())}}


#: action → what an exactly-once target holds afterwards (docs/lifecycle.md); rollback per sink
AFTER = {
    "kill": "exactly the oracle", "kill-twice": "exactly the oracle", "stop-restore": "exactly the oracle",
    "cancel-resume": "exactly the oracle", "switch": "exactly the oracle (at-least-once part: nothing lost)",
    "driver-kill": "exactly the oracle", "second-launch": "refused at start; the first run's output exact",
    "drain": "exactly the oracle of the input read before the stop, every window fired",
    "storage-outage": "exactly the oracle (checkpoints declined meanwhile)",
    "rollback": {"file": "remove", "*": "keep"},
    "restore-checkpoint": {"file": "remove", "*": "keep"},
}
#: the text of an action whose outcome depends on the sink's rollback semantics
ROLLBACK_TEXT = {
    "rollback": "*remove*: one history (the abandoned epochs' files deleted, then the branch's); "
                "*keep*: the parent's output plus its epochs after the savepoint once more",
    "restore-checkpoint": "a retained checkpoint drawn at random restored after a stop: as a rollback to "
                          "that checkpoint's epoch",
}


def lifecycle_table(summary: dict, sinks) -> str:
    """docs/lifecycle.md's table: per action and sink, what the output is afterwards, and of
    the histories in which the action landed, how many met the model (of how many)."""
    cells = summary["per_sink_action_landed"]
    lines = ["| action | " + " | ".join(sinks) + " |", "|---" * (len(sinks) + 1) + "|"]
    for action, after in AFTER.items():
        row = [f"**{action}**: " + (after if isinstance(after, str) else ROLLBACK_TEXT[action])]
        for sink in sinks:
            c = cells.get(f"{sink} × {action}", {})
            n, passed = sum(c.values()), c.get("ok", 0) + c.get("not-landed", 0)  # both met the model
            text = (after.get(sink) or after["*"]) + ": " if isinstance(after, dict) else ""
            bad = ", ".join(f"{v} {k}" for k, v in sorted(c.items()) if k not in ("ok", "not-landed"))
            row.append(f"{text}{passed}/{n}" + (f" ({bad})" if bad else "") if n else text + "no history")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def supersede(reports: list) -> tuple[list, list]:
    """``(current, superseded)``: a history run again (the same ``history`` text: seed,
    topology, sink, guarantee, parallelism, speed and schedule) replaces its earlier runs —
    a replay after a fix; the earlier ones are kept under ``superseded`` with the command
    of the run that replaced them, never dropped unseen."""
    last = {r["history"]: i for i, r in enumerate(reports)}
    current = [r for i, r in enumerate(reports) if last[r["history"]] == i]
    superseded = [dict(r, superseded_by=reports[last[r["history"]]].get("command"))
                  for i, r in enumerate(reports) if last[r["history"]] != i]
    return current, superseded


def merge(paths: list, out: str | None) -> None:
    """One report of earlier campaign reports (each history keeps the command it ran with;
    a history run again supersedes its earlier runs: :func:`supersede`)."""
    reports, runs, superseded = [], [], []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        if "runs" in doc:  # an earlier merge: its runs and reports as they are
            reports += doc["reports"]
            runs += doc["runs"]
            superseded += doc.get("superseded", [])
            continue
        for r in doc["reports"]:
            r.setdefault("command", doc["command"])
        reports += doc["reports"]
        runs.append({"command": doc["command"], "histories": len(doc["reports"]), "seconds": doc["seconds"],
                     "machine": doc["machine"], "sinks": doc["sinks"], "topologies": doc["topologies"]})
    reports, replaced = supersede(reports)
    superseded += replaced
    doc = {"benchmark": "campaign", "runs": runs, "summary": summary(reports), "reports": reports,
           "superseded": superseded}
    print(json.dumps(doc["summary"], indent=1))
    print(lifecycle_table(doc["summary"], ["file", "log", "postgres", "kafka", "delta", "iceberg"]))
    if out:
        Path(out).write_text(json.dumps(doc, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--histories", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--seeds", type=int, nargs="*", help="replay exactly these seeds")
    parser.add_argument("--sinks", nargs="*", default=list(campaign.SINKS))
    parser.add_argument("--topologies", nargs="*", default=list(campaign.TOPOLOGIES))
    parser.add_argument("--max-actions", type=int, default=3)
    parser.add_argument("--actions", nargs="*", default=list(campaign.ACTIONS),
                        choices=list(campaign.ACTIONS + campaign.ACTIONS_LATER),
                        help="draw only these actions (default: campaign.ACTIONS; campaign.ACTIONS_LATER, e.g. "
                             "restore-checkpoint, only when named, so earlier reports' seeds replay)")
    parser.add_argument("--speed", type=float, default=1.0, help="source rates times this (shorter runs)")
    parser.add_argument("--merge", nargs="*", help="merge these reports into --out; run nothing")
    parser.add_argument("--out", default=None, help="the JSON report (default: print the summary only)")
    args = parser.parse_args()
    if args.merge:
        return merge(args.merge, args.out)

    seeds = args.seeds or list(range(args.first_seed, args.first_seed + args.histories))
    # a campaign stopped with SIGTERM still stops the servers it started (the finally below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    live, stoppers = services(args.sinks)
    runnable = [s for s in args.sinks if s not in SERVERS or s in live]
    reports, t0, load_at_start = [], time.time(), os.getloadavg()[0]

    def document() -> dict:
        return {"benchmark": "campaign", "started": t0, "seconds": round(time.time() - t0, 1),
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                            "load_at_start": load_at_start, "load_now": os.getloadavg()[0]},
                "sinks": runnable, "topologies": args.topologies, "command": " ".join(sys.argv),
                "summary": summary(reports), "reports": reports}

    try:
        for seed in seeds:
            history = campaign.draw(seed, topologies=tuple(args.topologies), max_actions=args.max_actions,
                                    speed=args.speed, actions=tuple(args.actions))
            if history.sink not in runnable:
                continue
            work = tempfile.mkdtemp(prefix="campaign-")
            report = campaign.run(history, live, work)  # a write after the job's end: outcome late-write
            try:
                shutil.rmtree(work)
            except OSError as exc:  # something appeared while it was removed: still written after the end
                report.outcome = "late-write"
                report.detail = f"its directory could not be removed after the history: {exc}; {report.detail}"
            reports.append(dataclasses.asdict(report))
            print(f"{report.outcome:>10}  {report.seconds:6.1f} s  {report.history}"
                  + (f"\n            {report.detail}" if report.outcome != "ok" else ""), flush=True)
            if args.out:  # after every history: a campaign stopped early keeps what it ran
                Path(args.out).write_text(json.dumps(document(), indent=1))
    finally:
        for stop in stoppers:
            stop()
    doc = document()
    print(json.dumps(doc["summary"], indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1))
    bad = [r for r in reports if r["outcome"] not in ("ok", "not-landed")]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
