"""Turn benchmarks/results/*.json into plots and the README's "Results" section.

Reads whichever ``<name>.json`` of :data:`BENCHMARKS` exist and writes ``README_SECTION.md``
(markdown: one table per benchmark, the machine they ran on, the command that produced them) and ``<name>.png`` next to them. Nothing in
the section is typed by hand: paste it into README.md, or diff it against the README.

    python benchmarks/report.py                       # benchmarks/results → benchmarks/results
    python benchmarks/report.py --results DIR --out DIR
    python benchmarks/report.py --no-plots            # markdown only (no matplotlib needed)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
BENCHMARKS = ("throughput", "latency", "chain", "chain_intervals", "alignment", "recovery", "state", "state_stress",
              "window", "event_windows", "loops", "peers", "dataplane", "serde", "backpressure", "cluster", "tables")


# ---------------------------------------------------------------------- formatting
def _n(value, spec: str = ",.0f") -> str:
    return "–" if value is None else format(value, spec)


def _ms(value) -> str:
    return "–" if value is None else f"{value * 1e3:.0f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def _command(doc: dict) -> str:
    cmd = doc.get("command")
    if isinstance(cmd, list):
        cmd = " ".join(Path(c).name if i == 0 else c for i, c in enumerate(cmd))
        cmd = cmd.replace(str(Path(__file__).resolve().parent.parent) + "/", "")
    return f"`{cmd}`" if cmd else "–"


def _paired(runs: list[dict], field: str, a: dict, b: dict) -> list[float]:
    """Per repetition, ``field`` of the run matching ``a`` over that of the run matching
    ``b`` (matches: key → value, e.g. ``{"case": c, "mode": m}``); runs with errors skipped."""
    def pick(match: dict, rep):
        return next((r for r in runs if "error" not in r and r.get("repetition") == rep
                     and all(r.get(k) == v for k, v in match.items())), None)
    out = []
    for rep in sorted({r.get("repetition") for r in runs if r.get("repetition") is not None}):
        x, y = pick(a, rep), pick(b, rep)
        if x and y and x.get(field) and y.get(field):
            out.append(x[field] / y[field])
    return out


def describe_machine(m: dict) -> str:
    """One line: cores, CPU, memory, load, versions."""
    if not m:
        return "machine: not recorded"
    load = m.get("loadavg_at_start")
    parts = [f"{m.get('cpu_count')} cores ({m.get('cpu_model') or 'unknown CPU'})",
             f"{m.get('memory_total_gb')} GB RAM",
             f"load average {load[0]:.1f} at start" if load else None,
             f"Python {m.get('python')}", f"PySpark {m.get('pyspark')}", m.get("java"),
             f"commit {m['git_commit'][:8]}{' + uncommitted changes' if m.get('git_dirty') else ''}"
             if m.get("git_commit") else None]
    return ", ".join(p for p in parts if p)


# ---------------------------------------------------------------------- sections
def section_throughput(doc: dict) -> str:
    rows = []
    for name, m in doc["modes"].items():
        p = m["checkpoints"]["periodic"]["duration_s"]
        rows.append([name, _n(m["interval_s"], "g") if m["interval_s"] else "–",
                     _n(m["records_per_s"]["median"]), _n(m["ratio_to_baseline"], ".2f"),
                     _n(m["steady_records_per_s"]["median"]), _n(m["steady_ratio_to_baseline"], ".2f"),
                     _n(m["steady_cpu_ratio_to_baseline"], ".2f"),
                     f"{_ms(p['p50'])} / {_ms(p['p99'])}" if p["p50"] is not None else "–"])
    cfg = doc["config"]
    return (f"### Throughput: the cost of checkpointing\n\n"
            f"Two-shuffle keyed word count, parallelism {cfg['parallelism']}, {cfg['records']:,} lines, "
            f"runtime `{cfg['runtime']}`, median of {cfg['repetitions']} interleaved repetitions "
            f"({_command(doc)}):\n\n"
            + _table(["mode", "interval s", "lines/s", "ratio", "steady lines/s", "ratio", "steady CPU ratio",
                      "checkpoint p50 / p99 ms"], rows))


def section_latency(doc: dict) -> str:
    by = {(r["interval_s"], r["guarantee"]): r["latency_s"] for r in doc["runs"]}
    rows = []
    for interval in sorted({i for i, _ in by}):
        cells = []
        for g in ("exactly-once", "at-least-once"):
            lat = by.get((interval, g))
            cells.append(f"{lat['p50']:.3f} / {lat['p99']:.3f}" if lat and lat["p50"] is not None else "–")
        rows.append([f"{interval:g}", *cells])
    cfg = doc.get("config", {})
    return (f"### End-to-end latency\n\nRecord produced → visible to a reader of the output directory, "
            f"{_n(cfg.get('rate'))} records/s, runtime `{cfg.get('runtime')}` ({_command(doc)}):\n\n"
            + _table(["checkpoint interval s", "exactly-once p50 / p99 s", "at-least-once p50 / p99 s"], rows))


def section_chain(doc: dict) -> str:
    rows_by = {}
    for r in doc["summary"]:
        rows_by.setdefault((r["n_ops"], r["layout"]), []).append(r)
    intervals = doc["config"]["intervals"]
    short = {"at-least-once": "AL", "exactly-once": "EO"}
    header = ["N", "layout", "tasks", "baseline rec/s"] + [f"{short[g]} {i:g} s" for i in intervals
                                                            for g in ("at-least-once", "exactly-once")]
    rows = []
    for (n_ops, layout), rs in sorted(rows_by.items()):
        cell = {(r["mode"], r["interval_s"]): r for r in rs}
        base = cell.get(("no-checkpoint", None), {})
        rows.append([str(n_ops), layout, str(rs[0]["tasks"]), _n(base.get("steady_records_per_s"))]
                    + [_n(cell.get((g, i), {}).get("steady_ratio"), ".2f") for i in intervals
                       for g in ("at-least-once", "exactly-once")])
    title = "Stateless chain vs checkpoint interval" if len(intervals) > 2 else "Stateless chain (IBM Fig. 7(c) shape)"
    return (f"### {title}\n\n"
            f"Source → N pass-through maps → jsonl sink, parallelism 1; `chained` fuses everything into one "
            f"task, `unchained` puts a channel between every pair of operators. Steady throughput (records "
            f"between the 5 % and 95 % in-pipeline timestamps / time) normalised to the no-checkpoint baseline "
            f"of the same block; AL = at-least-once, EO = exactly-once; median of "
            f"{doc['config'].get('repetitions', 1)} run(s) per cell ({_command(doc)}):\n\n"
            + _table(header, rows))


def section_peers(doc: dict) -> str:
    rows, failed, stateless = [], [], []
    for p in doc["peers"]:
        if p.get("status") != "ok":
            failed.append(f"- **{p['name']}** ({p.get('engine', '')}): {p.get('status')}: "
                          f"`{_one_line(p.get('error', ''))}`")
            continue
        if "words_per_s" in p:  # Spark continuous: stateless half only, at an offered rate
            stateless.append(f"- **{p['name']}**: {_one_line(p.get('note', ''), 600)}")
            continue
        rows.append([p["name"], p.get("guarantee_short", "–"), _n(p.get("engine_steady_words_per_s")),
                     _n(p.get("steady_lines_per_s")),
                     _n(p.get("large", {}).get("lines_per_s")), _n(p.get("large", {}).get("seconds"), ".1f"),
                     _n(p.get("fixed_cost_s"), ".1f"), "yes" if p.get("counts_verified") else "no"])
    cfg = doc["config"]
    text = (f"### The same word count on other engines\n\n"
            f"Keyed word count (count per word) of the same generated lines "
            f"(`tests/pipelines.py` `line(split, i)`, {cfg['splits']} splits), parallelism {cfg['parallelism']}, "
            f"checkpoint / trigger interval 1 s, one machine, one invocation ({_command(doc)}). "
            f"*Marginal* lines/s = ({cfg['large_lines']:,} − {cfg['small_lines']:,}) lines / (T_large − T_small): "
            f"engine start-up cancels. *Whole* = {cfg['large_lines']:,} lines / T_large, start-up included. "
            f"\"counts ok\": the emitted counts equal a plain-Python count. epochal, PyFlink and Bytewax write one "
            f"running count per input word to a file sink; Structured Streaming (update mode) writes one row per "
            f"word changed in a micro-batch to the memory sink, so it writes far less. Settings and exactly-once "
            f"caveats of every engine are in `peers.json`. *Steady words/s*: the engine's own throughput "
            f"samples (epochal: the sources' lines/s in its progress events; Structured Streaming: "
            f"processedRowsPerSecond per micro-batch), median without the first and last, × 3.5 words per line; "
            f"the epochal engines read {cfg.get('epochal_scale', 1)}× (records) and {cfg.get('columnar_scale', 1)}× "
            f"(columnar) as many lines (the same generator), for a steady state long enough to sample.\n\n"
            + _table(["engine / mode", "fault tolerance", "steady words/s", "marginal lines/s", "whole lines/s",
                      "T_large s", "fixed cost s", "counts ok"], rows))
    for m in doc.get("merges", []):
        text += (f"\n\nRe-run separately and merged into the JSON ({m.get('started_at', '')}): "
                 f"{', '.join(m['engines'])} (`{' '.join(Path(c).name if i == 0 else c for i, c in enumerate(m['command']))}`).")
    if stateless:
        text += ("\n\nSpark continuous mode (no aggregation possible: the stateless half only, not comparable):"
                 "\n\n" + "\n".join(stateless))
    if failed:
        text += "\n\nDid not run:\n\n" + "\n".join(failed)
    return text


def section_window(doc: dict) -> str:
    cfg, rows = doc["config"], []
    for size, modes in doc["summary"].items():
        for mode, m in modes.items():
            span = m["paired_ratios"]
            rows.append([size, mode, _n(m["steady_records_per_s"]["median"]), _n(m["ratio_to_baseline"], ".2f"),
                         f"{_n(span['min'], '.2f')}–{_n(span['max'], '.2f')}" if span["raw"] else "–",
                         _n(m["measured_checkpoints"]["median"], ".0f"),
                         f"{_ms(m['checkpoint_duration_s']['p50'])} / {_ms(m['checkpoint_duration_s']['p99'])}",
                         f"{_ms(m['sync_s']['p50'])} / {_ms(m['sync_s']['p99'])}",
                         _n(m["bytes_per_checkpoint"] and m["bytes_per_checkpoint"] / 2**20, ".1f")])
    return (f"### Large-state sliding window (IBM Fig. 7(b) shape)\n\n"
            f"Source → {cfg['maps']} maps → keyed sliding window ({cfg['keys']} keys, MapState ring buffer of "
            f"{cfg['payload_bytes']} B incompressible records, parallelism {cfg['parallelism']}) → jsonl sink, "
            f"checkpoint interval {cfg['interval']:g} s, runtime `{cfg['runtime']}`. Every window is filled first; "
            f"the steady rate counts only the {cfg['post_records']:,} records after the fill, normalised to the "
            f"no-checkpoint run of the same size and repetition (median of {cfg['repetitions']} paired ratios, "
            f"min–max shown). Checkpoint and sync (task blocked) times are over the checkpoints triggered after the "
            f"fill. `rocksdb-incr`'s ratio also contains RocksDB's per-access cost (the baseline keeps the window on "
            f"the heap). For reference, IBM Streams lost 4 % (8 MB) to 40 % (512 MB) with blocking checkpoints and kept "
            f"94 % at 512 MB with non-blocking ones ({_command(doc)}):\n\n"
            + _table(["MB", "mode", "steady rec/s", "ratio", "min–max", "ckpts", "checkpoint p50 / p99 ms",
                      "sync p50 / p99 ms", "MB / ckpt"], rows))

def section_event_windows(doc: dict) -> str:
    wl, cfg, rows = doc["workload"], doc["config"], []
    for name, s in doc["summary"].items():
        st = s["steady_events_per_s"]
        ck = s.get("checkpoint_duration_s") or s.get("micro_batch_s") or {}
        kind = "checkpoint" if "checkpoint_duration_s" in s else "micro-batch" if "micro_batch_s" in s else ""
        lat = [s.get(k, {}) for k in ("fired_to_committed", "fired_to_visible")]
        pr = s.get("paired_ratios_to_no_checkpoint", {"raw": []})
        rows.append([name, doc["settings"].get(name, {}).get("fault_tolerance", "–"),
                     _n(st["median"]) + (f" ({_n(st['min'])}–{_n(st['max'])})" if len(st["raw"]) > 1 else ""),
                     _n(s["ratio_to_no_checkpoint"], ".2f") + (
                         f" ({_n(pr['median'], '.2f')}: {_n(pr['min'], '.2f')}–{_n(pr['max'], '.2f')})"
                         if len(pr["raw"]) > 1 and name != "epochal-no-checkpoint" else ""),
                     _n(s["ratio_to_exactly_once"], ".2f"),
                     f"{kind} {_ms(ck['p50'])} / {_ms(ck['p99'])}" if ck.get("p50") is not None else "–",
                     *[f"{_n(x.get('p50'), '.2f')} / {_n(x.get('p99'), '.2f')}" if x else "–" for x in lat],
                     f"{'yes' if s['correct'] else 'NO'} ({s['runs_ok']}/{s['runs']})"])
    spark = doc["summary"].get("spark-ss", {}).get("watermark_to_committed")
    text = (f"### Event-time windows against other engines\n\n"
            f"Sum per key over {cfg['window_s']} s tumbling event-time windows, {cfg['keys']:,} keys, "
            f"{wl['events']:,} events ({wl['windows']} windows; out of order by ≤ {cfg['disorder_us'] / 1e6:g} s, "
            f"watermark bound {cfg['bound_us'] / 1e6:g} s), parallelism {cfg['parallelism']}, the same events on "
            f"every engine, {cfg['repetitions']} interleaved repetition(s) in one invocation ({_command(doc)}). "
            f"*Steady events/s*: the events between the firing of the window at 20 % of the event-time span and "
            f"that of the last window closed by the input's own watermark / the time between them (median, "
            f"min–max); ratios divide medians (in brackets: the median and range of the per-repetition ratios "
            f"to the no-checkpoint run). *fired*: the window's result was produced (its watermark passed "
            f"the window's end); *committed*: part of the durable exactly-once output; *visible*: a reader of the "
            f"output directory sees it — latencies in s, p50 / p99 over the steady windows' rows, median over "
            f"repetitions. \"correct\": every run's rows equal a plain-Python oracle. What each time means per "
            f"engine, and every engine's settings, are in `event_windows.json` (`settings`).\n\n"
            + _table(["engine / mode", "fault tolerance", "steady events/s", "/ no-ckpt", "/ epochal EO",
                      "p50 / p99 ms", "fired → committed s", "fired → visible s", "correct"], rows))
    loads = [r["loadavg_1m_before"] for r in doc["runs"] if r.get("loadavg_1m_before") is not None]
    if loads:
        text += (f"\n\nLoad average (1 min) before the runs: {min(loads):.1f}–{max(loads):.1f} on "
                 f"{doc['machine'].get('cpu_count')} cores — other tenants' work shares the machine, so single runs "
                 f"vary widely; read the ranges.")
    if spark:
        text += (f"\n\nSpark emits a window in the micro-batch after the one that moved its watermark past the "
                 f"window's end; from the end of that earlier micro-batch to the commit: p50 "
                 f"{_n(spark['p50'], '.2f')} s, p99 {_n(spark['p99'], '.2f')} s.")
    if doc.get("errors"):
        text += "\n\nErrors:\n\n" + "\n".join(f"- `{_one_line(e)}`" for e in doc["errors"])
    return text


def section_dataplane(doc: dict) -> str:
    cfg, summ = doc["config"], doc["summary"]
    epochal = [v for v in summ if v.startswith("epochal")]
    ceilings = [v for v in summ if not v.startswith("epochal")]
    rows = []
    for v, s in summ.items():
        r = s["records_per_s"]
        rows.append([v, _n(r["median"]), f"{_n(r['min'])} – {_n(r['max'])}", _n(s["mb_per_s"], ",.1f"),
                     _n(s.get("producer_cpu_ns_per_record")), _n(s.get("consumer_cpu_ns_per_record"))]
                    + [_n(summ[e].get("ratio_to", {}).get(v), ".3f") if v in ceilings else "–" for e in epochal])
    wire = doc.get("epochal_wire", {}).get("channel_config", {})
    wb = doc.get("wire_bytes_per_record", {})
    same_run = [f"`{v}` {_n(summ[v]['ratio_to_exactly_once'], '.2f')} (per repetition "
                f"{', '.join(_n(x, '.2f') for x in summ[v].get('paired_ratios_to_exactly_once', []))})"
                for v in epochal if summ[v].get("ratio_to_exactly_once") is not None]
    return (f"### The data plane against its ceiling\n\n"
            f"`GeneratorSource → rebalance() → counting sink`, parallelism 1, runtime `local` (two task "
            f"processes, one TCP channel) vs. two bare processes over loopback TCP sending the same records "
            f"(`(id, {cfg['payload']}-byte blob)`, {doc['record_bytes']} payload bytes; batches of "
            f"{wire.get('batch_size')}, epochal linger {wire.get('linger_s')} s, {wire.get('credits')} credits). "
            f"Steady rate between the 5 % and 95 % receiver stamps, median of {cfg['repetitions']} interleaved "
            f"repetition(s) ({_command(doc)}). Wire bytes per record: pickle frame "
            f"{_n(wb.get('pickle_frame'), '.1f')}, Arrow IPC {_n(wb.get('arrow_ipc'), '.1f')}. `pickle` = epochal's "
            f"wire format without the engine, `arrow-py` = Python tuples through Arrow IPC and back, `arrow` = "
            f"pre-built Arrow batches, `bytes` = socket memcpy, `generate` = the record generator alone. "
            f"CPU ns/record per side in the steady window: send = sender process or source task, recv = "
            f"receiver process or sink task (with its channel reader thread)."
            + (f" Steady rate relative to `epochal exactly-once` in the same run: {'; '.join(same_run)}."
               if same_run else "") + "\n\n"
            + _table(["variant", "steady rec/s", "min – max", "payload MB/s", "send CPU ns/rec", "recv CPU ns/rec"]
                     + [f"{e} / this" for e in epochal], rows))


def section_state(doc: dict) -> str:
    cfg, rows = doc["config"], []
    for size, modes in sorted(doc["summary"].items(), key=lambda kv: int(kv[0])):
        for mode, m in modes.items():
            d = m["checkpoint_duration_s"]
            rows.append([size, mode, _n(m["steady_records_per_s"]), _n(m["ratio_to_baseline"], ".2f"),
                         _n(m.get("whole_run_ratio"), ".2f"),
                         f"{_ms(d['median'])} / {_ms(d.get('p99'))}" if d["median"] is not None else "–",
                         _ms(m["sync_s"]["median"]) if m["sync_s"]["median"] is not None else "–",
                         _n(m["uploaded_bytes_per_checkpoint"]["median"] and
                            m["uploaded_bytes_per_checkpoint"]["median"] / 2**20, ".1f"),
                         _n(m["state_bytes_per_checkpoint"]["median"] and
                            m["state_bytes_per_checkpoint"]["median"] / 2**20, ".1f"),
                         _n(m["recovery_s"], ".2f")])
    return (f"### State backends at scale, checkpoint every {cfg['interval']:g} s\n\n"
            f"Keyed job, {cfg['value_bytes']} B incompressible values, load then {cfg['updates']:,} updates of a "
            f"hot 1 % of the keys, parallelism {cfg['parallelism']}, checkpoint interval {cfg['interval']:g} s, "
            f"runtime `{cfg['runtime']}`, {cfg['repetitions']} repetition(s). Steady ratio = update-phase "
            f"records/s over the no-checkpoint run of the same size and repetition (median); upload and state "
            f"MB per periodic checkpoint; recovery = restoring the keyed state of the last checkpoint "
            f"({_command(doc)}):\n\n"
            + _table(["MB", "mode", "steady rec/s", "steady ratio", "run ratio", "checkpoint p50 / p99 ms",
                      "sync ms", "uploaded MB", "state MB", "recovery s"], rows))


def section_loops(doc: dict) -> str:
    cfg, rows = doc["config"], []
    for r in doc["runs"]:
        d = r["checkpoint_duration_s"]
        rows.append([_n(r["in_flight"]), _n(r["iterations_per_s"]), str(r["completed_epochs"]),
                     f"{_ms(d['median'])} / {_ms(d['max'])}"])
    return (f"### Checkpointed loops\n\n"
            f"An iterative job with a fixed number of records circulating in a loop, {cfg['guarantee']}, "
            f"checkpoint interval {cfg['interval']} s, parallelism {cfg['parallelism']}, runtime "
            f"`{cfg['runtime']}`; the loop head logs the records in transit on the back-edge for every epoch "
            f"({_command(doc)}):\n\n"
            + _table(["records in flight", "iterations/s", "epochs", "checkpoint median / max ms"], rows))
def section_alignment(doc: dict) -> str:
    def pp(d):
        return "–" if not d or d.get("p50") is None else f"{_ms(d['p50'])} / {_ms(d['p99'])}"

    rows = []
    for c in doc["summary"]:
        if not c.get("runs_ok"):
            rows.append([str(c["parallelism"]), c["guarantee"], "failed"] + ["–"] * 10)
            continue
        parts = c["critical_parts_p50_s"]
        top = max(c["critical_operator"].items(), key=lambda kv: kv[1])
        rows.append([str(c["parallelism"]), c["guarantee"], f"{c['tasks']} ({c['tasks_per_core']:g}/core)",
                     _n(c["achieved_lines_per_s"]["median"]), pp(c["checkpoint_s"]), pp(c["alignment_task_s"]),
                     pp(c["alignment_max_s"]), pp(c["sync_max_s"]), pp(c.get("sink_sync_s")),
                     "yes" if c["target_p99_met"] else "no", f"`{top[0]}` {top[1]:.0%}",
                     " + ".join(_ms(parts.get(k)) for k in ("barrier_s", "sync_s", "upload_wait_s", "upload_s",
                                                            "rest_s"))])
    cfg = doc["config"]
    load = (doc.get("machine") or {}).get("loadavg_at_start") or [None]
    rate = f"{cfg['rate']:,.0f} lines/s offered" if cfg.get("rate") else "an unthrottled source"
    return (f"### Alignment and checkpoint duration vs parallelism\n\n"
            f"Two-shuffle keyed word count (small state), {rate}, checkpoint every {cfg['interval']:g} s, "
            f"runtime `{cfg['runtime']}`, {cfg['repetitions']} interleaved repetition(s) of {cfg['lines']:,} lines "
            f"per cell ({_command(doc)}). p50 / p99 in ms, nearest rank over all periodic epochs; "
            f"*align/task*: per task with ≥ 2 inputs (first → last barrier); *align/epoch* and *sync*: the "
            f"maximum over an epoch's tasks; *sink sync*: the `out` tasks' sync part, i.e. the FileSink "
            f"seal of its transaction (its flush and fsync run afterwards on the uploader, inside *upload*); *last ack*: the operator whose task is acknowledged last, and the "
            f"median parts of its acknowledgement time (barrier delay incl. alignment + sync + wait for the "
            f"uploader + upload, i.e. write and fsync of the state file + rest: ack transit and coordinator). "
            f"The machine has {(doc.get('machine') or {}).get('cpu_count')} cores "
            f"(load {_n(load[0], '.1f')} at start): parallelism p runs 4p task processes.\n\n"
            + _table(["p", "guarantee", "tasks", "lines/s", "checkpoint", "align/task", "align/epoch", "sync",
                      "sink sync", f"p99 < {_ms(doc.get('target_p99_s', 0.1))} ms", "last ack",
                      "barrier + sync + wait + upload + rest"], rows))


def section_recovery(doc: dict) -> str:
    rows = []
    for c in doc["summary"]:
        if not c.get("runs_ok"):
            rows.append([str(c["size_mb"]), c["backend"], "failed"] + ["–"] * 7)
            continue
        parts = c["parts_p50_s"]
        rows.append([str(c["size_mb"]), c["backend"], _n(c["restored_mb"]["median"], ".0f"),
                     _n(c["recovery_s"]["median"], ".2f"),
                     " + ".join(_n(parts[k], ".2f") for k in ("stop_s", "restart_s", "launch_s", "restore_s")),
                     _n(c["task_restore_s"]["median"], ".2f"), _n(c["golden_s"]["median"], ".1f"),
                     _n(c["extra_s"]["median"], ".2f"), "yes" if c["outputs_equal"] else "**no**"])
    cfg = doc["config"]
    return (f"### Recovery time after a crash\n\n"
            f"Keyed job of `state.py`'s shape (one 1 KiB incompressible value per key, then updates of a hot "
            f"1 %), parallelism {cfg['parallelism']}, checkpoint every {cfg['interval']:g} s, runtime "
            f"`{cfg['runtime']}`; the crash run kills a `store` task's process (`CrashAtRecord(how="
            f"\"{cfg['how']}\")`) at {cfg['crash_at']:.0%} of its input, once the first checkpoint holding the "
            f"full state completed (its epoch taken from the golden run); median of "
            f"{cfg['repetitions']} pair(s) of golden and crash runs ({_command(doc)}). *Recovery*: the "
            f"coordinator sees the failure → every task of the next attempt restored and running, split into "
            f"stop (tasks of the failed attempt gone) + restart (choose and verify the checkpoint) + launch "
            f"(processes up and connected) + restore (state read and installed). *Extra wall*: crash run − "
            f"golden run, which adds re-processing since the checkpoint. *Output equal*: the committed output "
            f"of every crash run equals its golden run's as a multiset.\n\n"
            + _table(["state MB", "backend", "restored MB", "recovery s", "stop + restart + launch + restore s",
                      "slowest task restore s", "golden run s", "extra wall s", "output equal"], rows))


def section_backpressure(doc: dict) -> str:
    cfg, cases, summ = doc["config"], doc["cases"], doc["summary"]
    rows = []
    for case, modes in summ.items():
        for mode, c in modes.items():
            rows.append([case, mode, f"{_n(c['checkpoint_p50_s'], '.2f')} / {_n(c['checkpoint_p99_s'], '.2f')}",
                         _n(c["channel_state_records_per_checkpoint"]), _n(c["channel_state_mb_per_checkpoint"], ".2f"),
                         _n(c.get("max_alignment_p50_s"), ".2f"), _n(c["records_per_s"]),
                         f"{_n(c['throughput_vs_aligned'], '.2f')} ("
                         + ", ".join(_n(x, ".2f") for x in _paired(doc["runs"], "records_per_s", {"case": case, "mode": mode},
                                                                   {"case": case, "mode": "aligned"})) + ")",
                         f"{_n(c['latency_p50_s'], '.2f')} / {_n(c['latency_p99_s'], '.2f')}"])
    costs = ", ".join(f"{k}: {v['records']:,} records" for k, v in cases.items())
    g = doc.get("goal")
    verdict = ("" if not g else
               f" Goal ({g['case']}, {g['interval_s']:g} s interval: checkpoint p99 < {g['p99_below_s']:g} s and "
               f"throughput ≥ {g['throughput_vs_aligned_at_least']:.0%} of aligned) met by: "
               f"{', '.join(f'`{m}`' for m, x in g['modes'].items() if x['met']) or 'no mode'}.")
    return (f"### Checkpoints under back-pressure\n\n`GeneratorSource → key_by → reduce → map → rebalance → FileSink`, "
            f"parallelism 2, exactly-once, checkpoint interval {cfg['interval']} s, runtime `local`, unthrottled "
            f"source; the map busy-waits 0.2 or 1 ms per record, or the sink is slowed to a tenth of the job's "
            f"unslowed rate ({costs}; sink cost {doc['calibration']['sink_cost_s'] * 1e6:.0f} µs/record). "
            f"Throughput = records / (last − first arrival at the sink); latency = produced → visible in the "
            f"committed output; *align p50*: median over epochs of the longest alignment of any task (for a "
            f"timed-out epoch: first barrier → switch to unaligned) ({_command(doc)}).{verdict}\n\n"
            + _table(["case", "mode", "checkpoint p50 / p99 s", "channel state records / ckpt", "MB / ckpt",
                      "align p50 s", "records/s", "vs aligned (per repetition)", "latency p50 / p99 s"], rows))


def section_serde(doc: dict) -> str:
    summ = doc["summary"]
    base = summ.get("tuple / pickle", {})
    floor = (base.get("encode_ns_per_record") or 0) + (base.get("decode_ns_per_record") or 0)
    rows = [[v, _n(c["encode_ns_per_record"]), _n(c["decode_ns_per_record"]), _n(c["bytes_per_record"], ".1f"),
             _n((c["encode_ns_per_record"] + c["decode_ns_per_record"]) / floor if floor else None, ".1f")]
            for v, c in summ.items()]
    cfg = doc["config"]
    return (f"### Records of classes from `__main__`\n\n"
            f"`epochal.serde` on batches of "
            f"{doc.get('batch_records', 512)} records `(id, text)`, in one process: encode and decode ns per record, "
            f"median of {cfg['repetitions']} interleaved repetitions of {cfg['batches']} batches "
            f"({_command(doc)}). The `__main__` dataclass is shipped by value as a task process sees a class of "
            f"the user's script: plain pickle fails on the batch, then the C pickler runs again with a "
            f"`reducer_override` that writes the class itself by value (one cached cloudpickle payload per class) "
            f"and its instances as usual. The end-to-end effect on a channel is the `__main__ class` row of the "
            f"data-plane table.\n\n"
            + _table(["records / path", "encode ns", "decode ns", "bytes / record", "× tuple / pickle"], rows))


def section_cluster(doc: dict) -> str:
    summ, cfg = doc["summary"], doc["config"]
    rows = []
    for v, c in summ.items():
        if not c["runs_ok"]:
            continue
        rows.append([v, _n(c["steady_records_per_s"]["median"]), _n(c["ratio_to_local"], ".2f"),
                     f"{_ms(c['checkpoint_p50_s'])} / {_ms(c['checkpoint_p99_s'])}",
                     _n(c["restart_s"]["median"], ".2f") if c["restart_s"]["median"] is not None else "–",
                     ", ".join(c["hosts"]), str(c["runs_ok"])])
    paired = {f"{a} / {b}": _paired(doc["runs"], "steady_records_per_s", {"variant": a}, {"variant": b})
              for a, b in (("cluster", "local"), ("cluster-plain", "local"), ("cluster", "cluster-plain"))}
    parts = [r["restart_parts_s"] for r in doc["runs"] if "restart_parts_s" in r]
    restart = "; ".join(" + ".join(_n(p[k], ".2f") for k in ("detect_to_stopped", "stopped_to_launched",
                                                                "launched_to_running")) for p in parts)
    return (f"### On a two-host Spark cluster\n\nTwo-shuffle keyed word count of {cfg['lines']:,} lines, parallelism "
            f"{cfg['parallelism']}, exactly-once, 1 s checkpoints; embedded local Spark vs {doc.get('setup', '')}. "
            f"Steady rate = output records / (last − first record at the sink), median of {cfg['repetitions']} "
            f"interleaved repetition(s); per repetition: "
            f"{'; '.join(f'{k} ' + ', '.join(_n(x, '.2f') for x in xs) for k, xs in paired.items() if xs)}. "
            f"Restart = failure seen → every task of the next running attempt, after SIGKILLing every process of "
            f"worker host 2 once the first checkpoint completed"
            + (f" (stop + launch + run, s: {restart})" if restart else "") + f" ({_command(doc)}):\n\n"
            + _table(["variant", "steady records/s", "vs local", "checkpoint p50 / p99 ms", "restart s", "hosts",
                      "runs"], rows))


def section_tables(doc: dict) -> str:
    cfg = doc["config"]
    rows = []
    for name, s in doc["sinks"].items():
        sink, shape = name.split("/")
        runs = [r for r in doc["runs"] if r["sink"] == sink and r["shape"] == shape and not r.get("error")]
        rows.append([sink, shape, _n(s["rows_per_s"]["median"]), _n(s["vs_filesink_median"], ".2f"),
                     ", ".join(_n(x, ".2f") for x in s["vs_filesink_per_repetition"]),
                     _ms(_median([r["checkpoint_s_p50"] for r in runs if r.get("checkpoint_s_p50")])),
                     str(len(runs))])
    loads = [r["loadavg_before"][0] for r in doc["runs"] if r.get("loadavg_before")]
    return (f"### Table sinks: Delta Lake and Iceberg vs FileSink\n\n"
            f"Rows `{{id, key, value, payload}}` from an unthrottled source through a map that stamps each row "
            f"as it reaches the sink, parallelism {cfg['parallelism']}, exactly-once, {cfg['interval']:g} s "
            f"checkpoints, runtime `{cfg['runtime']}`: {cfg['rows']:,} dict rows (records) or "
            f"{cfg['columnar_rows']:,} rows in 8,192-row Arrow batches (columnar). Steady rate = (rows − 1) / "
            f"(last − first stamp) over the rows read back from the committed output with each system's own reader "
            f"(every row exactly once in every run); median of {cfg['repetitions']} interleaved repetitions, ratio "
            f"to FileSink per repetition (same invocation; load average before the runs "
            f"{min(loads, default=0):.1f}–{max(loads, default=0):.1f}; {_command(doc)}):\n\n"
            + _table(["sink", "shape", "rows/s", "vs FileSink", "per repetition", "checkpoint p50 ms", "runs"], rows))


def _median(values: list) -> float | None:
    values = sorted(v for v in values if v is not None)
    return values[len(values) // 2] if values else None


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split()).replace("`", "'")
    return text if len(text) <= limit else text[: limit - 1] + "…"


SECTIONS = {"backpressure": section_backpressure, "cluster": section_cluster, "serde": section_serde,
            "throughput": section_throughput, "latency": section_latency, "chain": section_chain,
            "peers": section_peers, "window": section_window, "event_windows": section_event_windows,
            "dataplane": section_dataplane,
            "state": section_state, "state_stress": section_state, "chain_intervals": section_chain,
            "loops": section_loops, "alignment": section_alignment,
            "recovery": section_recovery, "tables": section_tables}


def render_section(docs: dict[str, dict]) -> str:
    """The "## Results" markdown for whichever benchmark documents are present."""
    parts = ["## Results", "",
             ("_Generated by `python benchmarks/report.py` from `benchmarks/results/*.json`; "
              "regenerate with `epochal bench all`._")]
    machines = []
    for name in BENCHMARKS:
        if name not in docs:
            continue
        try:
            parts += ["", SECTIONS[name](docs[name])]
        except (KeyError, TypeError) as exc:  # an older schema: say so instead of failing the report
            parts += ["", f"### {name}\n\n(`{name}.json` has an unexpected layout: {exc!r})"]
        m = docs[name].get("machine", {})
        if m:
            machines.append(f"- `{name}`: {describe_machine(m)}; {docs[name].get('started_at', '')}")
    if machines:
        parts += ["", ("Machines (all benchmarks ran on this shared machine; other tenants' load shows in the "
                       "load averages, so read ratios within one invocation, not across):"), "", *machines]
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------- plots
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_chain(doc: dict, path: Path) -> Path:
    plt = _pyplot()
    layouts = sorted({r["layout"] for r in doc["summary"]})
    fig, axes = plt.subplots(1, len(layouts), figsize=(5.5 * len(layouts), 4), squeeze=False, sharey=True)
    for ax, layout in zip(axes[0], layouts):
        for n_ops in sorted({r["n_ops"] for r in doc["summary"]}):
            for g, style in (("at-least-once", "--"), ("exactly-once", "-")):
                pts = sorted((r["interval_s"], r["steady_ratio"]) for r in doc["summary"]
                             if r["layout"] == layout and r["n_ops"] == n_ops and r["mode"] == g
                             and r["steady_ratio"] is not None)
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", label=f"N={n_ops} {g}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ticks = sorted({r["interval_s"] for r in doc["summary"] if r["interval_s"]})
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_title(f"{layout} chain")
        ax.set_xlabel("checkpoint interval (s)")
        ax.set_ylabel("throughput / no-checkpoint baseline")
        ax.legend(fontsize=7)
    fig.suptitle("Stateless chain of N maps (IBM Fig. 7(c) shape)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_throughput(doc: dict, path: Path) -> Path:
    plt = _pyplot()
    names = list(doc["modes"])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.38
    for k, (key, label) in enumerate((("ratio_to_baseline", "whole run"), ("steady_ratio_to_baseline", "steady"))):
        vals = [doc["modes"][n][key] or 0 for n in names]
        ax.bar([i + (k - 0.5) * width for i in range(len(names))], vals, width, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("throughput / no-checkpoint")
    ax.set_title("Word count: cost of checkpointing")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_latency(doc: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for g, style in (("exactly-once", "-"), ("at-least-once", "--")):
        pts = sorted((r["interval_s"], r["latency_s"]["p50"], r["latency_s"]["p99"]) for r in doc["runs"]
                     if r["guarantee"] == g and r["latency_s"]["p50"] is not None)
        if pts:
            x, p50, p99 = zip(*pts)
            ax.plot(x, p50, style, marker="o", label=f"{g} p50")
            ax.plot(x, p99, style, marker="^", label=f"{g} p99")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("checkpoint interval (s)")
    ax.set_ylabel("end-to-end latency (s)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_peers(doc: dict, path: Path) -> Path:
    plt = _pyplot()
    ok = [p for p in doc["peers"] if p.get("status") == "ok" and "words_per_s" not in p]  # continuous: not comparable
    fig, ax = plt.subplots(figsize=(7, 0.6 * max(3, len(ok)) + 1))
    names = [p["name"] for p in ok]
    ax.barh(names, [p.get("steady_lines_per_s") or 0 for p in ok], label="marginal (start-up excluded)")
    ax.barh(names, [p.get("large", {}).get("lines_per_s") or 0 for p in ok], height=0.35,
            label="whole run (start-up included)")
    ax.set_xlabel("lines/s (keyed word count, same input)")
    ax.invert_yaxis()
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_window(doc: dict, path: Path) -> Path:
    """Steady throughput / no-checkpoint, checkpoint duration and its synchronous part vs.
    window state size; every mode keeps its colour (``doc["modes"][m]["color"]``) in all panels."""
    plt = _pyplot()
    sizes = sorted(doc["summary"], key=float)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for k, (mode, spec) in enumerate(doc["modes"].items()):
        color = spec.get("color") or f"C{k}"
        rows = [(float(s), doc["summary"][s].get(mode)) for s in sizes]
        rows = [(x, r) for x, r in rows if r and r["ratio_to_baseline"] is not None]
        if not rows:
            continue
        xs = [x for x, _ in rows]
        ratio = [r["ratio_to_baseline"] for _, r in rows]
        err = [[y - (r["paired_ratios"]["min"] or y) for y, (_, r) in zip(ratio, rows)],
               [(r["paired_ratios"]["max"] or y) - y for y, (_, r) in zip(ratio, rows)]]
        axes[0].errorbar(xs, ratio, yerr=err, marker="o", color=color, capsize=3, label=mode)
        if not spec.get("checkpoints", True):
            continue
        for ax, key in ((axes[1], "checkpoint_duration_s"), (axes[2], "sync_s")):
            pts = [(x, r[key]["p50"], r[key]["p99"]) for x, r in rows if r[key]["p50"] is not None]
            if pts:
                px, p50, p99 = zip(*pts)
                ax.plot(px, p50, "-", marker="o", color=color, label=f"{mode} p50")
                ax.plot(px, p99, "--", marker="^", color=color, label=f"{mode} p99")
    titles = ("steady throughput / no-checkpoint", "checkpoint duration (s)", "synchronous part (task blocked, s)")
    for ax, title in zip(axes, titles):
        ax.set_title(title)
        ax.set_xlabel("window state (MB)")
        ax.set_xscale("log", base=2)
        ax.set_xticks([float(s) for s in sizes], sizes)
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].axhline(1.0, color="grey", lw=0.8)
    fig.suptitle(f"Sliding window, checkpoint every {doc['config']['interval']:g} s (IBM Fig. 7(b) shape)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_event_windows(doc: dict, path: Path) -> Path:
    """Steady events/s per engine (median, min–max) and fired → committed latency (p50, p99)."""
    plt = _pyplot()
    names = list(doc["summary"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.55 * max(3, len(names)) + 1.6))
    med = [doc["summary"][n]["steady_events_per_s"]["median"] or 0 for n in names]
    lo = [m - (doc["summary"][n]["steady_events_per_s"]["min"] or m) for n, m in zip(names, med)]
    hi = [(doc["summary"][n]["steady_events_per_s"]["max"] or m) - m for n, m in zip(names, med)]
    axes[0].barh(names, med, xerr=[lo, hi], capsize=3, color=[f"C{i}" for i in range(len(names))])
    axes[0].set_xlabel("steady events/s (median, min–max)")
    axes[0].xaxis.set_major_formatter(lambda x, _pos: f"{x / 1000:.0f}k")
    for i, n in enumerate(names):
        lat = doc["summary"][n].get("fired_to_committed") or {}
        if lat.get("p50") is not None:
            axes[1].barh(i, lat["p99"], color=f"C{i}", alpha=0.35, label="p99" if i == 0 else None)
            axes[1].barh(i, lat["p50"], color=f"C{i}", label="p50" if i == 0 else None)
    axes[1].set_yticks(range(len(names)), names)
    axes[1].set_xscale("log")
    axes[1].set_xlabel("window fired → result committed (s, log; p50 dark, p99 light)")
    for ax in axes:
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    cfg = doc["config"]
    fig.suptitle(f"Tumbling {cfg['window_s']} s event-time windows, {cfg['keys']:,} keys, same input on every engine")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_alignment(doc: dict, path: Path) -> Path:
    """Checkpoint duration and alignment (p50 / p99) vs parallelism; critical-task parts."""
    plt = _pyplot()
    cells = [c for c in doc["summary"] if c.get("runs_ok")]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for g, style in (("exactly-once", "-"), ("at-least-once", "--")):
        cs = sorted((c for c in cells if c["guarantee"] == g), key=lambda c: c["parallelism"])
        if not cs:
            continue
        ps = [c["parallelism"] for c in cs]
        for ax, key in ((axes[0], "checkpoint_s"), (axes[1], "alignment_task_s")):
            for q, marker in (("p50", "o"), ("p99", "^")):
                ax.plot(ps, [(c[key][q] or 0) * 1e3 for c in cs], style, marker=marker, label=f"{g} {q}")
    axes[0].axhline(doc.get("target_p99_s", 0.1) * 1e3, color="red", lw=0.8, label="p99 target")
    parts = ("barrier_s", "sync_s", "upload_wait_s", "upload_s", "rest_s")
    labels = [f"p{c['parallelism']} {'EO' if c['guarantee'] == 'exactly-once' else 'AL'}" for c in cells]
    bottom = [0.0] * len(cells)
    for part in parts:
        vals = [max(0.0, (c["critical_parts_p50_s"].get(part) or 0) * 1e3) for c in cells]
        axes[2].bar(range(len(cells)), vals, bottom=bottom, label=part[:-2])
        bottom = [b + v for b, v in zip(bottom, vals)]
    axes[2].set_xticks(range(len(cells)), labels, rotation=45, fontsize=8)
    titles = ("checkpoint duration (ms)", "alignment per task, >= 2 inputs (ms)",
              "last-acknowledged task: median parts (ms)")
    for ax, title in zip(axes, titles):
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ps = sorted({c["parallelism"] for c in cells})
    for ax in axes[:2]:
        ax.set_xlabel("parallelism (4 tasks each)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ps, [str(p) for p in ps])
        ax.minorticks_off()
        ax.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_dataplane(doc: dict, path: Path) -> Path:
    plt = _pyplot()
    summ = doc["summary"]
    names = [v for v in summ if summ[v]["records_per_s"]["median"]]
    med = [summ[v]["records_per_s"]["median"] for v in names]
    lo = [m - summ[v]["records_per_s"]["min"] for v, m in zip(names, med)]
    hi = [summ[v]["records_per_s"]["max"] - m for v, m in zip(names, med)]
    fig, (ax, cpu) = plt.subplots(1, 2, figsize=(12, 0.45 * max(4, len(names)) + 1.6), sharey=True,
                                  gridspec_kw={"width_ratios": [3, 2]})
    colors = ["tab:red" if v.startswith("epochal") else "tab:blue" for v in names]
    ax.barh(names, med, xerr=[lo, hi], color=colors, capsize=3)
    rb = doc["record_bytes"]
    for y, m in enumerate(med):
        ax.text(m * 1.1, y, f"{m:,.0f} rec/s, {m * rb / 1e6:,.0f} MB/s", va="center", fontsize=7)
    ax.set_xscale("log")
    ax.set_xlim(min(med) / 4, max(med) * 40)
    ax.set_xlabel(f"steady records/s (log; {rb}-byte records; median, min–max)")
    ax.set_title("epochal pass-through vs. raw loopback transports", fontsize=10)
    ax.invert_yaxis()
    ys = range(len(names))
    for k, (side, label) in enumerate((("producer", "sender / source task"), ("consumer", "receiver / sink task"))):
        vals = [summ[v].get(f"{side}_cpu_ns_per_record") or 0 for v in names]
        cpu.barh([y + (k - 0.5) * 0.38 for y in ys], vals, 0.38, label=label)
    cpu.set_xlabel("CPU ns per record, steady window (median)")
    cpu.set_title("where the CPU goes", fontsize=10)
    cpu.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_recovery(doc: dict, path: Path) -> Path:
    """Recovery time (stacked parts) and extra wall time vs state size, per backend."""
    plt = _pyplot()
    cells = [c for c in doc["summary"] if c.get("runs_ok")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    parts = ("stop_s", "restart_s", "launch_s", "restore_s")
    labels = [f"{c['size_mb']} MB\n{c['backend']}" for c in cells]
    bottom = [0.0] * len(cells)
    for part in parts:
        vals = [max(0.0, c["parts_p50_s"][part] or 0) for c in cells]
        axes[0].bar(range(len(cells)), vals, bottom=bottom, label=part[:-2])
        bottom = [b + v for b, v in zip(bottom, vals)]
    axes[0].set_xticks(range(len(cells)), labels, fontsize=8)
    axes[0].set_title("failure seen → next attempt running (s, median parts)")
    axes[0].legend(fontsize=7)
    for backend in sorted({c["backend"] for c in cells}):
        cs = sorted((c for c in cells if c["backend"] == backend), key=lambda c: c["size_mb"])
        axes[1].plot([c["size_mb"] for c in cs], [c["extra_s"]["median"] for c in cs], marker="o",
                     label=f"{backend}: extra wall")
        axes[1].plot([c["size_mb"] for c in cs], [c["recovery_s"]["median"] for c in cs], "--", marker="^",
                     label=f"{backend}: recovery")
    sizes = sorted({c["size_mb"] for c in cells})
    axes[1].set_xscale("log", base=2)
    axes[1].set_xticks(sizes, [str(x) for x in sizes])
    axes[1].minorticks_off()
    axes[1].axhline(0.0, color="grey", lw=0.8)
    axes[1].set_xlabel("keyed state (MB)")
    axes[1].set_ylabel("s")
    axes[1].set_title("crash run − golden run, and recovery (median)")
    axes[1].legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_backpressure(doc: dict, path: Path) -> Path:
    """Checkpoint p50 / p99 and throughput per case and mode."""
    plt = _pyplot()
    summ = doc["summary"]
    cases = list(summ)
    modes = list(dict.fromkeys(m for c in cases for m in summ[c]))
    fig, (ck, tp) = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / max(1, len(modes))
    for k, mode in enumerate(modes):
        xs = [i + (k - (len(modes) - 1) / 2) * width for i in range(len(cases))]
        p50 = [summ[c].get(mode, {}).get("checkpoint_p50_s") or 0 for c in cases]
        p99 = [summ[c].get(mode, {}).get("checkpoint_p99_s") or 0 for c in cases]
        ck.bar(xs, p99, width, alpha=0.35, color=f"C{k}")
        ck.bar(xs, p50, width, label=mode, color=f"C{k}")
        tp.bar(xs, [summ[c].get(mode, {}).get("throughput_vs_aligned") or 0 for c in cases], width, color=f"C{k}")
    for ax in (ck, tp):
        ax.set_xticks(range(len(cases)), cases)
    ck.set_ylabel("checkpoint duration s (p50, light: p99)")
    ck.set_yscale("log")
    ck.legend(fontsize=7)
    tp.set_ylabel("throughput / aligned")
    tp.axhline(1.0, color="grey", lw=0.5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_cluster(doc: dict, path: Path) -> Path:
    plt = _pyplot()
    summ = {v: c for v, c in doc["summary"].items() if c["runs_ok"]}
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.barh(list(summ), [c["steady_records_per_s"]["median"] for c in summ.values()])
    ax.set_xlabel("steady records/s at the sink (median)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


PLOTS = {"backpressure": plot_backpressure, "cluster": plot_cluster, "throughput": plot_throughput, "latency": plot_latency, "chain": plot_chain, "chain_intervals": plot_chain,
         "peers": plot_peers, "window": plot_window, "event_windows": plot_event_windows, "dataplane": plot_dataplane, "alignment": plot_alignment, "recovery": plot_recovery}


def load(results: Path) -> dict[str, dict]:
    docs = {}
    for name in BENCHMARKS:
        f = Path(results) / f"{name}.json"
        if f.exists():
            docs[name] = json.loads(f.read_text())
    return docs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS, help="directory with the *.json results")
    p.add_argument("--out", type=Path, default=None, help="where README_SECTION.md and PNGs go (default --results)")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    out = args.out or args.results
    out.mkdir(parents=True, exist_ok=True)
    docs = load(args.results)
    if not docs:
        print(f"no results in {args.results}", file=sys.stderr)
        return 1
    if not args.no_plots:
        for name, doc in ((n, d) for n, d in docs.items() if n in PLOTS):  # serde: a table only
            try:
                print(f"wrote {PLOTS[name](doc, out / f'{name}.png')}")
            except ImportError as exc:
                print(f"no plots: {exc} (pip install 'epochal[bench]')", file=sys.stderr)
                break
            except (KeyError, TypeError, ValueError) as exc:
                print(f"{name}.png: skipped ({exc!r})", file=sys.stderr)
    section = out / "README_SECTION.md"
    section.write_text(render_section(docs))
    print(f"wrote {section}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
