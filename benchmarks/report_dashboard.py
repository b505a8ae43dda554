"""The Results section of ``benchmarks/dashboard.py`` (what the web dashboard costs a job)."""
from __future__ import annotations

from report_sections import _command, _n, _section


def section_dashboard(doc: dict) -> str:
    s, args = doc["summary"], doc["args"]
    rows = []
    for mode in ("no-ui", "ui-polled"):
        rates = s[mode]["records_per_s"]
        runs = [r for r in doc["runs"] if r["mode"] == mode and "error" not in r]
        rows.append([mode, str(len(runs)), _n(rates["median"]), f"{_n(rates['min'])}–{_n(rates['max'])}",
                     _n(s[mode]["driver_cpu_s_per_s"]["median"], ".3f"),
                     _n((s[mode].get("records_per_cpu_s") or {}).get("median")),
                     _n(sum(r.get("polls", 0) for r in runs)) if mode == "ui-polled" else "–",
                     _n(sum(r["loadavg_1m_before"] for r in runs) / len(runs), ".1f") if runs else "–"])
    full = s.get("full_page") or {}
    poller = ("the real page in the system Chromium on the same two cores (it also draws every answer)"
              if args.get("poller") == "browser" else "an HTTP client fetching `/api/state` as the page's script does")
    text = (f"The two-shuffle word count ({_n(args['records'])} lines, parallelism {args['parallelism']}, exactly-once, "
            f"{args['interval']:g} s checkpoints, runtime `{args['runtime']}`) with no dashboard and with one polled every "
            f"{args['poll_interval']:g} s by {poller}; repetitions interleaved ({_command(doc)}). "
            f"Throughput ratio of the medians, polled / none: **{_n(s['ratio_ui_polled_to_no_ui'], '.3f')}**; records "
            f"per CPU second of every process of the run (driver, tasks, the page's client), polled / none: "
            f"**{_n(s.get('cpu_efficiency_ratio_ui_polled_to_no_ui'), '.3f')}** — on this "
            "shared machine the runs' spread is far wider than the effect, so the direct measures matter: one poll "
            f"costs the driver {_n(s['poll_cpu_ms']['median'], '.2f')} ms of CPU (median over runs, the page of each "
            f"run at its end; {_n(100 * (s['poll_core_share'] or 0), '.2f')} % of one core at this rate), and "
            f"{_n(full.get('cpu_ms'), '.1f')} ms for the largest page the driver can serve ({full.get('rows')} "
            f"checkpoint rows kept, {full.get('points_kept')} points per series, {_n(full.get('bytes'))} bytes; "
            f"{_n(100 * (s.get('full_page_core_share') or 0), '.2f')} % of one core)"
            + (f"; the dashboard added {_n(s['dashboard_extra_driver_cores'], '.4f')} CPU-seconds per second to the "
               f"driver's process, **{_n(100 * s['dashboard_cpu_share_of_job'], '.2f')} %** of the "
               f"{_n(s['job_cores_no_ui'], '.2f')} cores the whole job used without it (the most a job saturating "
               "its cores can lose to it)" if s.get("dashboard_cpu_share_of_job") is not None else "")
            + ". *driver CPU*: CPU seconds of the "
            "driver's process (coordinator, reporter, dashboard server"
            + (")" if args.get("poller") == "browser" else " and the HTTP poller)") + " per second of run.")
    return _section("The dashboard's cost" + (" (a browser on the same machine)" if args.get("poller") == "browser"
                                               else ""), text,
                    ["mode", "runs", "records/s median", "min–max", "driver CPU s/s", "records per CPU s", "polls",
                     "load"], rows)
