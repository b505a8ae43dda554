"""The ``epochal`` command: ``epochal bench ...`` runs the benchmarks and regenerates their report;
``epochal checkpoints | state | savepoint ...`` look inside checkpoints and savepoints
(:mod:`epochal.state.commands`); ``epochal ui <storage> <job>`` serves the read-only dashboard
of a job started elsewhere, from its checkpoint storage (:mod:`epochal.ui.offline`).

    epochal bench chain --smoke            # one benchmark, tiny sizes, local runtime, results in a temp dir
    epochal bench all                      # every benchmark below → benchmarks/results/
    epochal bench peers -- --engines epochal bytewax   # arguments after -- go to the script

Each benchmark script runs in its own process (``python benchmarks/<name>.py``); its output
is shown line by line with the elapsed time, and a heartbeat says it is still running when
it is quiet. Afterwards ``benchmarks/report.py`` rewrites the plots and ``README_SECTION.md``
in the results directory. The benchmark scripts live in the source tree (``benchmarks/``
next to the ``epochal`` package), not in the installed wheel; point ``--benchmarks`` at
them otherwise.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

#: the environment variable ``epochal ui`` reads its token from (or ``--token-file``; never argv)
UI_TOKEN_ENV = "EPOCHAL_UI_TOKEN"
BENCHMARKS = ("throughput", "latency", "chain", "alignment", "recovery", "state", "window", "event_windows", "peers",
              "dataplane")
RUNTIME_FLAG = {"throughput", "latency", "chain", "alignment", "recovery", "state", "window",
                "event_windows"}  # take --runtime
HEARTBEAT_S = 30.0


def _default_benchmarks_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "benchmarks"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epochal", description="epochal command line")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="run benchmarks, then regenerate plots and the README results section",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("which", nargs="?", default="all", choices=(*BENCHMARKS, "all", "report"),
                       help="a benchmark, 'all', or 'report' (only regenerate the report); default all")
    bench.add_argument("--smoke", action="store_true", help="tiny sizes (seconds each); results in a temp dir")
    bench.add_argument("--runtime", choices=("spark", "local"), default=None,
                       help="engine runtime for the epochal benchmarks (default: each script's own — spark for "
                            "throughput/latency/chain, local for alignment/recovery/state/window; local with --smoke)")
    bench.add_argument("--results", type=Path, default=None,
                       help="directory for JSON, PNG and README_SECTION.md (default benchmarks/results; "
                            "a temp dir with --smoke)")
    bench.add_argument("--timeout", type=float, default=None, help="seconds per benchmark before it is stopped")
    bench.add_argument("--benchmarks", type=Path, default=None, help="the benchmarks/ directory of the source tree")
    bench.add_argument("--no-report", action="store_true", help="do not regenerate plots and README_SECTION.md")
    bench.epilog = "Arguments after a lone -- are passed to the benchmark script (one benchmark only)."
    from epochal.state.commands import add_parsers

    add_parsers(sub)
    ui = sub.add_parser("ui", help="serve the read-only dashboard of a job, from its checkpoint storage")
    ui.add_argument("storage", help="the job's checkpoint.storage URL")
    ui.add_argument("job", help="the job (dataflow) name")
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    ui.add_argument("--port", type=int, default=0, help="TCP port (default: any free port)")
    from epochal.query.commands import add_parser as add_query_parser
    from epochal.query.commands import add_token_arguments

    add_token_arguments(ui, UI_TOKEN_ENV, "the secret the page needs (default: a random one)")

    add_query_parser(sub)
    regions = sub.add_parser("regions", help="show the consistent regions of a dataflow: each region's operators, "
                                             "guarantee, checkpoint interval and where its checkpoints go")
    regions.add_argument("dataflow", help="where the job's Dataflow is: path/to/script.py:name or module:name")
    regions.add_argument("--storage", default=None, help="the job's checkpoint.storage URL (to show each region's)")
    return parser


def show_regions(args) -> int:
    """``epochal regions script.py:flow``: the layout :func:`epochal.regions.layout_of` computes."""
    from epochal.errors import EpochalError
    from epochal.regions.layout import layout_of, region_storage_url
    from epochal.state.commands import load_dataflow

    try:
        flow = load_dataflow(args.dataflow)
        parts = layout_of(flow)
    except EpochalError as exc:
        print(f"epochal regions: error: {exc}", file=sys.stderr)
        return 1
    for part in parts:
        r = part.region
        guarantee = r.guarantee.value if r.guarantee is not None else "the job's guarantee"
        interval = f"{r.checkpoint.interval} s" if r.checkpoint is not None else "the job's interval"
        where = region_storage_url(args.storage, flow.name, part, len(parts)) if args.storage else None
        merged = f" (merged: {', '.join(part.merged)})" if len(part.merged) > 1 else ""
        print(f"region {part.name}{merged}: {guarantee}, checkpoint interval {interval}"
              + (f", checkpoints in {where}" if where else ""))
        print(f"  operators: {', '.join(part.nodes)}")
        inside = set(part.nodes)
        for node in part.nodes:  # autonomous channels into the region (seed 000 §3.2)
            for inp in flow._nodes[node].inputs:
                if inp.autonomous and inp.node not in inside:
                    print(f"  autonomous channel: {inp.node} -> {node} (at most once into this region)")
    return 0


def serve_ui(args, wait=None) -> int:
    """``epochal ui``: serve until interrupted (``wait``: what blocks meanwhile; tests pass their own)."""
    from epochal.errors import EpochalError
    from epochal.ui.offline import serve

    from epochal.query.commands import token_from

    try:
        token = token_from(args, UI_TOKEN_ENV, "epochal ui")
    except ValueError as exc:
        print(f"epochal ui: error: {exc}", file=sys.stderr)
        return 2
    try:
        server = serve(args.storage, args.job, host=args.host, port=args.port, token=token)
    except (EpochalError, OSError) as exc:
        print(f"epochal ui: error: {exc}", file=sys.stderr)
        return 1
    for region, url in getattr(server, "urls", {}).items():  # a job of several regions: one page each
        print(f"dashboard of region {region} of job {args.job} (read-only, from {args.storage}): {url}", flush=True)
    if not hasattr(server, "urls"):
        print(f"dashboard of job {args.job} (read-only, from {args.storage}): {server.url}", flush=True)
    try:
        (wait or threading.Event().wait)()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


def _progress(prefix: str, t0: float, text: str) -> None:
    print(f"[{time.monotonic() - t0:6.0f} s] {prefix:10s} | {text}", flush=True)


def run_script(name: str, cmd: list[str], t0: float, timeout: float | None) -> int:
    """Run one benchmark, echoing its output with elapsed time; returns its exit code."""
    _progress(name, t0, "$ " + " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    last = [time.monotonic()]
    done = threading.Event()

    def heartbeat():
        while not done.wait(5.0):
            if time.monotonic() - last[0] >= HEARTBEAT_S:
                _progress(name, t0, "... still running")
                last[0] = time.monotonic()

    threading.Thread(target=heartbeat, daemon=True).start()
    killer = threading.Timer(timeout, proc.kill) if timeout else None
    if killer:
        killer.start()
    try:
        for row in proc.stdout:
            row = row.rstrip()
            if row:
                _progress(name, t0, row)
                last[0] = time.monotonic()
        rc = proc.wait()
    finally:
        done.set()
        if killer:
            killer.cancel()
    if timeout and rc < 0:
        _progress(name, t0, f"stopped after the --timeout of {timeout:.0f} s")
    _progress(name, t0, f"finished with exit code {rc}")
    return rc


def bench(args) -> int:
    bdir = (args.benchmarks or _default_benchmarks_dir()).resolve()
    if not (bdir / "report.py").exists():
        print(f"epochal bench: no benchmark scripts in {bdir}; they live in the source tree's benchmarks/ "
              "directory (pass --benchmarks DIR)", file=sys.stderr)
        return 2
    results = args.results or (Path(tempfile.mkdtemp(prefix="epochal-bench-")) if args.smoke else bdir / "results")
    results.mkdir(parents=True, exist_ok=True)
    extra = args.script_args
    names = [] if args.which == "report" else list(BENCHMARKS) if args.which == "all" else [args.which]
    runtime = args.runtime or ("local" if args.smoke else None)
    t0 = time.monotonic()
    failed = []
    for name in names:
        cmd = [sys.executable, str(bdir / f"{name}.py"), "--out", str(results / f"{name}.json")]
        if args.smoke:
            cmd.append("--smoke")
        if runtime and name in RUNTIME_FLAG:
            cmd += ["--runtime", runtime]
        if len(names) == 1:
            cmd += extra
        if run_script(name, cmd, t0, args.timeout) != 0:
            failed.append(name)
    if not args.no_report:
        rc = run_script("report", [sys.executable, str(bdir / "report.py"), "--results", str(results)], t0, 300)
        if rc != 0:
            failed.append("report")
    _progress("bench", t0, f"results in {results}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args = []
    if "--" in argv:  # everything after a lone -- belongs to the benchmark script
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    args.script_args = script_args
    if args.command == "bench":
        return bench(args)
    if args.command == "ui":
        return serve_ui(args)
    if script_args:
        build_parser().error("arguments after -- are for 'epochal bench' only")
    if args.command == "regions":
        return show_regions(args)
    if args.command == "query":
        from epochal.query.commands import run as run_query

        return run_query(args)
    from epochal.state.commands import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
