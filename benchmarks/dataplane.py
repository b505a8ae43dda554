"""The data plane against its physical ceiling: a pass-through pipeline vs. raw loopback transports.

One invocation measures, side by side and interleaved (rotated order per repetition):

* **epochal** ``GeneratorSource → rebalance() → counting sink``, parallelism 1, runtime
  ``local``: two task processes, every record crosses one real TCP channel. Three modes:
  ``no-checkpoint`` (exactly-once components, only the final epoch), ``exactly-once``
  with a 1 s checkpoint interval, ``tls exactly-once``: the same with
  ``ChannelConfig(encryption=True)`` — the TLS 1.3 connections a cluster uses by default —
  and ``exactly-once __main__ class``: the same records as instances of a dataclass of the
  driver's ``__main__``, which the tasks only have by value, so every batch takes
  ``epochal.serde``'s cloudpickle fallback (issue 11; the difference to ``exactly-once``
  also holds building one dataclass instance per record in the source), and ``columnar
  exactly-once``: the columnar path — the source yields one pre-built Arrow RecordBatch of
  ``--columnar-rows`` rows again and again (exactly what the ``arrow-columnar`` ceiling, the
  ``arrow`` ceiling at that batch size, sends), the channel carries Arrow IPC frames, the sink
  counts rows (issue 14's goal: ≥ 50 % of that ceiling). The sink
  (``dataplane_sink.CountingSink``, public sink API) only counts, and stamps wall clock and
  the CPU time of both tasks every ``--stamp-every`` records.
* **ceilings** (``dataplane_ceilings.py``, two processes over 127.0.0.1, no engine):
  ``pickle`` (epochal's wire format: length-framed ``pickle.dumps(("B", batch))``),
  ``arrow-py`` (the same Python tuples through Arrow IPC and back), ``arrow`` (one pre-built
  RecordBatch, no Python objects), ``bytes`` (socket memcpy speed), and ``generate`` (the
  record generator alone, one process, no transport).

Every variant sends the same records — ``(id, blob)`` with a ``--payload``-byte blob, in
batches of epochal's ``ChannelConfig.batch_size`` — and is measured in steady state from
stamps taken at the receiving end: records between the 5 % and 95 % points / time between
them, so process start-up, connection set-up and the final epoch never count. Ratios are
epochal / ceiling (medians of the same invocation, plus per-repetition paired ratios).

    python benchmarks/dataplane.py                       # 3 repetitions, ~6 s per run (~3 min)
    python benchmarks/dataplane.py --payload 1000 --repetitions 5
    python benchmarks/dataplane.py --smoke               # ~15 s, JSON + PNG in a temp dir
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cloudpickle  # noqa: E402
import dataplane_ceilings as ceilings  # noqa: E402
import dataplane_sink  # noqa: E402
import harness  # noqa: E402
from dataplane_sink import CountingSink  # noqa: E402

cloudpickle.register_pickle_by_value(ceilings)  # ceilings.records runs in the source task
cloudpickle.register_pickle_by_value(dataplane_sink)  # the sink runs in the sink task

import epochal as ep  # noqa: E402
from epochal.config import ChannelConfig  # noqa: E402
from epochal.runtime.transport import channels as ep_channels  # noqa: E402
from epochal.runtime.transport import wire as ep_wire  # noqa: E402

CEILING = Path(ceilings.__file__).resolve()
#: name -> (checkpoint interval, encryption, records of a ``__main__`` class)
#: name -> (checkpoint interval, encryption, records: "tuples" | "__main__ class" | "arrow batches")
EPOCHAL_MODES = {"epochal no-checkpoint": (None, False, "tuples"), "epochal exactly-once": (1.0, False, "tuples"),
                 "epochal tls exactly-once": (1.0, True, "tuples"),
                 "epochal exactly-once __main__ class": (1.0, False, "__main__ class"),
                 "epochal columnar exactly-once": (1.0, False, "arrow batches")}
CEILING_KINDS = ("pickle", "arrow-py", "arrow", "arrow-columnar", "bytes", "generate")
#: the columnar variant runs this many times the calibrated records (about as long a run)
COLUMNAR_SCALE = 6
STEADY_WINDOW = (0.05, 0.95)


def main_class():
    """``Record(id, blob)``: a dataclass as the user's script defines it (module ``__main__``,
    whichever way this file was loaded), so cloudpickle ships it to the tasks by value and
    plain pickle cannot pickle its instances there."""
    ns: dict = {"__name__": "__main__"}
    exec("import dataclasses\n@dataclasses.dataclass\nclass Record:\n    id: int\n    blob: bytes\n", ns)
    return ns["Record"]


def records_fn(payload: int, batch_size: int, record_class=None):
    """``ceilings.records`` with payload and pool bound (a closure: the module itself never
    ships); with ``record_class``, each ``(id, blob)`` becomes ``record_class(id, blob)``."""
    gen, distinct = ceilings.records, ceilings.pool_size(payload, batch_size)

    def fn(split: int, offset: int):
        return gen(split, offset, payload, distinct)

    def objects(split: int, offset: int):
        return (record_class(i, blob) for i, blob in gen(split, offset, payload, distinct))
    return fn if record_class is None else objects


def arrow_batches_fn(payload: int, batch_size: int):
    """The ``arrow`` ceiling's input as a source of batches: one RecordBatch of the first
    ``batch_size`` records, yielded again and again (its ids repeat: the sink counts rows)."""
    import pyarrow as pa

    first = list(itertools.islice(ceilings.records(0, 0, payload, ceilings.pool_size(payload, batch_size)),
                                  batch_size))
    batch = pa.RecordBatch.from_arrays([pa.array([r[0] for r in first], pa.int64()),
                                        pa.array([r[1] for r in first], pa.binary())], names=["id", "blob"])

    def fn(split: int, offset: int):
        return itertools.repeat(batch)
    return fn, batch.schema


def passthrough_job(records: int, payload: int, batch_size: int, out: str, stamp_every: int,
                    record_class=None, columnar: bool = False) -> ep.Dataflow:
    """GeneratorSource → rebalance() → CountingSink: 2 tasks, 1 channel at parallelism 1."""
    flow = ep.Dataflow("dataplane", parallelism=1)
    if columnar:
        fn, schema = arrow_batches_fn(payload, batch_size)
        source = ep.sources.GeneratorSource(fn, num_splits=1, limit=max(1, records // batch_size), schema=schema)
    else:
        source = ep.sources.GeneratorSource(records_fn(payload, batch_size, record_class), num_splits=1,
                                            limit=records)
    (flow.source("gen", source)
     .rebalance()
     .sink("count", CountingSink(out, stamp_every)))
    return flow


# ---------------------------------------------------------------------- measuring
def steady(stamps: list, cpu_fields: tuple[int, ...] = (2,)) -> dict:
    """Steady state between the first stamps at ≥ 5 % and ≥ 95 % of the run's records.

    ``stamps`` are ``(records, perf_counter, cpu…)``; returns ``records_per_s`` and, for
    every index in ``cpu_fields``, the CPU seconds per record over the widest window of
    stamps that carry CPU (``cpu_ns_per_record``: a list, one per field). ``None``s when
    there are too few stamps."""
    out = {"records_per_s": None, "cpu_ns_per_record": [None] * len(cpu_fields)}
    if len(stamps) < 3 or stamps[-1][0] <= 0:
        return out
    total = stamps[-1][0]
    inside = [s for s in stamps if STEADY_WINDOW[0] * total <= s[0] <= STEADY_WINDOW[1] * total]
    lo = next(s for s in stamps if s[0] >= STEADY_WINDOW[0] * total)
    hi = next(s for s in stamps if s[0] >= STEADY_WINDOW[1] * total)
    if hi[1] > lo[1]:
        out["records_per_s"] = (hi[0] - lo[0]) / (hi[1] - lo[1])
    cpu = [s for s in inside if len(s) > max(cpu_fields)]
    if len(cpu) >= 2 and cpu[-1][0] > cpu[0][0]:
        out["cpu_ns_per_record"] = [(cpu[-1][f] - cpu[0][f]) / (cpu[-1][0] - cpu[0][0]) * 1e9 for f in cpu_fields]
    return out


def run_epochal(name: str, records: int, args) -> dict:
    interval, encryption, kind = EPOCHAL_MODES[name]
    main, columnar = kind == "__main__ class", kind == "arrow batches"
    if columnar:  # several times faster than the record path: a run as long needs more records
        records = max(1, records * COLUMNAR_SCALE // args.columnar_rows) * args.columnar_rows
    work = tempfile.mkdtemp(prefix="epochal-dataplane-", dir=args.tmp)
    out = os.path.join(work, "out")
    os.makedirs(out)
    flow = passthrough_job(records, args.payload, args.columnar_rows if columnar else args.channel_config.batch_size,
                           out, args.stamp_every, main_class() if main else None, columnar)
    plan = flow.plan()
    rec = {"variant": name, "records": records, "tasks": len(plan.tasks), "channels": len(plan.channels),
           "interval_s": interval, "encryption": encryption, "main_class_records": main, "records_kind": kind,
           "loadavg_1m_before": os.getloadavg()[0]}
    try:
        channels = dataclasses.replace(args.channel_config, encryption=encryption)
        handle = flow.start(guarantee="exactly-once", runtime="local", channels=channels,
                            checkpoint=ep.CheckpointConfig(interval=interval,
                                                           storage="file://" + os.path.join(work, "ck")))
        try:
            result = handle.wait(args.run_timeout)
        except TimeoutError:
            handle.cancel()
            return {**rec, "error": f"hung: not finished after {args.run_timeout} s (cancelled)"}
        files = [json.loads(Path(out, f).read_text()) for f in sorted(os.listdir(out))]
    except Exception as exc:  # noqa: BLE001 — a failed run is reported, the others still run
        return {**rec, "error": f"{type(exc).__name__}: {exc}"[:4000]}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sink = files[-1] if files else {"count": 0, "bad": 0, "stamps": [], "siblings": 0}
    metrics = list(result.task_metrics.values())
    st = steady(sink["stamps"], (2, 3))
    rec.update({
        "received": sink["count"], "bad_stamps": sink["bad"], "stamps": len(sink["stamps"]),
        "steady_records_per_s": st["records_per_s"],
        "consumer_cpu_ns_per_record": st["cpu_ns_per_record"][0],  # the sink task process
        "producer_cpu_ns_per_record": st["cpu_ns_per_record"][1],  # the source task process (sibling)
        "sibling_processes": sink["siblings"],
        "whole_records_per_s": result.records_in / result.duration_s, "duration_s": result.duration_s,
        "completed_epochs": len(result.completed_epochs), "attempts": result.attempts,
        "source_backpressure_s": sum(m.get("backpressure_s", 0.0) for m in metrics if m.get("source")),
        "sink_max_buffered_batches": max((m.get("max_buffered_batches", 0) for m in metrics
                                          if not m.get("source")), default=None),
    })
    if len(files) != 1 or sink["count"] != records or sink["bad"] or result.records_in != records:
        rec["error"] = (f"sink files {len(files)}, counted {sink['count']} of {records} records, "
                        f"{sink['bad']} stamped records out of place, source read {result.records_in}")
    return rec


def run_ceiling(kind: str, args) -> dict:
    rows = args.columnar_rows if kind == "arrow-columnar" else args.channel_config.batch_size
    common = ["--seconds", str(args.target_seconds), "--batch-size", str(rows), "--payload", str(args.payload)]
    rec = {"variant": kind, "batch_rows": rows, "loadavg_1m_before": os.getloadavg()[0]}
    kind = "arrow" if kind == "arrow-columnar" else kind
    py = [sys.executable, str(CEILING)]
    try:
        if kind == "generate":
            out = subprocess.run(py + ["generate", *common], capture_output=True, text=True, check=True,
                                 timeout=args.target_seconds + 60).stdout
            res = json.loads(out.splitlines()[-1])
        else:
            recv = subprocess.Popen(py + ["recv", "--kind", kind], stdout=subprocess.PIPE, text=True)
            try:
                port = recv.stdout.readline().split()[1]
                sent = subprocess.run(py + ["send", "--kind", kind, "--port", port, *common], check=True,
                                      capture_output=True, text=True, timeout=args.target_seconds + 60).stdout
                res = json.loads(recv.communicate(timeout=60)[0].splitlines()[-1])
                res["sender_stamps"] = json.loads(sent.splitlines()[-1])["stamps"]
            finally:
                if recv.poll() is None:
                    recv.kill()
                    recv.wait()
    except (subprocess.SubprocessError, OSError, IndexError, ValueError) as exc:
        stderr = getattr(exc, "stderr", None) or ""
        return {**rec, "error": f"{type(exc).__name__}: {exc} {stderr[-2000:]}"[:4000]}
    unit = 1 if kind != "bytes" else ceilings.record_bytes(args.payload)  # bytes: records = bytes / record
    st = steady(res["stamps"])
    producer = steady(res.get("sender_stamps", res["stamps"]))["cpu_ns_per_record"][0]  # generate: one process

    def per_record(x):
        return x * unit if x is not None else None

    rec.update({"received": res["received"], "bad_batches": res["bad_batches"], "stamps": len(res["stamps"]),
                "steady_records_per_s": st["records_per_s"] / unit if st["records_per_s"] else None,
                "consumer_cpu_ns_per_record": per_record(st["cpu_ns_per_record"][0]) if kind != "generate" else None,
                "producer_cpu_ns_per_record": per_record(producer)})
    if res["bad_batches"] or res["received"] <= 0:
        rec["error"] = f"{res['bad_batches']} batches out of sequence, {res['received']} received"
    return rec


def wire_bytes_per_record(args) -> dict:
    """Bytes on the wire per record: epochal/pickle frame and an Arrow IPC batch message."""
    import pyarrow as pa

    n = args.channel_config.batch_size
    batch = list(itertools.islice(ceilings.records(0, 0, args.payload, ceilings.pool_size(args.payload, n)), n))
    frame = 4 + len(pickle.dumps(("B", batch), protocol=5))
    schema = pa.schema([("id", pa.int64()), ("blob", pa.binary())])
    ipc = ceilings._to_arrow(batch, schema).serialize().size
    return {"payload": ceilings.record_bytes(args.payload), "pickle_frame": frame / n, "arrow_ipc": ipc / n}


# ---------------------------------------------------------------------- aggregation
def aggregate(runs: list[dict], variants: list[str], record_bytes: int) -> dict:
    ok = [r for r in runs if "error" not in r and r.get("steady_records_per_s")]
    out = {}
    for v in variants:
        rates = [r["steady_records_per_s"] for r in ok if r["variant"] == v]
        out[v] = {"runs_ok": len(rates), "records_per_s": harness.summary(rates),
                  "mb_per_s": harness.median(rates) * record_bytes / 1e6 if rates else None}
        for side in ("producer", "consumer"):
            out[v][f"{side}_cpu_ns_per_record"] = harness.median(
                [r[f"{side}_cpu_ns_per_record"] for r in ok if r["variant"] == v
                 and r.get(f"{side}_cpu_ns_per_record") is not None])
        if v in EPOCHAL_MODES:
            whole = [r["whole_records_per_s"] for r in ok if r["variant"] == v]
            out[v]["whole_records_per_s"] = harness.summary(whole)
    for v in (v for v in variants if v in EPOCHAL_MODES):
        mine = out[v]["records_per_s"]["median"]
        out[v]["ratio_to"] = {c: (mine / out[c]["records_per_s"]["median"]
                                  if mine and out[c]["records_per_s"]["median"] else None)
                              for c in variants if c not in EPOCHAL_MODES}
        out[v]["paired_ratios_to"] = {c: _paired(ok, v, c) for c in variants if c not in EPOCHAL_MODES}
    base = "epochal exactly-once"  # the tls and __main__-class variants differ from it in one thing
    for v in (v for v in variants if v in EPOCHAL_MODES and v != base and base in variants):
        mine, theirs = out[v]["records_per_s"]["median"], out[base]["records_per_s"]["median"]
        out[v]["ratio_to_exactly_once"] = mine / theirs if mine and theirs else None
        out[v]["paired_ratios_to_exactly_once"] = _paired(ok, v, base)
    return out


def _paired(ok: list[dict], a: str, b: str) -> list[float]:
    by = {(r["variant"], r["repetition"]): r["steady_records_per_s"] for r in ok}
    return [by[(a, rep)] / by[(b, rep)] for (v, rep) in by if v == a and (b, rep) in by]


def render(summary: dict) -> str:
    rows = [[v, harness.fmt(s["records_per_s"]["median"]), harness.fmt(s["records_per_s"]["min"]),
             harness.fmt(s["records_per_s"]["max"]), harness.fmt(s["mb_per_s"], ",.1f"),
             harness.fmt(s["producer_cpu_ns_per_record"]), harness.fmt(s["consumer_cpu_ns_per_record"]),
             " ".join(f"{c}={harness.fmt(x, '.3f')}" for c, x in s.get("ratio_to", {}).items())]
            for v, s in summary.items()]
    return harness.table(["variant", "steady rec/s", "min", "max", "payload MB/s", "send CPU ns/rec",
                          "recv CPU ns/rec", "epochal / ceiling"], rows)


# ---------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--payload", type=int, default=100, help="blob bytes per record (plus an 8-byte id)")
    p.add_argument("--repetitions", type=int, default=None, help="interleaved repetitions (default 3; 1 with --smoke)")
    p.add_argument("--target-seconds", type=float, default=None,
                   help="length of every run (ceilings: send time; epochal: records sized from a probe run); "
                        "default 6 (1.5 with --smoke)")
    p.add_argument("--max-records", type=int, default=None, help="cap on epochal records per run (default 10M; 2M with --smoke)")
    p.add_argument("--stamp-every", type=int, default=1024, help="the counting sink stamps every k-th record")
    p.add_argument("--variants", nargs="+", choices=(*EPOCHAL_MODES, *CEILING_KINDS),
                   default=[*EPOCHAL_MODES, *CEILING_KINDS])
    p.add_argument("--batch-size", type=int, default=None, help="ChannelConfig.batch_size (default: epochal's)")
    p.add_argument("--columnar-rows", type=int, default=8192,
                   help="rows per Arrow batch of the columnar variant and the arrow-columnar ceiling")
    p.add_argument("--linger", type=float, default=None, help="ChannelConfig.linger s (default: epochal's)")
    p.add_argument("--credits", type=int, default=None, help="ChannelConfig.credits (default: epochal's)")
    p.add_argument("--run-timeout", type=float, default=180.0, help="s before an epochal run is cancelled as hung")
    p.add_argument("--smoke", action="store_true", help="tiny: 1 repetition of ~1.5 s runs, JSON + PNG in a temp dir")
    p.add_argument("--out", type=Path, default=None, help="JSON (default benchmarks/results/dataplane.json)")
    p.add_argument("--plot", type=Path, default=None, help="PNG (default: next to the JSON)")
    p.add_argument("--tmp", default=None)
    args = p.parse_args(argv)
    args.repetitions = args.repetitions or (1 if args.smoke else 3)
    args.target_seconds = args.target_seconds or (1.5 if args.smoke else 6.0)
    args.max_records = args.max_records or (2_000_000 if args.smoke else 10_000_000)
    defaults = ChannelConfig()
    args.channel_config = ChannelConfig(
        batch_size=args.batch_size or defaults.batch_size,
        linger=defaults.linger if args.linger is None else args.linger,
        credits=args.credits or defaults.credits)
    if args.out is None:
        args.out = (Path(tempfile.mkdtemp(prefix="epochal-bench-smoke-")) / "dataplane.json" if args.smoke
                    else harness.RESULTS / "dataplane.json")
    args.plot = args.plot or args.out.with_suffix(".png")
    return args


def describe_wire(cc: ChannelConfig) -> dict:
    """What epochal's data plane does per record and per batch (read from the code's constants)."""
    return {
        "channel_config": {"batch_size": cc.batch_size, "linger_s": cc.linger, "credits": cc.credits},
        "channel_config_defaults": vars(ChannelConfig()),
        "connection": "one TCP connection per channel (producer task → consumer task), TCP_NODELAY; opened "
                      "with a mutual HMAC-SHA256 challenge-response over a per-attempt job key "
                      f"({ep_wire.NONCE}-byte nonces, {ep_wire.MAC}-byte MACs, JSON hello) — once per "
                      "connection, nothing per record; without encryption frames are not MACed, with it "
                      "(the 'tls' variant, a cluster's default) every frame travels in TLS 1.3 records "
                      "(AES-GCM, one SSLObject per connection behind a lock)",
        "framing": f"{ep_wire._LEN.size}-byte big-endian length + pickle protocol 5 of the message; one sendall "
                   "for frames below 64 KiB, header and payload separately above; the receiver reads the "
                   "header and then the payload with recv_into into a fresh bytearray, copied to bytes, then "
                   f"pickle.loads (frames up to {ep_wire.MAX_FRAME} bytes)",
        "messages": f"data ({ep_channels.DATA!r}, [records]) — one pickled Python list per batch; barrier "
                    f"({ep_channels.BARRIER!r}, epoch, ts); end ({ep_channels.END!r},); credit "
                    f"({ep_channels.CREDIT!r}, n) upstream",
        "batching": f"the source polls up to batch_size={cc.batch_size} records from its reader; the router "
                    f"adds them to the channel's buffer (one extend, or one strided slice per channel for "
                    f"round-robin — per batch, not per record) and cuts batches of batch_size; a partial batch is "
                    f"sent after linger={cc.linger} s and always before a barrier",
        "flow_control": f"credit-based: the consumer grants credits={cc.credits} batches per channel; a data "
                        "batch costs one credit; the consumer returns credit when its task thread has consumed "
                        f"credits/2 batches; a producer without credit blocks (back-pressure). Barriers and end "
                        "need no credit",
        "threads": "consumer: one reader thread per input channel (recv + unpickle) hands batches to the task "
                   "thread through a deque and a Condition; producer: one credit-reader thread per output channel",
        "sink": "the SinkOperator calls writer.write(record) once per record (here: count, stamp every "
                "--stamp-every records)",
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    info = harness.machine()
    rb = ceilings.record_bytes(args.payload)
    print(f"epochal dataplane benchmark: payload {args.payload} B (+8 B id) batch {args.channel_config.batch_size} "
          f"variants={args.variants} cores={info['cpu_count']} load={info['loadavg_at_start']}", flush=True)
    doc = {**harness.new_doc("dataplane", args, info),
           "record_bytes": rb, "wire_bytes_per_record": wire_bytes_per_record(args),
           "epochal_wire": describe_wire(args.channel_config),
           "method": {
               "records": f"(id, blob): an int and a {args.payload}-byte bytes object from a pool of "
                          f"{ceilings.pool_size(args.payload, args.channel_config.batch_size)} distinct ones "
                          f"(no object repeats within a batch, so pickle "
                          f"cannot memoize); payload MB/s counts {rb} bytes per record",
               "epochal": "GeneratorSource (unthrottled, 1 split) → rebalance() → CountingSink, parallelism 1, "
                          "runtime local: 2 task processes + 1 TCP channel; guarantee exactly-once with "
                          "CheckpointConfig(interval=None) (no-checkpoint) or interval=1 s (exactly-once: "
                          "aligned barriers through the channel and snapshots of the source offset and the "
                          "sink's count; the counting sink has no transactions, so no two-phase commit cost); "
                          "tls: ChannelConfig(encryption=True); __main__ class: the same records as instances "
                          "of a dataclass defined in __main__ (shipped by value: every batch is pickled by "
                          "epochal.serde's cloudpickle fallback after a failed plain-pickle attempt; the "
                          "source also builds one instance per record)",
               "ceilings": ceilings.DESCRIPTIONS,
               "steady_rate": f"records between the first receiver stamps at ≥ {STEADY_WINDOW[0]:.0%} and "
                              f"≥ {STEADY_WINDOW[1]:.0%} of the run's records / time between them",
               "cpu": "CPU ns per record in the steady window, per side: producer = the source task process "
                      "(epochal, read by the sink from /proc) or the sender process; consumer = the sink task "
                      "process (including its channel reader thread) or the receiver process. On a shared "
                      "machine these depend far less on other tenants than the wall-clock rates",
               "ratio": "median steady rate of an epochal mode / median steady rate of a ceiling; paired ratios "
                        "divide runs of the same repetition",
           },
           "calibration": None, "runs": []}
    t_start = time.monotonic()
    try:
        records = calibrate(args) if any(v in EPOCHAL_MODES for v in args.variants) else None
        doc["calibration"] = records
        for rep in range(args.repetitions):
            k = rep % len(args.variants)
            for v in args.variants[k:] + args.variants[:k]:
                r = (run_epochal(v, records["records"], args) if v in EPOCHAL_MODES else run_ceiling(v, args))
                r["repetition"] = rep
                doc["runs"].append(r)
                print(f"[{time.monotonic() - t_start:5.0f} s] rep {rep} {v:22s} "
                      + (f"steady {harness.fmt(r.get('steady_records_per_s')):>12s} rec/s  load "
                         f"{r['loadavg_1m_before']:.1f}" if "error" not in r else f"ERROR {r['error']}"), flush=True)
    finally:
        harness.finish(doc, info)
        doc["summary"] = aggregate(doc["runs"], args.variants, rb)
        doc["errors"] = [f"rep {r['repetition']} {r['variant']}: {r['error']}" for r in doc["runs"] if "error" in r]
        harness.write_json(args.out, doc)
    print()
    print(render(doc["summary"]))
    return harness.plot_and_exit_code("dataplane", doc, args.plot, args.out)


def calibrate(args) -> dict:
    """Records per epochal run for ~target-seconds, from one short no-checkpoint run (discarded)."""
    probe = 20_000 if args.smoke else 100_000
    rec = run_epochal("epochal no-checkpoint", probe, args)
    rate = rec.get("steady_records_per_s") or rec.get("whole_records_per_s") or 50_000
    return {"probe_records": probe, "probe_steady_records_per_s": rec.get("steady_records_per_s"),
            "probe_error": rec.get("error"),
            "records": int(min(args.max_records, max(probe, rate * args.target_seconds)))}


if __name__ == "__main__":
    sys.exit(main())
