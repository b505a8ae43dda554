"""The README's "Results" tables, one function per benchmark: ``section_<name>(doc)`` turns
``benchmarks/results/<name>.json`` into a markdown section — a title, what was measured and
how (with the command that produced it), and one table (:func:`_section`).
:mod:`report` picks them by name (``report.SECTIONS``).
"""
from __future__ import annotations

from pathlib import Path


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


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split()).replace("`", "'")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _median(values: list) -> float | None:
    values = sorted(values)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def _section(title: str, text: str, header: list[str], rows: list[list[str]]) -> str:
    """The shape every benchmark's section has: ``### title``, what was measured and how
    (``text``), then the table."""
    return f"### {title}\n\n{text}\n\n" + _table(header, rows)


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
    return _section(
        "Throughput: the cost of checkpointing",
        f"Two-shuffle keyed word count, parallelism {cfg['parallelism']}, {cfg['records']:,} lines, "
        f"runtime `{cfg['runtime']}`, median of {cfg['repetitions']} interleaved repetitions "
        f"({_command(doc)}):",
        ["mode", "interval s", "lines/s", "ratio", "steady lines/s", "ratio", "steady CPU ratio",
         "checkpoint p50 / p99 ms"], rows)


def section_latency(doc: dict) -> str:
    ms = lambda v: _n(1e3 * v, ".1f") if v is not None else "–"  # noqa: E731
    groups: dict = {}
    for r in doc["runs"]:
        groups.setdefault((r["sink"], r["rate"], r["interval_s"], r["max_concurrent"]), []).append(r)
    rows = []
    for (sink, rate, interval, conc), rs in sorted(groups.items()):
        med = lambda f: _median([f(r) for r in rs if f(r) is not None])  # noqa: E731
        parts = [med(lambda r, k=k: r["parts_s"][k]["p50"]) for k in ("wait_s", "checkpoint_s", "visible_s")]
        rows.append([sink, _n(rate), f"{interval:g}", str(conc),
                     *(ms(med(lambda r, q=q: r["latency_s"][q])) for q in ("p50", "p99", "p999")),
                     " / ".join(ms(p) for p in parts), ms(med(lambda r: r["per_epoch_p50_s"]["duration_s"])),
                     _n(med(lambda r: r["throughput"])), _n(med(lambda r: r["throughput_vs_reference"]), ".2f"),
                     _n(med(lambda r: r["loadavg"]), ".1f")])
    cfg = doc.get("config", {})
    return _section(
        "End-to-end latency",
        "Record produced → visible to a read-committed reader polling every "
        f"{_n(1e3 * cfg.get('poll', 0.002), '.0f')} ms, exactly-once, `GeneratorSource` (2 splits, rate-limited) → "
        "`key_by` → `reduce` → FileSink (jsonl) or LogSink, parallelism 2, runtime "
        f"`{cfg.get('runtime')}`; median over repetitions of each run's percentiles. *wait / checkpoint / visible*: "
        "p50 of production → the record's epoch triggered, trigger → `_metadata` written, → seen by the reader; "
        "*rec/s*: records / production span, and its ratio to the 1 s-interval run of the same sink and rate "
        f"({_command(doc)}):",
        ["sink", "rate", "interval s", "max conc.", "p50 ms", "p99 ms", "p999 ms", "wait / checkpoint / visible ms",
         "ckpt p50 ms", "rec/s", "vs 1 s", "load"], rows)


def section_coldstart(doc: dict) -> str:
    rows = []
    for mode in doc["modes"]:
        cold = [c for c in doc["cold"] if c["mode"] == mode]
        med = lambda k: _median([c["runs"][0][k] for c in cold if c["runs"][0].get(k) is not None])  # noqa: E731
        ex = doc["summary"][mode]["example_s"]["median"]
        rows.append([mode, str(len(cold)), _n(_median([c["import_s"] for c in cold]), ".2f"),
                     _n(med("launched_s"), ".2f"), _n(med("connected_s"), ".2f"), _n(med("first_complete_s"), ".2f"),
                     _n(med("first_visible_s"), ".2f"), _n(_median([c["exit_s"] for c in cold]), ".2f"),
                     _n(ex, ".1f"), _n(_median([c["loadavg"] for c in cold]), ".1f")])
    warm = doc.get("warm") or {}
    later = [r["first_visible_s"] - r["start_s"] for r in warm.get("runs", [])[1:]]
    return _section(
        "Cold start",
        "A fresh Python process runs a 1,000-record exactly-once job (collection → map → key_by → reduce → "
        "jsonl FileSink, parallelism 2) on embedded Spark; seconds from spawning the process to: `import epochal` "
        "done, the barrier stage launched (session up), every task connected (Python workers started), the first "
        "epoch completed, the first committed record seen by a reader, the process gone. *example*: "
        "`examples/wordcount.py` whole. Modes interleaved: `now` (the JVM class archive made beforehand, as every "
        "run after a machine's first finds it), `no-archive` (a machine's first run), `base` (the tree before "
        f"the fast start). A later `run()` in the same process: first record after {_n(_median(later), '.2f')} s "
        f"({_command(doc)}):",
        ["mode", "runs", "import s", "launched s", "connected s", "first commit s", "first record s", "exit s",
         "example s", "load"], rows)


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
    return _section(
        title,
        f"Source → N pass-through maps → jsonl sink, parallelism 1; `chained` fuses everything into one "
        f"task, `unchained` puts a channel between every pair of operators. Steady throughput (records "
        f"between the 5 % and 95 % in-pipeline timestamps / time) normalised to the no-checkpoint baseline "
        f"of the same block; AL = at-least-once, EO = exactly-once; median of "
        f"{doc['config'].get('repetitions', 1)} run(s) per cell ({_command(doc)}):",
        header, rows)


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
    return _section(
        "Large-state sliding window (IBM Fig. 7(b) shape)",
        f"Source → {cfg['maps']} maps → keyed sliding window ({cfg['keys']} keys, MapState ring buffer of "
        f"{cfg['payload_bytes']} B incompressible records, parallelism {cfg['parallelism']}) → jsonl sink, "
        f"checkpoint interval {cfg['interval']:g} s, runtime `{cfg['runtime']}`. Every window is filled first; "
        f"the steady rate counts only the {cfg['post_records']:,} records after the fill, normalised to the "
        f"no-checkpoint run of the same size and repetition (median of {cfg['repetitions']} paired ratios, "
        f"min–max shown). Checkpoint and sync (task blocked) times are over the checkpoints triggered after the "
        f"fill. `rocksdb-incr`'s ratio also contains RocksDB's per-access cost (the baseline keeps the window on "
        f"the heap). For reference, IBM Streams lost 4 % (8 MB) to 40 % (512 MB) with blocking checkpoints and kept "
        f"94 % at 512 MB with non-blocking ones ({_command(doc)}):",
        ["MB", "mode", "steady rec/s", "ratio", "min–max", "ckpts", "checkpoint p50 / p99 ms",
         "sync p50 / p99 ms", "MB / ckpt"], rows)

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
    return _section(
        "The data plane against its ceiling",
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
           if same_run else ""),
        ["variant", "steady rec/s", "min – max", "payload MB/s", "send CPU ns/rec", "recv CPU ns/rec"]
        + [f"{e} / this" for e in epochal], rows)


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
    return _section(
        f"State backends at scale, checkpoint every {cfg['interval']:g} s",
        f"Keyed job, {cfg['value_bytes']} B incompressible values, load then {cfg['updates']:,} updates of a "
        f"hot 1 % of the keys, parallelism {cfg['parallelism']}, checkpoint interval {cfg['interval']:g} s, "
        f"runtime `{cfg['runtime']}`, {cfg['repetitions']} repetition(s). Steady ratio = update-phase "
        f"records/s over the no-checkpoint run of the same size and repetition (median); upload and state "
        f"MB per periodic checkpoint; recovery = restoring the keyed state of the last checkpoint "
        f"({_command(doc)}):",
        ["MB", "mode", "steady rec/s", "steady ratio", "run ratio", "checkpoint p50 / p99 ms",
         "sync ms", "uploaded MB", "state MB", "recovery s"], rows)


def section_loops(doc: dict) -> str:
    cfg, rows = doc["config"], []
    for r in doc["runs"]:
        d = r["checkpoint_duration_s"]
        rows.append([_n(r["in_flight"]), _n(r["iterations_per_s"]), str(r["completed_epochs"]),
                     f"{_ms(d['median'])} / {_ms(d['max'])}"])
    return _section(
        "Checkpointed loops",
        f"An iterative job with a fixed number of records circulating in a loop, {cfg['guarantee']}, "
        f"checkpoint interval {cfg['interval']} s, parallelism {cfg['parallelism']}, runtime "
        f"`{cfg['runtime']}`; the loop head logs the records in transit on the back-edge for every epoch "
        f"({_command(doc)}):",
        ["records in flight", "iterations/s", "epochs", "checkpoint median / max ms"], rows)
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
    return _section(
        "Alignment and checkpoint duration vs parallelism",
        f"Two-shuffle keyed word count (small state), {rate}, checkpoint every {cfg['interval']:g} s, "
        f"runtime `{cfg['runtime']}`, {cfg['repetitions']} interleaved repetition(s) of {cfg['lines']:,} lines "
        f"per cell ({_command(doc)}). p50 / p99 in ms, nearest rank over all periodic epochs; "
        f"*align/task*: per task with ≥ 2 inputs (first → last barrier); *align/epoch* and *sync*: the "
        f"maximum over an epoch's tasks; *sink sync*: the `out` tasks' sync part, i.e. the FileSink "
        f"seal of its transaction (its flush and fsync run afterwards on the uploader, inside *upload*); *last ack*: the operator whose task is acknowledged last, and the "
        f"median parts of its acknowledgement time (barrier delay incl. alignment + sync + wait for the "
        f"uploader + upload, i.e. write and fsync of the state file + rest: ack transit and coordinator). "
        f"The machine has {(doc.get('machine') or {}).get('cpu_count')} cores "
        f"(load {_n(load[0], '.1f')} at start): parallelism p runs 4p task processes.",
        ["p", "guarantee", "tasks", "lines/s", "checkpoint", "align/task", "align/epoch", "sync",
         "sink sync", f"p99 < {_ms(doc.get('target_p99_s', 0.1))} ms", "last ack",
         "barrier + sync + wait + upload + rest"], rows)


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
    return _section(
        "Recovery time after a crash",
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
        f"of every crash run equals its golden run's as a multiset.",
        ["state MB", "backend", "restored MB", "recovery s", "stop + restart + launch + restore s",
         "slowest task restore s", "golden run s", "extra wall s", "output equal"], rows)


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
    return _section(
        "Checkpoints under back-pressure",
        f"`GeneratorSource → key_by → reduce → map → rebalance → FileSink`, "
        f"parallelism 2, exactly-once, checkpoint interval {cfg['interval']} s, runtime `local`, unthrottled "
        f"source; the map busy-waits 0.2 or 1 ms per record, or the sink is slowed to a tenth of the job's "
        f"unslowed rate ({costs}; sink cost {doc['calibration']['sink_cost_s'] * 1e6:.0f} µs/record). "
        f"Throughput = records / (last − first arrival at the sink); latency = produced → visible in the "
        f"committed output; *align p50*: median over epochs of the longest alignment of any task (for a "
        f"timed-out epoch: first barrier → switch to unaligned) ({_command(doc)}).{verdict}",
        ["case", "mode", "checkpoint p50 / p99 s", "channel state records / ckpt", "MB / ckpt",
         "align p50 s", "records/s", "vs aligned (per repetition)", "latency p50 / p99 s"], rows)


def section_serde(doc: dict) -> str:
    summ = doc["summary"]
    base = summ.get("tuple / pickle", {})
    floor = (base.get("encode_ns_per_record") or 0) + (base.get("decode_ns_per_record") or 0)
    rows = [[v, _n(c["encode_ns_per_record"]), _n(c["decode_ns_per_record"]), _n(c["bytes_per_record"], ".1f"),
             _n((c["encode_ns_per_record"] + c["decode_ns_per_record"]) / floor if floor else None, ".1f")]
            for v, c in summ.items()]
    cfg = doc["config"]
    return _section(
        "Records of classes from `__main__`",
        f"`epochal.serde` on batches of "
        f"{doc.get('batch_records', 512)} records `(id, text)`, in one process: encode and decode ns per record, "
        f"median of {cfg['repetitions']} interleaved repetitions of {cfg['batches']} batches "
        f"({_command(doc)}). The `__main__` dataclass is shipped by value as a task process sees a class of "
        f"the user's script: plain pickle fails on the batch, then the C pickler runs again with a "
        f"`reducer_override` that writes the class itself by value (one cached cloudpickle payload per class) "
        f"and its instances as usual. The end-to-end effect on a channel is the `__main__ class` row of the "
        f"data-plane table.",
        ["records / path", "encode ns", "decode ns", "bytes / record", "× tuple / pickle"], rows)


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
    return _section(
        "On a two-host Spark cluster",
        f"Two-shuffle keyed word count of {cfg['lines']:,} lines, parallelism "
        f"{cfg['parallelism']}, exactly-once, 1 s checkpoints; embedded local Spark vs {doc.get('setup', '')}. "
        f"Steady rate = output records / (last − first record at the sink), median of {cfg['repetitions']} "
        f"interleaved repetition(s); per repetition: "
        f"{'; '.join(f'{k} ' + ', '.join(_n(x, '.2f') for x in xs) for k, xs in paired.items() if xs)}. "
        f"Restart = failure seen → every task of the next running attempt, after SIGKILLing every process of "
        f"worker host 2 once the first checkpoint completed"
        + (f" (stop + launch + run, s: {restart})" if restart else "") + f" ({_command(doc)}):",
        ["variant", "steady records/s", "vs local", "checkpoint p50 / p99 ms", "restart s", "hosts",
         "runs"], rows)


def section_soak(doc: dict) -> str:
    def kb(v):
        return "–" if v is None else f"{v / 1024:.3f}"

    def mb(v):
        return "–" if v is None else f"{v / 2**20:.0f}"

    rows = []
    for r in doc["runs"]:
        g = r["growth"]["rss"]
        start, end = r.get("rss_after_warmup", {}), r.get("rss_at_end", {})
        rows.append([r["runtime"], _n(r["epochs"]), _n(r["wall_s"] / 60, ".1f"), _n(r["epochs_per_s"], ".1f"),
                     _n(r["warmup_epochs"]), kb(g["driver_bytes_per_epoch"]), kb(g["tasks_bytes_per_epoch"]),
                     kb(g["total_bytes_per_epoch"]), kb(g["jvm_bytes_per_epoch"]),
                     f"{mb(start.get('driver'))} → {mb(end.get('driver'))}", f"{mb(start.get('tasks'))} → {mb(end.get('tasks'))}",
                     "yes" if r["growth"]["goal_met"] else "no", str(r["restarts"])])
    cfg = doc["config"]
    return _section(
        "Soak: memory per epoch",
        f"An unbounded keyed job (generator → key_by → reduce → FileSink, exactly-once, parallelism "
        f"{cfg['parallelism']}, {cfg['rate']:g} records/s per split) with {cfg['interval'] * 1000:g} ms checkpoints "
        f"and {cfg['metrics']:g} s progress events, at least {cfg['minutes']:g} min and {cfg['epochs']:,} epochs per "
        f"runtime; RSS of the driver process and of every task process sampled every {cfg['sample']:g} s from "
        f"/proc; growth = least-squares slope of RSS against the completed epoch after the warm-up epochs "
        f"(driver: the Python process; tasks: summed over the task processes; the Spark driver's JVM apart). "
        f"Goal: at most {doc['runs'][0]['growth']['goal_bytes_per_epoch'] / 1024:g} KB per epoch for driver + "
        f"tasks ({_command(doc)}):",
        ["runtime", "epochs", "min", "epochs/s", "warm-up", "driver KB/epoch", "tasks KB/epoch", "total KB/epoch",
         "JVM KB/epoch", "driver RSS MB", "tasks RSS MB", "goal met", "restarts"], rows)
