"""``epochal checkpoints``, ``epochal state`` and ``epochal savepoint``: look inside a job's
checkpoints and savepoints from a shell, without running the job.

    epochal checkpoints list file:///tmp/ckpt wordcount      # epochs, sizes, times, savepoints
    epochal checkpoints show file:///tmp/ckpt/wordcount/chk-0000000012
    epochal state file:///tmp/sp-1 count --limit 20          # an operator's keyed state
    epochal state file:///tmp/sp-1 count --format parquet --output count.parquet
    epochal savepoint create file:///tmp/ckpt/wordcount file:///backups/sp-1
    epochal savepoint verify file:///backups/sp-1
    epochal savepoint trigger file:///tmp/ckpt wordcount --to file:///backups/sp-2 [--stop [--drain]]
    epochal sinks lingering file:///tmp/ckpt wordcount --dataflow job.py:flow [--abort]

A URL is a savepoint, a ``chk-<epoch>`` directory or a job's checkpoint directory (its
newest completed checkpoint). A missing or damaged file is an error naming the file
(exit status 1). State files are unpickled: classes your operators keep in state must be
importable (set PYTHONPATH), and read only checkpoints you trust.

``sinks lingering`` lists what the job's sinks left open in their external systems (Kafka
transactional ids that may hold open transactions, PostgreSQL prepared transactions, Delta
and Iceberg data files staged for epochs no table version references) and,
with ``--abort``, ends everything the latest completed checkpoint does not promise
(:mod:`epochal.sinks.lingering`). The sinks' settings (servers, DSNs) come from the dataflow:
``--dataflow path/to/script.py:name`` (the script is run with ``__name__`` other than
``"__main__"``, so its ``if __name__ == "__main__":`` part does not start the job) or
``module:name``.

``savepoint trigger`` asks the *running* job for a savepoint (and with ``--stop`` to stop
with it), as ``JobHandle.savepoint`` / ``stop_with_savepoint`` would in the driver: it
writes a request into the job's checkpoint storage, which the driver polls
(``CheckpointConfig.requests_poll``, :mod:`epochal.runtime.driver.requests`), and prints the
savepoint's URL once the driver answers. ``savepoint create`` copies a checkpoint that is
already complete — of a stopped or crashed job, or of a running one as long as retention
keeps it (a file deleted meanwhile fails the copy, naming it; nothing half-written is a
savepoint).
"""
from __future__ import annotations

import datetime
import json
import os
import sys

from epochal.backends.storage import CheckpointStorage, referenced_bytes
from epochal.errors import ConfigError, EpochalError

#: the environment variable ``epochal savepoint create`` reads the job's signing key from
SIGNING_KEY_ENV = "EPOCHAL_SIGNING_KEY"

__all__ = ["add_parsers", "run"]

_VALUE_WIDTH = 60


def add_parsers(sub) -> None:
    """Add the ``checkpoints``, ``state`` and ``savepoint`` commands to ``sub``."""
    ck = sub.add_parser("checkpoints", help="list a job's checkpoints, or show one checkpoint or savepoint")
    cks = ck.add_subparsers(dest="action", required=True)
    p = cks.add_parser("list", help="epochs, sizes, times, and which were saved as savepoints")
    p.add_argument("storage", help="the job's checkpoint.storage URL")
    p.add_argument("job", help="the job (dataflow) name")
    p.add_argument("--verify", action="store_true", help="read and hash every file of every checkpoint")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p = cks.add_parser("show", help="operators, state sizes, pending sink transactions, plan fingerprint")
    p.add_argument("url", help="a savepoint, a chk-<epoch> directory, or a job's checkpoint directory")
    p.add_argument("--verify", action="store_true", help="read and hash every file")
    p.add_argument("--format", choices=("table", "json"), default="table")
    st = sub.add_parser("state", help="an operator's keyed state in a checkpoint or savepoint")
    st.add_argument("url", help="a savepoint, a chk-<epoch> directory, or a job's checkpoint directory")
    st.add_argument("operator", help="a keyed operator's name")
    st.add_argument("--state", default=None, help="only this state (e.g. 'acc' of a reduce)")
    st.add_argument("--limit", type=int, default=None, help="at most this many rows")
    st.add_argument("--format", choices=("table", "json", "parquet"), default="table",
                    help="table (values as repr), json (one object per line), parquet (needs --output)")
    st.add_argument("--output", "-o", default=None, help="write here instead of stdout (parquet: required)")
    sp = sub.add_parser("savepoint", help="copy a completed checkpoint into a savepoint, or verify one")
    sps = sp.add_subparsers(dest="action", required=True)
    p = sps.add_parser("create", help="copy a completed checkpoint into a new, self-contained savepoint")
    p.add_argument("source", help="a chk-<epoch> directory, a job's checkpoint directory, or a savepoint")
    p.add_argument("target", help="an empty or absent location")
    p.add_argument("--signing-key-file", default=None,
                   help=f"a file holding the job's checkpoint.signing_key (default: ${SIGNING_KEY_ENV}): the source "
                        "must be signed with it and the savepoint is signed with it, so the job restores it")
    p = sps.add_parser("verify", help="check every file of a savepoint or checkpoint (sizes and SHA-256)")
    p.add_argument("url")
    p = sps.add_parser("trigger", help="ask a running job for a savepoint (its driver polls the checkpoint storage)")
    p.add_argument("storage", help="the job's checkpoint.storage URL")
    p.add_argument("job", help="the job (dataflow) name")
    p.add_argument("--to", default=None, help="an empty or absent location (default: <storage>/<job>/savepoints/...)")
    p.add_argument("--stop", action="store_true", help="stop the job with the savepoint (stop_with_savepoint)")
    p.add_argument("--drain", action="store_true",
                   help="with --stop: end event time first, so every window fires (stop_with_savepoint(drain=True))")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the driver's answer")
    sk = sub.add_parser("sinks", help="what a job's sinks left open in external systems")
    sks = sk.add_subparsers(dest="action", required=True)
    p = sks.add_parser("lingering", help="list (and --abort) open transactions no completed checkpoint promises")
    p.add_argument("storage", help="the job's checkpoint.storage URL")
    p.add_argument("job", help="the job (dataflow) name")
    p.add_argument("--dataflow", required=True, help="where the job's Dataflow is: path/to/script.py:name or module:name")
    p.add_argument("--abort", action="store_true", help="end every item no completed checkpoint promises")
    p.add_argument("--format", choices=("table", "json"), default="table")


def run(args) -> int:
    """Run the parsed command; errors go to stderr naming the file (exit status 1)."""
    try:
        if args.command == "checkpoints":
            return _list(args) if args.action == "list" else _show(args)
        if args.command == "state":
            return _state(args)
        if args.command == "sinks":
            return _lingering(args)
        return {"create": _create, "verify": _verify, "trigger": _trigger}[args.action](args)
    except (EpochalError, OSError) as exc:
        print(f"epochal {args.command}: error: {exc}", file=sys.stderr)
        return 1


def load_dataflow(where: str):
    """The Dataflow named by ``path/to/script.py:name`` or ``module:name``."""
    import importlib
    import runpy

    from epochal.dataflow import Dataflow

    path, _, name = where.rpartition(":")
    if not path or not name:
        raise ConfigError(f"--dataflow {where!r}: expected path/to/script.py:name or module:name")
    scope = runpy.run_path(path, run_name="epochal_lingering") if path.endswith(".py") else \
        vars(importlib.import_module(path))
    flow = scope.get(name)
    if not isinstance(flow, Dataflow):
        raise ConfigError(f"--dataflow {where!r}: {name!r} is {type(flow).__name__}, not an epochal Dataflow")
    return flow


def _lingering(args) -> int:
    from epochal.sinks import lingering

    flow = load_dataflow(args.dataflow)
    if flow.name != args.job:
        raise ConfigError(f"--dataflow {args.dataflow!r} is job {flow.name!r}, not {args.job!r}")
    found = lingering.find(flow, args.storage)
    ended = {i.what for i in lingering.end(flow, args.storage)} if args.abort else set()
    rows = [{"sink": i.sink, "system": i.system, "what": i.what,
             "status": "promised (a resume commits it)" if i.promised else ("ended" if i.what in ended else "open"),
             "detail": i.detail} for i in found]
    if args.format == "json":
        for row in rows:
            print(json.dumps(row))
    else:
        print(_table(rows, ["sink", "system", "what", "status", "detail"]) if rows else "nothing left open")
    return 0


def _time(wall) -> str:
    if not isinstance(wall, (int, float)):
        return "-"
    return datetime.datetime.fromtimestamp(wall, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _table(rows: list[dict], columns: list[str]) -> str:
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def _list(args) -> int:
    """The job's checkpoints; for a job of several regions (:mod:`epochal.regions`), whose
    root holds none of its own, every region's, each under its name."""
    from epochal.regions.layout import REGIONS_DIR, regions_with_checkpoints

    storage = CheckpointStorage(args.storage, args.job)
    rows = _checkpoint_rows(storage, args.verify)
    regions = [] if rows else regions_with_checkpoints(storage, args.job)
    if regions:
        base = f"{args.storage.rstrip('/')}/{args.job}/{REGIONS_DIR}"
        by_region = {r: _checkpoint_rows(CheckpointStorage(f"{base}/{r}", args.job), args.verify) for r in regions}
        if args.format == "json":
            print(json.dumps({"job_root": storage.root_url, "regions": by_region}, indent=1))
        else:
            print(f"checkpoints of job {args.job}'s regions {', '.join(regions)} under {base}/<region>")
            print(_table([dict(row, region=r) for r, rs in by_region.items() for row in rs],
                         ["region", "epoch", "status", "reason", "time_utc", "tasks", "bytes", "savepoints"]))
    elif args.format == "json":
        print(json.dumps({"job_root": storage.root_url, "checkpoints": rows}, indent=1))
    elif not rows:
        print(f"no checkpoints under {storage.root_url}")
    else:
        print(f"checkpoints of job {args.job} under {storage.root_url}")
        print(_table(rows, ["epoch", "status", "reason", "time_utc", "tasks", "bytes", "savepoints"]))
    return 0


def _checkpoint_rows(storage: CheckpointStorage, verify: bool) -> list[dict]:
    """One row per checkpoint of ``storage`` (and per savepoint whose checkpoint is gone)."""
    from epochal.state.savepoint import list_recorded

    saved: dict[int, list[str]] = {}
    for rec in list_recorded(storage):
        saved.setdefault(rec["epoch"], []).append(rec["url"])
    rows = []
    for epoch in storage.all_epochs():
        meta, status = None, "incomplete"
        try:
            meta = storage.read_metadata(epoch)
            status = "complete"
            if verify:
                status = ("damaged: " + why) if (why := storage.first_bad_file(meta, True)) else "complete, verified"
        except EpochalError as exc:
            status = "incomplete" if "is missing" in str(exc) else f"damaged: {exc}"
        rows.append({"epoch": epoch, "status": status, "reason": (meta or {}).get("reason", "-"),
                     "time_utc": _time((meta or {}).get("wall_time")), "tasks": len((meta or {}).get("tasks", {})),
                     "bytes": referenced_bytes(meta) if meta else 0, "savepoints": " ".join(saved.pop(epoch, []))})
    for epoch, urls in sorted(saved.items()):  # savepoints whose checkpoint retention deleted since
        rows.append({"epoch": epoch, "status": "deleted (savepoint kept)", "reason": "-", "time_utc": "-",
                     "tasks": "-", "bytes": "-", "savepoints": " ".join(urls)})
    rows.sort(key=lambda r: r["epoch"])
    return rows


def _show(args) -> int:
    from epochal.state.listing import describe
    from epochal.state.location import open_checkpoint

    ckpt = open_checkpoint(args.url)
    if args.verify:
        ckpt.verify(hash=True)
    d = describe(ckpt)
    if args.format == "json":
        print(json.dumps(d, indent=1, default=repr))
        return 0
    print(f"{d['kind']} of job {d['job']}, epoch {d['epoch']} ({d['reason']}), taken {_time(d['wall_time'])} UTC")
    print(f"  location          {d['location']}")
    if d["savepoint"]:
        print(f"  saved from        {d['savepoint'].get('source')} at {_time(d['savepoint'].get('created'))} UTC")
    print(f"  plan fingerprint  {d['plan_fingerprint']}   max_parallelism {d['max_parallelism']}   "
          f"generation {d['generation']}")
    print(f"  files             {d['files']} ({d['bytes']} bytes)" + ("; all verified" if args.verify else ""))
    print("\noperators (operators chained into one task share its state files)")
    print(_table([dict(o, chained_with=",".join(o["chained_with"]) or "-") for o in d["operators"]],
                 ["operator", "kind", "parallelism", "tasks", "state_bytes", "chained_with"]))
    print(f"\npending sink transactions ({len(d['sink_transactions'])}; a restore re-commits them)")
    if d["sink_transactions"]:
        print(_table(d["sink_transactions"], ["operator", "task", "epoch", "handle"]))
    for title, key, cols in (("loop logs", "loop_logs", ["operator", "task", "records", "segments", "bytes"]),
                             ("channel state", "channel_state", ["task", "channel", "records", "segments", "bytes"])):
        if d[key]:
            print(f"\n{title}")
            print(_table(d[key], cols))
    return 0


def _cell(value, limit: int = _VALUE_WIDTH) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _state(args) -> int:
    from epochal.state.reader import keyed_entries, read

    if args.limit is not None and args.limit < 0:
        raise ConfigError(f"--limit: expected an integer >= 0, got {args.limit}")
    if args.format == "parquet":
        if not args.output:
            raise ConfigError("--format parquet writes a file: pass --output FILE")
        import pyarrow.parquet as pq

        table = read(args.url, args.operator, state=args.state, limit=args.limit)
        pq.write_table(table, args.output)
        print(f"{table.num_rows} rows of {args.operator!r} written to {args.output}")
        return 0
    rows = []
    for row in keyed_entries(args.url, args.operator, args.state):
        if args.limit is not None and len(rows) >= args.limit:
            break
        rows.append(row)
    out = open(args.output, "w") if args.output else sys.stdout
    try:
        if args.format == "json":
            for key, kg, state, kind, mk, value in rows:
                out.write(json.dumps({"key": _jsonable(key), "key_group": kg, "state": state, "kind": kind,
                                      "map_key": _jsonable(mk), "value": _jsonable(value)}) + "\n")
        else:
            out.write(_table([{"key": _cell(k), "key_group": g, "state": s, "map_key": "-" if kind == "value"
                               else _cell(m), "value": _cell(v)} for k, g, s, kind, m, v in rows],
                             ["key", "key_group", "state", "map_key", "value"]) + "\n")
            out.write(f"({len(rows)} rows{'' if args.limit is None or len(rows) < args.limit else ', --limit'})\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def _create(args) -> int:
    from epochal.state.location import open_checkpoint
    from epochal.state.savepoint import write_savepoint

    key = _signing_key(args)
    ckpt = open_checkpoint(args.source, signing_key=key)  # verified with the key before anything is copied
    marker = write_savepoint(ckpt, args.target, signing_key=key)
    print(f"savepoint of job {marker['job']} epoch {marker['epoch']} written to {args.target} "
          f"({len(marker['files'])} files, {marker['bytes']} bytes)")
    return 0


def _signing_key(args) -> bytes | None:
    """The key of ``--signing-key-file`` or ``$EPOCHAL_SIGNING_KEY`` (never argv), or None:
    the text, as ``CheckpointConfig(signing_key=text)`` takes it (a generated key file,
    ``~/.epochal/signing.key``, works as it is)."""
    from epochal.backends.signing import key_bytes

    text = os.environ.get(SIGNING_KEY_ENV)
    if args.signing_key_file is not None:
        with open(os.path.expanduser(args.signing_key_file), encoding="utf-8") as f:
            text = f.read().strip()
    if not text:
        return None
    try:
        return key_bytes(text)
    except ValueError as exc:
        raise ConfigError(f"savepoint create: the signing key: {exc}") from None


def _trigger(args) -> int:
    from epochal.runtime.driver import requests

    if args.drain and not args.stop:
        raise ConfigError("savepoint trigger: --drain ends event time before stopping: it needs --stop")
    storage = CheckpointStorage(args.storage, args.job)
    rid = requests.submit(storage, args.to, args.stop, args.drain)
    answer = requests.wait_answer(storage, rid, args.timeout)
    if answer is None:
        if requests.taken(storage, rid):
            raise EpochalError(f"the driver of job {args.job} took the request but did not answer within "
                               f"{args.timeout:g} s (--timeout); its answer will be in {storage.file_url(f'_requests/{rid}.done.json')}")
        requests.withdraw(storage, rid)
        raise EpochalError(f"no driver of job {args.job} answered within {args.timeout:g} s: is it running with "
                           f"checkpoint storage {args.storage} and requests_poll enabled? (request withdrawn)")
    if "error" in answer:
        raise EpochalError(f"the savepoint failed: {answer['error']}")
    print(answer["url"])
    print(f"savepoint of job {args.job} at epoch {answer.get('epoch')}" + (", job drained and stopped" if args.drain else ", job stopped" if args.stop else ""),
          file=sys.stderr)
    return 0


def _verify(args) -> int:
    from epochal.state.location import open_checkpoint

    ckpt = open_checkpoint(args.url)
    ckpt.verify(hash=True)
    files = ckpt.handles()
    print(f"{ckpt.kind} {args.url} (job {ckpt.meta.get('job')}, epoch {ckpt.epoch}): all {len(files)} files present "
          f"and intact ({sum(h.size for h in files)} bytes)")
    return 0
