// epochal dashboard: polls /api/state and draws it as plain SVG and tables (no libraries).
"use strict";
(function () {
  const token = new URLSearchParams(location.search).get("token") || "";
  const POLL_MS = Number(new URLSearchParams(location.search).get("poll") || 2000);  // ?poll=<ms>
  const NS = "http://www.w3.org/2000/svg";
  const EDGE_COLOURS = {forward: "#59606d", hash: "#1f6feb", rebalance: "#8250df", broadcast: "#bf3989",
                        feedback: "#d1242f"};
  const PHASES = [["barrier", "#9aa3b2"], ["alignment", "#d29922"], ["sync", "#cf222e"], ["upload", "#1f6feb"],
                  ["ack", "#57ab5a"], ["metadata", "#8250df"]];
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, text) {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  const {fmtS, fmtRate, fmtBytes, fmtPct, fmtSpan, axis} = window.epochalFormat;  // static/format.js
  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }
  function pressureColour(r) {  // white → red with back-pressure
    const k = Math.max(0, Math.min(1, r || 0));
    return `rgb(255,${Math.round(255 - 150 * k)},${Math.round(255 - 170 * k)})`;
  }

  // ---------------------------------------------------------------- the job graph
  let graphDrawn = false;
  function drawGraph(graph) {
    const box = $("graph");
    const svg = el("svg", {width: graph.width, height: graph.height, viewBox: `0 0 ${graph.width} ${graph.height}`,
                           role: "img", "aria-label": "job graph"});
    const defs = el("defs");
    for (const [kind, colour] of Object.entries(EDGE_COLOURS)) {
      const m = el("marker", {id: "arrow-" + kind, viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7,
                              markerHeight: 7, orient: "auto-start-reverse"});
      m.appendChild(el("path", {d: "M0,0 L10,5 L0,10 z", fill: colour}));
      defs.appendChild(m);
    }
    svg.appendChild(defs);
    const at = Object.fromEntries(graph.nodes.map((n) => [n.name, n]));
    for (const e of graph.edges) {
      const a = at[e.source], b = at[e.target];
      if (!a || !b) continue;
      const kind = e.feedback ? "feedback" : e.kind;
      let d;
      if (e.feedback) {  // a loop's back-edge: below the boxes, right to left
        const y = Math.max(a.y + a.height, b.y + b.height) + 18;
        d = `M${a.x + a.width / 2},${a.y + a.height} C${a.x + a.width / 2},${y} ${b.x + b.width / 2},${y} ` +
            `${b.x + b.width / 2},${b.y + b.height}`;
      } else if (b.column - a.column > 1) {  // skips columns: an arc over the boxes between
        const x1 = a.x + a.width * 0.75, x2 = b.x + b.width * 0.25, top = Math.min(a.y, b.y) - 30;
        d = `M${x1},${a.y} C${x1},${top} ${x2},${top} ${x2},${b.y}`;
      } else {
        const x1 = a.x + a.width, y1 = a.y + a.height / 2, x2 = b.x, y2 = b.y + b.height / 2, mx = (x1 + x2) / 2;
        d = `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`;
      }
      const path = el("path", {d, fill: "none", stroke: EDGE_COLOURS[kind], "stroke-width": 2,
                               "stroke-dasharray": kind === "broadcast" ? "6 3" : kind === "feedback" ? "3 3" : "",
                               "marker-end": `url(#arrow-${kind})`, class: "edge", "data-kind": kind,
                               "data-source": e.source, "data-target": e.target});
      path.appendChild(el("title", {}, `${e.source} → ${e.target}: ${kind}${e.port !== "main" ? " (" + e.port + ")" : ""}`));
      svg.appendChild(path);
    }
    for (const n of graph.nodes) {
      const g = el("g", {class: "op", "data-name": n.name, transform: `translate(${n.x},${n.y})`, tabindex: 0,
                         role: "button", "aria-label": `operator ${n.name}: its subtasks`});
      g.addEventListener("click", () => { location.hash = "op=" + encodeURIComponent(n.name); });
      g.addEventListener("keydown", (ev) => { if (ev.key === "Enter") location.hash = "op=" + encodeURIComponent(n.name); });
      g.appendChild(el("rect", {width: n.width, height: n.height, rx: 6, fill: "#fff", stroke: "#39414f",
                                "stroke-width": 1.2, class: "op-box"}));
      g.appendChild(el("text", {x: 8, y: 16, "font-size": 13, "font-weight": 600, class: "op-name"}, n.name));
      g.appendChild(el("text", {x: n.width - 8, y: 16, "font-size": 11, "text-anchor": "end", fill: "#555"},
                       `${n.kind} ×${n.parallelism}`));
      g.appendChild(el("text", {x: 8, y: 34, "font-size": 11, class: "op-rates"}, "in – / out – rec/s"));
      g.appendChild(el("text", {x: 8, y: 50, "font-size": 11, class: "op-pressure"}, "back-pressure –"));
      g.appendChild(el("title", {}, `${n.name}: click for its ${n.parallelism} subtask(s)`));
      svg.appendChild(g);
    }
    box.replaceChildren(svg);
    graphDrawn = true;
  }
  function updateGraph(ops) {
    for (const g of document.querySelectorAll("#graph g.op")) {
      const o = ops[g.dataset.name];
      if (!o) continue;
      g.querySelector(".op-rates").textContent =
        `in ${fmtRate(o.records_in_per_s)} / out ${fmtRate(o.records_out_per_s)} rec/s`;
      // never hide a skew behind one figure: the lowest and highest subtask when they differ
      const bp = (o.spread || {}).backpressure, rin = (o.spread || {}).records_in_per_s;
      const bpText = bp && bp.count > 1 && bp.max - bp.min >= 0.01
        ? `${fmtPct(bp.min)}–${fmtPct(bp.max)}` : fmtPct(o.backpressure);
      g.querySelector(".op-pressure").textContent = `back-pressure ${bpText}` +
        (o.cpu_load === null || o.cpu_load === undefined ? "" : ` · CPU ${fmtPct(o.cpu_load)}`);
      g.querySelector(".op-rates").textContent = rin && rin.count > 1 && rin.max > 0 && rin.min < 0.8 * rin.max
        ? `in ${fmtRate(rin.min)}–${fmtRate(rin.max)} per subtask / out ${fmtRate(o.records_out_per_s)}`
        : `in ${fmtRate(o.records_in_per_s)} / out ${fmtRate(o.records_out_per_s)} rec/s`;
      if (bp) { g.dataset.bpMin = bp.min; g.dataset.bpMax = bp.max; }
      if (rin) { g.dataset.inMin = rin.min; g.dataset.inMax = rin.max; }
      g.querySelector(".op-box").setAttribute("fill", pressureColour(o.backpressure));
      g.dataset.in = o.records_in;
      g.dataset.out = o.records_out;
    }
  }

  // ---------------------------------------------------------------- charts
  const PALETTE = ["#1f6feb", "#cf222e", "#2e8540", "#8250df", "#d29922", "#bf3989"];
  function lineChart(id, lines, kind, empty) {
    // lines: [{label, points: [[t, v], ...]}]; draws every line on one time axis
    const W = 600, H = 150, L = 52, R = 8, T = 8, B = 20;
    const svg = el("svg", {viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img", "aria-label": id});
    const all = lines.flatMap((l) => l.points.filter((p) => p[1] !== null && p[1] !== undefined));
    if (!all.length) {
      svg.appendChild(el("text", {x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#888", class: "empty"},
                         empty || "no data yet"));
      $(id).replaceChildren(svg);
      return;
    }
    const t0 = Math.min(...all.map((p) => p[0])), t1 = Math.max(...all.map((p) => p[0]));
    const ax = axis(kind, Math.max(...all.map((p) => p[1]))), vmax = ax.max, span = Math.max(t1 - t0, 1e-9);
    const fmt = {time: fmtS, count: fmtRate, bytes: fmtBytes}[kind] || ((v) => v.toFixed(2));
    const x = (t) => L + (W - L - R) * (t - t0) / span, y = (v) => H - B - (H - T - B) * v / vmax;
    for (const tick of ax.ticks) {
      svg.appendChild(el("line", {x1: L, x2: W - R, y1: y(tick.value), y2: y(tick.value), stroke: "#e3e5e8"}));
      svg.appendChild(el("text", {x: L - 4, y: y(tick.value) + 4, "text-anchor": "end", "font-size": 10,
                                  fill: "#666", class: "tick"}, tick.label));
    }
    svg.appendChild(el("text", {x: W - R, y: H - 5, "text-anchor": "end", "font-size": 10, fill: "#666"},
                       `last ${fmtSpan(t1 - t0)}`));
    lines.forEach((l, i) => {
      const pts = l.points.filter((p) => p[1] !== null && p[1] !== undefined);
      if (!pts.length) return;
      const colour = PALETTE[i % PALETTE.length], last = pts[pts.length - 1];
      svg.appendChild(el("polyline", {points: pts.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "),
                                      fill: "none", stroke: colour, "stroke-width": 1.6, class: "series",
                                      "data-label": l.label, "data-latest": last[1], "data-points": pts.length}));
      svg.appendChild(el("circle", {cx: x(last[0]), cy: y(last[1]), r: 2.5, fill: colour, class: "latest",
                                    "data-label": l.label, "data-value": last[1]}));
      svg.appendChild(el("text", {x: L + 6 + 150 * i, y: T + 10, "font-size": 11, fill: colour, class: "legend-item"},
                         `${l.label}: ${fmt(last[1])}`));
    });
    $(id).replaceChildren(svg);
  }
  function drawCharts(s) {
    const offline = s.state === "offline";  // read from storage: no live figures will ever come
    $("charts").hidden = offline;
    $("charts-offline").hidden = !offline;
    if (offline) return;
    const series = s.series;
    lineChart("chart-throughput", [
      {label: "in", points: series.map((p) => [p.time, p.records_in_per_s])},
      {label: "out", points: series.map((p) => [p.time, p.records_out_per_s])}], "count");
    lineChart("chart-latency", [{label: "latency", points: s.latency.map((p) => [p.time, p.latency_s])}], "time");
    const sources = [...new Set(series.flatMap((p) => Object.keys(p.watermark_lag_s || {})))];
    lineChart("chart-lag", sources.map((name) => ({label: name, points: series.map(
      (p) => [p.time, (p.watermark_lag_s || {})[name] ?? null])})), "time",
      "no watermark yet (none of the sources assigns event time, or none has one yet)");
    lineChart("chart-memory", [
      {label: "driver", points: series.map((p) => [p.time, p.driver_rss ?? null])},
      {label: "tasks", points: series.map((p) => [p.time, p.tasks_rss ?? null])}], "bytes");
    lineChart("chart-cpu", [
      {label: "driver", points: series.map((p) => [p.time, p.driver_cpu ?? null])},
      {label: "tasks", points: series.map((p) => [p.time, p.tasks_cpu ?? null])}], "plain");
  }

  // ---------------------------------------------------------------- checkpoints
  function splitBar(split, total, width) {
    const svg = el("svg", {width, height: 12, class: "split"});
    let x = 0;
    for (const [phase, colour] of PHASES) {
      const w = total > 0 ? width * (split[phase] || 0) / total : 0;
      if (w <= 0) continue;
      const r = el("rect", {x, y: 1, width: w, height: 10, fill: colour, "data-phase": phase});
      r.appendChild(el("title", {}, `${phase} ${fmtS(split[phase])}`));
      svg.appendChild(r);
      x += w;
    }
    return svg;
  }
  const TABLE_ROWS = 60;  // the newest epochs in the table (the timeline shows 120, the JSON 200)
  let drawnCheckpoints = "";
  function drawCheckpoints(s) {
    const last = s.checkpoints[s.checkpoints.length - 1] || {};
    const key = [last.epoch, last.status, s.checkpoints.length, s.savepoints.length, JSON.stringify(s.restore)].join("|");
    if (key === drawnCheckpoints) return;  // nothing new: keep the drawn table (the browser's CPU matters)
    drawnCheckpoints = key;
    const rows = s.checkpoints.slice(-TABLE_ROWS).reverse();
    $("checkpoint-counts").textContent = `${s.counts.completed} completed, ${s.counts.aborted} failed or declined ` +
      `(recent epochs); ${s.savepoints.length} savepoints`;
    const body = document.querySelector("#checkpoints tbody");
    const maxTotal = Math.max(1e-9, ...rows.filter((r) => r.split).map(
      (r) => PHASES.reduce((a, [p]) => a + (r.split[p] || 0), 0)));
    body.replaceChildren(...rows.map((r) => {
      const tr = document.createElement("tr");
      tr.dataset.epoch = r.epoch;
      tr.dataset.status = r.status;
      tr.className = r.status + (r.savepoint ? " savepoint" : "") + " clickable";
      tr.tabIndex = 0;
      tr.title = "click: every task's acknowledgement of this epoch";
      tr.addEventListener("click", () => { location.hash = "checkpoint=" + r.epoch; });
      cell(tr, r.epoch); cell(tr, r.generation ?? "–"); cell(tr, r.status); cell(tr, r.reason || "");
      if (r.status === "completed") {
        cell(tr, fmtS(r.duration_s));
        const total = PHASES.reduce((a, [p]) => a + (r.split[p] || 0), 0);
        cell(tr, "").appendChild(splitBar(r.split, total, Math.max(2, 140 * total / maxTotal)));
        for (const [p] of PHASES) cell(tr, fmtS(r.split[p]));
        cell(tr, fmtBytes(r.bytes)); cell(tr, fmtBytes(r.state_bytes));
        cell(tr, r.unaligned_bytes ? `${fmtBytes(r.unaligned_bytes)} (${r.unaligned_records} rec)` : "–");
        cell(tr, fmtS(r.latency_s));
        cell(tr, r.savepoint || "", "text");
      } else {
        for (let i = 0; i < 12; i++) cell(tr, "");
        cell(tr, r.detail || "", "text");
      }
      return tr;
    }));
    // timeline: one bar per epoch, height = duration, coloured by status
    const recent = s.checkpoints.slice(-120), W = 600, H = 70;
    const svg = el("svg", {viewBox: `0 0 ${W} ${H}`, width: "100%", height: H, preserveAspectRatio: "none"});
    const dmax = Math.max(1e-9, ...recent.map((r) => r.duration_s || 0));
    recent.forEach((r, i) => {
      const w = W / Math.max(recent.length, 1), h = r.status === "completed" ? (H - 4) * (r.duration_s || 0) / dmax : H - 4;
      const bar = el("rect", {x: i * w, y: H - Math.max(h, 1), width: Math.max(w - 1, 1), height: Math.max(h, 1),
                              fill: r.status !== "completed" ? "#cf222e" : r.savepoint ? "#1f6feb" : "#57ab5a"});
      bar.appendChild(el("title", {}, `epoch ${r.epoch}: ${r.status} ${fmtS(r.duration_s)}`));
      svg.appendChild(bar);
    });
    $("timeline").replaceChildren(svg);
    const restore = $("restore");
    if (s.restore) {
      restore.className = "restore failed";
      restore.textContent = `latest restore: attempt generation ${s.restore.generation} restored epoch ` +
        `${s.restore.epoch} (${fmtBytes(s.restore.bytes)}) — cause: ${s.restore.cause}`;
    } else if (s.state === "offline") {
      restore.className = "restore";
      restore.textContent = "read from storage: checkpoints do not record the job's attempts" +
        (s.generation != null ? ` (the newest checkpoint is of attempt generation ${s.generation})` : "");
    } else {
      restore.className = "restore";
      restore.textContent = ENDED.includes(s.state) ? `no restore: the job ${s.state} in its first attempt`
        : "no restore: the job runs its first attempt from scratch";
    }
  }
  function drawTables(s) {
    const a = document.querySelector("#attempts tbody");
    const current = s.attempts.filter((e) => e.started_s != null).length - 1;
    a.replaceChildren(...s.attempts.map((e, i) => {
      const tr = document.createElement("tr");
      tr.dataset.generation = e.generation;
      // the newest attempt has not failed: say what it does now rather than a dash
      const now = i === current && e.failed_s == null ? (s.state === "running" && e.running_s == null ? "starting"
        : s.state) : null;
      cell(tr, e.generation); cell(tr, fmtS(e.started_s)); cell(tr, e.running_s != null ? fmtS(e.running_s)
        : now === "starting" ? "starting" : "–");
      cell(tr, e.restored_epoch ?? "–"); cell(tr, now ?? fmtS(e.failed_s)); cell(tr, e.cause || "", "text cause");
      return tr;
    }));
    document.querySelector("#sinks tbody").replaceChildren(...s.sinks.map((k) => {
      const tr = document.createElement("tr");
      cell(tr, k.sink); cell(tr, k.parallelism); cell(tr, k.open_per_subtask); cell(tr, fmtS(k.oldest_age_s));
      return tr;
    }));
    document.querySelector("#savepoints tbody").replaceChildren(...s.savepoints.map((p) => {
      const tr = document.createElement("tr");
      cell(tr, p.epoch); cell(tr, p.url, "text sp-url"); cell(tr, fmtBytes(p.bytes)); cell(tr, fmtS(p.copy_s));
      cell(tr, p.stop ? "yes" : "");
      return tr;
    }));
  }
  function drawRegions(s) {  // a job of several regions: every region side by side, linked
    const nav = $("regions");
    nav.hidden = !(s.regions && s.regions.length);
    if (nav.hidden) return;
    nav.replaceChildren(...s.regions.map((r) => {
      const link = r.url && r.name !== s.region;
      const a = document.createElement(link ? "a" : "span");
      a.className = "region " + (r.state || "") + (r.name === s.region ? " current" : "");
      if (link) a.href = r.url;
      a.textContent = `${r.name}: ${r.state} · ` + (r.attempt != null ? `attempt ${r.attempt + 1} · ` : "") +
        (r.last_epoch != null ? `epoch ${r.last_epoch} (${r.completed_epochs} done)` : "no checkpoint yet");
      return a;
    }));
  }
  function drawHeader(s) {
    $("job").textContent = s.region ? `${s.job} / region ${s.region}` : s.job;
    drawRegions(s);
    const st = $("state");
    // this page stopped it with a savepoint: the savepoint is written, the job stops with it (a poll
    // answered while it winds down must not say "running" again)
    const stopped = stoppedAt !== null;
    st.textContent = stopped ? "stopped at a savepoint" : s.state;
    st.className = "state " + (stopped ? "stopped" : s.state);
    const p = s.progress || {};
    $("summary").textContent = [s.state === "offline" ? "read-only, from checkpoint storage"
      : `${s.runtime || ""} · ${s.guarantee || ""}`,
      ...(s.state === "offline" ? [] : [`${fmtRate(p.records_in_per_s)} rec/s in, ${fmtRate(p.records_out_per_s)} out`]),
      p.last_completed_epoch != null ? `epoch ${p.last_completed_epoch}` : "no checkpoint yet",
      `checkpoints in ${s.checkpoint_root || "–"}`].join(" · ");
    for (const id of ["btn-savepoint", "btn-stop", "btn-drain"]) $(id).disabled = !s.actions || s.state !== "running";
  }

  // ---------------------------------------------------------------- drill-down views (static/drilldown.js)
  const {drawOperator, drawCheckpoint, drawExceptions} = window.epochalDrilldown({$, cell, token, current: () => last});
  window.addEventListener("hashchange", () => { if (last) drawOperator(last); drawCheckpoint(); });
  for (const id of ["op-close", "cp-close"]) $(id).addEventListener("click", () => { location.hash = ""; });

  // ---------------------------------------------------------------- loop
  // The page's view of the job: the last state the server gave, and whether this page stopped it.
  let last = null, stoppedAt = null;
  const ENDED = ["finished", "failed", "stopped"];
  function gone(message) {  // the server does not answer: what the page can still say truthfully
    const st = $("state");
    const ended = stoppedAt !== null || (last && (ENDED.includes(last.state) || last.state === "stopping"));
    st.textContent = stoppedAt !== null ? "stopped at a savepoint" : ended ? (last.state === "stopping" ? "stopped"
      : last.state) : last ? "unreachable" : "connecting";
    st.className = "state " + (stoppedAt !== null || ended ? "stopped" : "unreachable");
    for (const id of ["btn-savepoint", "btn-stop", "btn-drain"]) $(id).disabled = true;
    if (last) {
      const p = last.progress || {};
      $("summary").textContent = [`${last.runtime || ""} · ${last.guarantee || ""}`,
        p.last_completed_epoch != null ? `last epoch ${p.last_completed_epoch}` : "no checkpoint",
        `checkpoints in ${last.checkpoint_root || "–"}`].join(" · ");
    }
    $("error").hidden = false;
    $("error").textContent = ended
      ? "the job has ended, and its dashboard with it: the figures below are its last ones" +
        (stoppedAt ? ` (savepoint ${stoppedAt})` : "") + ". `epochal ui <storage> <job>` shows its checkpoints."
      : `cannot read the job's state (${message}); retrying`;
    document.body.dataset.ended = ended ? "yes" : "";
    return ended;
  }
  async function poll() {
    let ended = false;
    try {
      const r = await fetch("/api/state", {headers: {"X-Epochal-Token": token}, cache: "no-store"});
      const s = await r.json();
      if (!r.ok) throw new Error(s.error || r.status);
      if (!graphDrawn) drawGraph(s.graph);
      drawHeader(s); updateGraph(s.operators); drawCharts(s); drawCheckpoints(s); drawTables(s);
      drawOperator(s); drawExceptions(s); drawCheckpoint(s);
      last = s;
      document.body.dataset.ended = ENDED.includes(s.state) ? "yes" : "";
      $("error").hidden = stoppedAt === null;  // after this page's stop: keep saying how the job ended
      document.body.dataset.polls = Number(document.body.dataset.polls || 0) + 1;
    } catch (e) {
      ended = gone(e.message);
    }
    setTimeout(poll, ended ? 5 * POLL_MS : POLL_MS);  // an ended job's page still looks, less often
  }
  async function action(stop, drain = false) {
    const out = $("action-result");
    out.textContent = drain ? "draining, then stopping with a savepoint…" : stop ? "stopping with a savepoint…"
      : "taking a savepoint…";
    try {
      const r = await fetch("/api/savepoint", {method: "POST", headers: {"X-Epochal-Token": token,
        "Content-Type": "application/json"}, body: JSON.stringify({stop, drain})});
      const doc = await r.json();
      out.textContent = r.ok ? `savepoint written: ${doc.url}` : `failed: ${doc.error}`;
      out.dataset.url = r.ok ? doc.url : "";
      if (r.ok && stop) { stoppedAt = doc.url; gone("stopped"); }
    } catch (e) {
      out.textContent = "failed: " + e.message;
    }
  }
  $("btn-savepoint").addEventListener("click", () => action(false));
  $("btn-stop").addEventListener("click", () => {
    if (confirm("Stop the job with a savepoint?")) action(true);
  });
  $("btn-drain").addEventListener("click", () => {
    if (confirm("End event time (every open window fires), then stop the job with a savepoint?")) action(true, true);
  });
  poll();
})();
