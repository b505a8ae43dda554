"""The README's "Results" tables that compare epochal with the engines users would pick
instead: the same word count on other engines (``peers.json``: capacity on a backlog, and
steady rates at 1 s triggers) and event-time windows (``event_windows.json``). Shaped like
:mod:`report_sections` (a title, what was measured and how, one table).
"""
from __future__ import annotations

from pathlib import Path

from report_sections import _command, _ms, _n, _one_line, _section


def section_capacity(cap: dict) -> str:
    """Every engine working off the same backlog of files (``peers_capacity.py``)."""
    rows = []
    for e in cap["engines"]:
        if e.get("status") != "ok":
            rows.append([e["name"], e.get("guarantee_short", "–"), e.get("status", "–"), "–", "–", "–", "–"])
            continue
        reps = [r["marginal_words_per_s"] for r in e.get("repetitions", []) if r.get("marginal_words_per_s")]
        raw = cap["ratios"].get("vs_spark_builtin_raw", {}).get(e["name"], [])
        rows.append([e["name"], e.get("guarantee_short", "–"),
                     _n(e.get("marginal_words_per_s")) + (f" ({_n(min(reps))}–{_n(max(reps))})" if len(reps) > 1
                                                          else ""),
                     _n(e.get("words_per_cpu_s")), _n(e.get("whole_words_per_s")),
                     _n(cap["ratios"]["vs_spark_builtin"].get(e["name"]), ".2f") + (
                         f" ({_n(min(raw), '.2f')}–{_n(max(raw), '.2f')})" if len(raw) > 1 else ""),
                     "yes" if e.get("counts_verified") else "no"])
    inp, frac = cap["input"], cap["ratios"].get("columnar_fraction_of_ceiling", {})
    fraction = _n(frac.get("fraction"), ".2f") + (
        f" ({_n(min(frac['fraction_raw']), '.2f')}–{_n(max(frac['fraction_raw']), '.2f')})"
        if len(frac.get("fraction_raw", [])) > 1 else "")
    reps = cap.get("repetitions", 1)
    loads = [e.get("loadavg_1m_before") for e in cap["engines"] if e.get("loadavg_1m_before") is not None]
    text = (f"Capacity on a backlog: {inp['files']} files of Zipf text ({inp['vocabulary']:,}-word vocabulary, "
            f"{sum(inp['words_per_file']):,} words, {inp['bytes'] / 1e9:.2f} GB) that all exist before the run; "
            "each engine first warms up on a few files, then reads a small and a large prefix of the directory; "
            "*marginal* words/s = (words_large − words_small) / (T_large − T_small), so start-up cancels; "
            "*per CPU-s*: words / CPU seconds of the engine's processes; \"counts ok\": the output equals a "
            "plain-Python count. Spark reads `maxFilesPerTrigger` files per micro-batch with "
            "`trigger(availableNow=True)`. The Arrow ceiling is one process on one core (read, split, "
            "`group_by`; no engine): epochal columnar reaches "
            f"{fraction} of it × {frac.get('cores', 2)} cores. "
            + (f"{reps} repetitions, interleaved in rotated order: the figures are the median repetition's, in "
               "brackets the range; ratios are per repetition (engines of one repetition ran side by side), "
               "median and range. " if reps > 1 else "")
            + f"(Load average before the runs "
            f"{min(loads, default=0):.1f}–{max(loads, default=0):.1f}).")
    return _section("The same word count on other engines: capacity", text,
                    ["engine", "fault tolerance", "marginal words/s", "words / CPU-s", "whole words/s",
                     "vs Spark SS built-in", "counts ok"], rows)


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
    text = _section(
        "The same word count on other engines: steady rates at 1 s triggers",
        f"Keyed word count (count per word) of the same generated lines "
        f"(`tests/pipelines.py` `line(split, i)`, {cfg['splits']} splits), parallelism {cfg['parallelism']}, "
        f"checkpoint / trigger interval 1 s, one machine, one invocation ({_command(doc)}). A rate-limited "
        f"source at 1 s triggers measures what each engine does with an offered load and its per-batch "
        f"overhead, not its capacity (the table above). "
        f"*Marginal* lines/s = ({cfg['large_lines']:,} − {cfg['small_lines']:,}) lines / (T_large − T_small): "
        f"engine start-up cancels. *Whole* = {cfg['large_lines']:,} lines / T_large, start-up included. "
        f"\"counts ok\": the emitted counts equal a plain-Python count. epochal, PyFlink and Bytewax write one "
        f"running count per input word to a file sink; Structured Streaming (update mode) writes one row per "
        f"word changed in a micro-batch to the memory sink, so it writes far less. Settings and exactly-once "
        f"caveats of every engine are in `peers.json`. *Steady words/s*: the engine's own throughput "
        f"samples (epochal: the sources' lines/s in its progress events; Structured Streaming: "
        f"processedRowsPerSecond per micro-batch), median without the first and last, × 3.5 words per line; "
        f"the epochal engines read {cfg.get('epochal_scale', 1)}× (records) and {cfg.get('columnar_scale', 1)}× "
        f"(columnar) as many lines (the same generator), for a steady state long enough to sample.",
        ["engine / mode", "fault tolerance", "steady words/s", "marginal lines/s", "whole lines/s",
         "T_large s", "fixed cost s", "counts ok"], rows)
    merges = doc.get("merges", [])
    last_capacity = max((i for i, m in enumerate(merges) if m.get("capacity_engines")), default=None)
    for k, m in enumerate(merges):  # a later capacity re-run replaces the table: only the last one made it
        command = " ".join(Path(c).name if i == 0 else c for i, c in enumerate(m["command"]))
        parts = [f"steady runs of {', '.join(m['engines'])}" if m.get("engines") else "",
                 f"the capacity table ({', '.join(m['capacity_engines'])})" if k == last_capacity else ""]
        if any(parts):
            text += (f"\n\nRe-run separately and merged into the JSON ({m.get('started_at', '')}): "
                     f"{' and '.join(p for p in parts if p)} (`{command}`).")
    if stateless:
        text += ("\n\nSpark continuous mode (no aggregation possible: the stateless half only, not comparable):"
                 "\n\n" + "\n".join(stateless))
    if failed:
        text += "\n\nDid not run:\n\n" + "\n".join(failed)
    if doc.get("capacity"):  # the capacity table first: what a user choosing an engine would measure
        return section_capacity(doc["capacity"]) + "\n\n" + text
    return text




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
    spark = {name: doc["summary"].get(name, {}).get("watermark_to_committed")
             for name in ("spark-ss", "spark-ss-250ms")}
    text = _section(
        "Event-time windows against other engines",
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
        f"engine, and every engine's settings, are in `event_windows.json` (`settings`).",
        ["engine / mode", "fault tolerance", "steady events/s", "/ no-ckpt", "/ epochal EO",
         "p50 / p99 ms", "fired → committed s", "fired → visible s", "correct"], rows)
    loads = [r["loadavg_1m_before"] for r in doc["runs"] if r.get("loadavg_1m_before") is not None]
    if loads:
        text += (f"\n\nLoad average (1 min) before the runs: {min(loads):.1f}–{max(loads):.1f} on "
                 f"{doc['machine'].get('cpu_count')} cores — other tenants' work shares the machine, so single runs "
                 f"vary widely; read the ranges.")
    closable = [f"`{name}` p50 {_n(w['p50'], '.2f')} s, p99 {_n(w['p99'], '.2f')} s" for name, w in spark.items() if w]
    if closable:
        text += (f"\n\nSpark emits a window in the micro-batch after the one that moved its watermark past the "
                 f"window's end; from the end of that earlier micro-batch to the commit: {'; '.join(closable)}.")
    for name in ("epochal-columnar", "epochal-columnar-250ms"):
        versus = doc["summary"].get(name, {}).get("against_spark_ss")
        if not versus:
            continue
        parts, peer = [], versus.get("latency_peer", "spark-ss")
        for key, label in (("steady_events_per_s_ratio", "steady events/s / `spark-ss-backlog`'s (capacity)"),
                           ("steady_events_per_s_ratio_to_1s_triggers",
                            "/ `spark-ss`'s (its offered 100k events/s, not its capacity)"),
                           ("closable_to_committed_p99_ratio",
                            "p99 from when the window could be emitted to its commit (fired → committed / "
                            f"`{peer}`'s watermark → committed)"),
                           ("fired_to_committed_p99_ratio", f"fired → committed p99 / `{peer}`'s")):
            r = versus.get(key, {"raw": []})
            if r["raw"]:
                parts.append(f"{label} {_n(r['median'], '.2f')}× ({_n(r['min'], '.2f')}–{_n(r['max'], '.2f')})")
        if parts:
            text += (f"\n\n`{name}` against Spark, per repetition (median, min–max): " + "; ".join(parts)
                     + " — latency ratios below 1: epochal commits sooner.")
    if doc.get("errors"):
        text += "\n\nErrors:\n\n" + "\n".join(f"- `{_one_line(e)}`" for e in doc["errors"])
    return text


