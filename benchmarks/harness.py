"""Helpers shared by the epochal benchmarks: machine description, statistics, output.

Nothing here is shipped to tasks (pipeline functions live in each benchmark script, which
runs as ``__main__`` and is therefore pickled by value).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    """Where the numbers came from: cores, memory, load, versions, git state."""
    info = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_total_gb": _mem_total_gb(),
        "loadavg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "pyspark": _version("pyspark"),
        "epochal": _version("epochal"),
        "java": _java_version(),
    }
    info.update(git_state())
    return info


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values. With few samples a
    high percentile is simply the maximum — read p99 as "worst observed"."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summary(values: list[float]) -> dict:
    """``{"median", "min", "max", "raw"}`` of a list of measurements."""
    return {"median": median(values), "min": min(values, default=None), "max": max(values, default=None),
            "raw": list(values)}


def compare(runs: list[dict], field: str, by: str, reference: str, names: list[str]) -> dict:
    """Per ``name`` of ``names`` (the value of ``runs[i][by]``): the summary of its ``field``
    over the runs without errors, and its ratio to ``reference``'s run of the same repetition
    for each repetition both ran in (side by side: the honest comparison on a noisy machine)."""
    per_rep: dict = {}
    for r in runs:
        per_rep.setdefault(r["repetition"], {})[r[by]] = r.get(field)
    out = {}
    for name in names:
        values = [r[field] for r in runs if r[by] == name and r.get(field)]
        ratios = [reps[name] / reps[reference] for reps in per_rep.values() if reps.get(name) and reps.get(reference)]
        out[name] = {field: summary(values), f"vs_{reference.replace('-', '_')}_per_repetition": ratios}
    return out


def write_and_report(out: Path, doc: dict, info: dict, lines: list[str]) -> int:
    """Finish ``doc``, write it to ``out``, print ``lines`` (one per result) and any errors;
    the process's exit code: 1 if ``doc["errors"]``, else 0."""
    finish(doc, info)
    write_json(out, doc)
    print(f"wrote {out}")
    for line in lines:
        print(f"  {line}")
    if doc["errors"]:
        print("ERRORS:\n  " + "\n  ".join(doc["errors"]), file=sys.stderr)
        return 1
    return 0


def rotated(items: list, k: int) -> list:
    """``items`` rotated left by ``k`` (abc, bca, cab, ...): with ``k`` = the repetition,
    no mode always runs first, so drift and noise hit every mode alike."""
    items = list(items)
    if not items:
        return items
    k %= len(items)
    return items[k:] + items[:k]


def jsonl_rows(directory: str, prefix: str = "") -> list:
    """The parsed rows of the committed ``part-*`` files a jsonl FileSink wrote to
    ``directory`` (empty when it does not exist); with ``prefix`` only the rows whose text
    starts with it (cheap filtering of large outputs)."""
    rows = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if name.startswith("part-"):
            with open(os.path.join(directory, name)) as f:
                rows += [json.loads(row) for row in f if row.startswith(prefix) and row.strip()]
    return rows


def write_json(path: Path, data: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path


def run_job(flow, rec: dict, timeout: float, **options):
    """``flow.start(**options)`` and wait up to ``timeout`` s: the JobResult, or ``None``
    with ``rec["error"]`` set (hung and cancelled, or the exception). Records the driver's
    wall time (``rec["wall_s"]``) and the process tree's CPU seconds (``rec["cpu_s"]``)."""
    cpu0, t0 = tree_cpu_seconds(), time.monotonic()
    try:
        handle = flow.start(**options)
        try:
            result = handle.wait(timeout)
        except TimeoutError:
            handle.cancel()
            rec["error"] = f"hung: not finished after {timeout} s (cancelled)"
            return None
    except Exception as exc:  # noqa: BLE001 — a failed run is reported, the others still run
        rec["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        return None
    rec["wall_s"] = time.monotonic() - t0
    cpu1 = tree_cpu_seconds()
    rec["cpu_s"] = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    return result


def new_doc(name: str, args, info: dict) -> dict:
    """The head every results JSON starts with: benchmark name, schema version, the command
    line, start time, ``info = machine()`` and the parsed arguments (paths as strings,
    dataclass options as dicts)."""
    def plain(v):
        if isinstance(v, Path):
            return str(v)
        return dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v

    return {"benchmark": name, "schema_version": 1, "command": [sys.executable, *sys.argv],
            "started_at": now_iso(), "machine": info, "config": {k: plain(v) for k, v in vars(args).items()}}


def finish(doc: dict, info: dict) -> None:
    """Stamp the end of a benchmark into ``doc``: finished_at, loadavg_at_end and whether the
    working tree changed since ``info = machine()`` was taken at the start."""
    doc["finished_at"] = now_iso()
    doc["loadavg_at_end"] = list(os.getloadavg())
    doc["code_changed_during_run"] = git_state()["git_diff_sha1"] != info["git_diff_sha1"]


def plot_and_exit_code(name: str, doc: dict, png: Path, out: Path) -> int:
    """Draw ``doc`` with ``report.PLOTS[name]`` (skipped, with a hint, without matplotlib),
    say where the files went, print ``doc["errors"]``; 1 if there were any, else 0."""
    try:
        import report

        report.PLOTS[name](doc, png)
        print(f"wrote {png}")
    except ImportError as exc:
        print(f"no plot ({exc}); pip install 'epochal[bench]'", file=sys.stderr)
    print(f"wrote {out}")
    if doc["errors"]:
        print("ERRORS:\n  " + "\n  ".join(doc["errors"]), file=sys.stderr)
        return 1
    return 0


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def fmt(value, spec: str = ",.0f", missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).rjust(w) if i else str(c).ljust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def _cpu_model() -> str | None:
    try:
        for row in Path("/proc/cpuinfo").read_text().splitlines():
            if row.startswith("model name"):
                return row.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _mem_total_gb() -> float | None:
    try:
        for row in Path("/proc/meminfo").read_text().splitlines():
            if row.startswith("MemTotal:"):
                return round(int(row.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _java_version() -> str | None:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = (out.stderr or out.stdout).strip().splitlines()
    return first[0] if first else None


def git_state() -> dict:
    """Commit, dirtiness, modified files and a digest of the uncommitted diff — compare the
    digest at start and end to see whether the code changed while the benchmark ran."""
    def run(*args):
        try:
            out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout if out.returncode == 0 else None

    status = run("status", "--porcelain")
    diff = run("diff", "HEAD")
    commit = run("rev-parse", "HEAD")
    return {
        "git_commit": commit.strip() if commit else None,
        "git_dirty": bool(status.strip()) if status is not None else None,
        # other work in progress changes what was measured: name the modified files
        "git_modified": [r[3:] for r in status.splitlines() if r.strip()] if status else [],
        "git_diff_sha1": hashlib.sha1(diff.encode()).hexdigest() if diff is not None else None,
    }


def _stat(path: Path) -> tuple[int, float] | None:
    """``(parent pid, CPU seconds)`` of a ``/proc/<pid>/stat`` file — utime, stime and its
    reaped children's cutime, cstime; ``None`` when the process is gone."""
    try:
        stat = path.read_text()
    except OSError:
        return None
    rest = stat[stat.rindex(")") + 2:].split()
    return int(rest[1]), sum(int(v) for v in rest[11:15]) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system, with its reaped children's) of process ``pid`` so far;
    ``None`` when it is gone or ``/proc`` is missing."""
    stat = _stat(Path(f"/proc/{pid}/stat"))
    return None if stat is None else stat[1]


def tree_cpu_seconds() -> float | None:
    """CPU seconds (user + system) used so far by this process and all its descendants.

    Counts live descendants from ``/proc`` (with the time of the children they reaped)
    plus this process and the children it reaped. Take the difference around a run: on a
    shared machine CPU time per record is far less sensitive to other tenants than wall
    time. On Spark this covers the JVM, the Python daemon and its reused workers; with the
    local runtime the zygote and its forked tasks. ``None`` where ``/proc`` is missing.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(entry / "stat")
        if stat is None:  # exited meanwhile
            continue
        pid = int(entry.name)
        children.setdefault(stat[0], []).append(pid)
        times[pid] = stat[1]
    own = os.times()
    total = own.user + own.system + own.children_user + own.children_system
    stack = list(children.get(os.getpid(), []))
    while stack:
        pid = stack.pop()
        total += times.get(pid, 0.0)
        stack.extend(children.get(pid, []))
    return total
