// epochal dashboard: the drill-down views — an operator's page (#op=<name>), a checkpoint's page
// (#checkpoint=<epoch>, read from /api/checkpoint) and the exceptions table. app.js creates them
// with its helpers and calls them on every poll; nothing here polls or keeps the job's state.
"use strict";
(function (root) {
  root.epochalDrilldown = function ({$, cell, token, current}) {
    const {fmtS, fmtRate, fmtBytes, fmtPct} = root.epochalFormat;  // static/format.js
    function route() {
      const m = /^#(op|checkpoint)=(.+)$/.exec(decodeURIComponent(location.hash));
      return m ? {kind: m[1], name: m[2]} : null;
    }
    function watermarkText(w) {  // event time in seconds: a clock time when it looks like one
      if (w === null || w === undefined) return "–";
      return w > 1e8 ? new Date(w * 1000).toISOString().replace("T", " ").slice(0, 23) : String(w);
    }
    function row(values, data) {
      const tr = document.createElement("tr");
      for (const [k, v] of Object.entries(data || {})) tr.dataset[k] = v;
      for (const v of values) {
        const td = cell(tr, Array.isArray(v) ? v[1] : v);
        if (Array.isArray(v)) { td.dataset.key = v[0]; if (v[2] !== undefined && v[2] !== null) td.dataset.value = v[2]; }
      }
      return tr;
    }
    function drawOperator(s) {
      const r = route(), panel = $("op-panel");
      if (r && r.kind === "op" && !s.operators[r.name] && s.state === "offline") {  // a job read from storage
        panel.hidden = false;
        $("op-title").textContent = `Operator ${r.name}`;
        $("op-spread").textContent = "figures per subtask exist only while the job runs (its own dashboard, " +
          "MetricsConfig(ui=True)); checkpoints do not record them";
        document.querySelector("#op-subtasks tbody").replaceChildren();
        return;
      }
      if (!r || r.kind !== "op" || !s.operators[r.name]) { panel.hidden = true; return; }
      const o = s.operators[r.name], sp = o.spread || {};
      panel.hidden = false;
      panel.dataset.name = r.name;
      panel.dataset.attempt = (s.progress || {}).attempt ?? "";  // the attempt whose figures these are
      $("op-title").textContent = `Operator ${r.name}: ${o.parallelism} subtask${o.parallelism > 1 ? "s" : ""}` +
        ((s.progress || {}).attempt != null ? ` (attempt ${s.progress.attempt + 1})` : "");
      const notes = [];
      for (const [key, label, f] of [["records_in_per_s", "records in/s", fmtRate], ["backpressure", "back-pressure", fmtPct],
                                     ["cpu_load", "CPU", fmtPct]]) {
        const v = sp[key];
        if (v && v.count > 1) notes.push(`${label}: highest ${f(v.max)} (subtask ${v.argmax}), lowest ${f(v.min)} (subtask ${v.argmin})`);
      }
      $("op-spread").textContent = notes.join(" · ") || "one subtask";
      document.querySelector("#op-subtasks tbody").replaceChildren(...(o.subtasks || []).map((t) => row(t.reported === false
        ? [t.subtask ?? "–", t.task, ["state", "has not reported yet"]]
        : [["subtask", t.subtask ?? "–"], t.task, `${t.host || "–"} · pid ${t.pid ?? "–"}`,
           ["in_rate", fmtRate(t.records_in_per_s), t.records_in_per_s], ["out_rate", fmtRate(t.records_out_per_s), t.records_out_per_s],
           ["records_in", fmtRate(t.records_in), t.records_in], ["records_out", fmtRate(t.records_out), t.records_out],
           ["backpressure", fmtPct(t.backpressure), t.backpressure], ["cpu", fmtPct(t.cpu_load), t.cpu_load],
           ["memory", fmtBytes(t.rss_bytes), t.rss_bytes], ["watermark", watermarkText(t.watermark), t.watermark],
           ["queued", t.queued_batches ?? "–", t.queued_batches],
           ["state", t.state_bytes == null ? "not acknowledged yet" : fmtBytes(t.state_bytes), t.state_bytes]],
        {task: t.task, subtask: t.subtask})));
      drawReader(o);
    }
    function drawReader(o) {  // a source reader's own figures (the CEC window operator's), when it reports some
      const box = $("op-reader");
      box.hidden = !o.reader;
      if (!o.reader) return;
      const line = (label, g, data) => row([label, ["open_windows", g.open_windows ?? "–", g.open_windows],
        ["extent_lag", g.extent_lag_s == null ? "–" : fmtS(g.extent_lag_s), g.extent_lag_s],
        ["footprints_rate", fmtRate(g.footprints_per_s), g.footprints_per_s],
        ["footprints", fmtRate(g.footprints), g.footprints],
        ["checkpoint_load", fmtPct(g.checkpoint_load), g.checkpoint_load], ["overdrafts", g.overdrafts ?? "–"],
        ["segments", g.segments ?? "–"], ["torn", g.torn ?? "–"]], data);
      document.querySelector("#op-reader-table tbody").replaceChildren(line("all", o.reader, {total: 1}),
        ...(o.subtasks || []).filter((t) => t.reader).map((t) => line(t.subtask ?? "–", t.reader, {subtask: t.subtask})));
    }
    let shownCheckpoint = null;
    async function drawCheckpoint(s) {
      const r = route(), panel = $("checkpoint-panel");
      if (!r || r.kind !== "checkpoint") { panel.hidden = true; shownCheckpoint = null; return; }
      if (shownCheckpoint === r.name) return;  // a completed epoch's acknowledgements never change
      shownCheckpoint = r.name;
      panel.hidden = false;
      panel.dataset.epoch = "";
      $("cp-title").textContent = `Checkpoint ${r.name}`;
      $("cp-summary").textContent = "reading…";
      const body = document.querySelector("#cp-tasks tbody");
      body.replaceChildren();
      if ((s || current() || {}).state === "offline") {
        $("cp-summary").textContent = "read from storage: a checkpoint's _metadata does not record its tasks' " +
          "acknowledgements (sizes, durations, alignment); the running job's dashboard keeps them";
        panel.dataset.epoch = "none";
        return;
      }
      try {
        const resp = await fetch(`/api/checkpoint?epoch=${encodeURIComponent(r.name)}`,
                                 {headers: {"X-Epochal-Token": token}, cache: "no-store"});
        const c = await resp.json();
        if (!resp.ok) throw new Error(c.error || resp.status);
        $("cp-summary").textContent = [`attempt generation ${c.generation ?? "–"}`, c.status, c.reason || "",
          c.duration_s != null ? `duration ${fmtS(c.duration_s)}` : "", c.bytes != null ? `uploaded ${fmtBytes(c.bytes)}` : "",
          c.state_bytes != null ? `state ${fmtBytes(c.state_bytes)}` : "", c.note || "",
          c.missing.length ? `not reported by any task: ${c.missing.join(", ")}` : ""].filter(Boolean).join(" · ");
        body.replaceChildren(...c.tasks.map((t) => row([t.task, t.operators.join(" → "),
          ["barrier", fmtS(t.barrier_s), t.barrier_s], ["alignment", fmtS(t.alignment_s), t.alignment_s],
          ["sync", fmtS(t.sync_s), t.sync_s], ["upload_wait", fmtS(t.upload_wait_s), t.upload_wait_s],
          ["upload", fmtS(t.upload_s), t.upload_s], ["durable", fmtS(t.durable_s), t.durable_s],
          ["ack", fmtS(t.ack_s), t.ack_s], ["bytes", fmtBytes(t.bytes), t.bytes], ["state", fmtBytes(t.state_bytes), t.state_bytes],
          ["kind", t.snapshot_kind || "–"], ["in_flight", t.channel_state_records ?? "–", t.channel_state_records]],
          {task: t.task})));
        panel.dataset.epoch = c.epoch;
      } catch (e) {
        $("cp-summary").textContent = `no per-task detail: ${e.message}`;
        panel.dataset.epoch = "none";
      }
    }
    function drawExceptions(s) {
      const rows = s.exceptions || [];
      $("exceptions-count").textContent = rows.length ? `${rows.length} failure${rows.length > 1 ? "s" : ""}` : "";
      $("exceptions-none").hidden = rows.length > 0;
      $("exceptions-none").textContent = s.state === "offline" ? "read from storage: checkpoints do not record failures"
        : "no failure so far";
      const key = JSON.stringify(rows.map((e) => [e.kind, e.generation, e.cause]));
      const body = document.querySelector("#exceptions tbody");
      if (body.dataset.key === key) return;  // keep an opened traceback open
      body.dataset.key = key;
      body.replaceChildren(...rows.map((e) => {
        const tr = row([e.generation ?? "–", e.kind === "failover" ? "failover region" : "attempt failed",
                        e.time_s != null ? fmtS(e.time_s) : "–", e.tasks.join(", ") || "–", e.restored_epoch ?? "–"],
                       {kind: e.kind, generation: e.generation});
        const td = cell(tr, "", "text cause");
        const first = document.createElement("div");
        first.className = "cause-line";
        first.textContent = e.cause;
        td.appendChild(first);
        if (e.traceback) {
          const d = document.createElement("details"), sum = document.createElement("summary"),
            pre = document.createElement("pre");
          sum.textContent = "traceback";
          pre.className = "traceback";
          pre.textContent = e.traceback;
          d.append(sum, pre);
          td.appendChild(d);
        } else if (e.kind === "failover") {
          const note = document.createElement("div");
          note.className = "note";
          note.textContent = "(the driver keeps the first line of a failover's cause)";
          td.appendChild(note);
        }
        return tr;
      }));
    }
    return {route, drawOperator, drawCheckpoint, drawExceptions};
  };
})(this);
