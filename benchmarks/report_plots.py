"""The benchmarks' plots, one function per benchmark: ``plot_<name>(doc, path)`` draws
``benchmarks/results/<name>.json`` into ``path`` (PNG) and returns it. :mod:`report` picks
them by name (``report.PLOTS``). Needs matplotlib (``pip install 'epochal[bench]'``),
imported on the first plot.
"""
from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


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
    return _save(plt, fig, path)


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
    return _save(plt, fig, path)


def plot_latency(doc: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    lines: dict = {}
    for r in doc["runs"]:
        if r["latency_s"]["p99"] is not None and r["interval_s"] < 1.0:
            lines.setdefault((r["sink"], r["rate"], r["max_concurrent"]), []).append(
                (r["interval_s"], r["latency_s"]["p50"], r["latency_s"]["p99"]))
    for (sink, rate, conc), pts in sorted(lines.items()):
        pts.sort()
        x, p50, p99 = zip(*pts)
        label = f"{sink} {rate / 1000:g}k/s conc {conc}"
        ax.plot(x, [1e3 * v for v in p99], marker="^", label=f"{label} p99")
        ax.plot(x, [1e3 * v for v in p50], "--", marker="o", label=f"{label} p50")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (s)")
    ax.set_ylabel("produced → visible (ms)")
    ax.legend(fontsize=6)
    return _save(plt, fig, path)


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
    return _save(plt, fig, path)


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
    return _save(plt, fig, path)


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
    return _save(plt, fig, path)


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
    return _save(plt, fig, path)


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
    return _save(plt, fig, path)


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
    return _save(plt, fig, path)


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
    return _save(plt, fig, path)


def plot_cluster(doc: dict, path: Path) -> Path:
    plt = _pyplot()
    summ = {v: c for v, c in doc["summary"].items() if c["runs_ok"]}
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.barh(list(summ), [c["steady_records_per_s"]["median"] for c in summ.values()])
    ax.set_xlabel("steady records/s at the sink (median)")
    ax.invert_yaxis()
    return _save(plt, fig, path)
