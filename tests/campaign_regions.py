"""The campaign's ``regions`` topology (issue 46; the family is ``tests/campaign_topologies.py``):
Figure 1(c) — two consistent regions and an autonomous channel between them — its
plain-Python oracle and its model (:func:`check`, docs/regions.md's guarantee per region),
and :func:`per_region`, how the harness reads a job of regions' metrics."""
from __future__ import annotations

import collections
import sys

import cloudpickle

import epochal as ep
import test_autonomous

cloudpickle.register_pickle_by_value(test_autonomous)
cloudpickle.register_pickle_by_value(test_autonomous.test_regions)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def per_region(metrics: dict) -> list:
    """``[(region, its metrics)]`` of a handle's ``metrics()``: region None for a job of one region."""
    return list(metrics["regions"].items()) if "regions" in metrics else [(None, metrics)]


#: records per source (two splits each) of Figure 1(c), and their rate (records/s per split): ≈ 5 s a run
RECORDS, RATE = 1200, 120.0


def flow(history, target, parallelism: int) -> ep.Dataflow:
    """Figure 1(c) (``test_autonomous.figure_1c``): region ``main`` — orders and the clicks
    channel → a running count per key → the sink; region ``side`` — clicks → ``tag`` → the
    autonomous channel into main. ``(key, n)`` per record; order keys ``o*``, click keys
    ``c*``. The channel's producer (``clicks``, ``tag``) keeps parallelism 2 whatever the
    history's (a restore may not rescale it, docs/regions.md); main runs at ``parallelism``."""
    f = ep.Dataflow("campaign", parallelism=parallelism)
    orders = f.source("orders", ep.sources.GeneratorSource(test_autonomous.order, num_splits=2,
                                                           limit=RECORDS // 2,
                                                           records_per_second=RATE * history.speed),
                      region="main")
    clicks = f.source("clicks", ep.sources.GeneratorSource(test_autonomous.click, num_splits=2,
                                                           limit=RECORDS // 2,
                                                           records_per_second=RATE * history.speed),
                      region="side", parallelism=2)
    tagged = clicks.key_by(lambda c: c).process("tag", test_autonomous.Pass(), parallelism=2)
    target.into(orders.union(tagged.autonomous("clicks-in")).key_by(lambda k: k).process("count", test_autonomous.Count())
                .map("row", tuple))
    return f


def _keyed(gen) -> collections.Counter:
    return collections.Counter(k for s in range(2) for k, _ in zip(gen(s, 0), range(RECORDS // 2)))


def oracle(history) -> collections.Counter:
    """``(k, n)`` for n = 1..count(k) of every order and every click (plain Python)."""
    counts = _keyed(test_autonomous.order) + _keyed(test_autonomous.click)
    return collections.Counter((k, n) for k, c in counts.items() for n in range(1, c + 1))


def check(got, expected, truth, guarantees: set, loose: bool, crossing: set) -> tuple[str, str]:
    """docs/regions.md's guarantees per region. Main's own input (orders) is exactly-once
    whatever happened: ``expected`` (``loose``: every true row, none invented), or none
    lost at least once. The clicks crossing the channel: exactly once while nothing failed
    (``crossing`` empty: as orders); after a failure of the producing region or a driver's
    resume at least once (``"at-least"``: each click key's final count ≥ its truth), after
    one of the reading region at most once (``"at-most"``: ≤); both: no bound. Main counts
    exactly what it took either way, so under exactly-once a click key's rows are (k, 1..final)
    (each once unless ``loose``)."""
    def part(c, keys):
        return collections.Counter({r: n for r, n in c.items() if r[0][0] in keys})

    problems = []
    exact_clicks = not crossing
    for keys, exact in (("o", True), ("c", exact_clicks)):
        g, e, t = part(got, keys), part(expected, keys), part(truth, keys)
        name = "orders" if keys == "o" else "clicks"
        if guarantees == {"exactly-once"} and exact:
            if loose:
                lost, invented = t - g, set(g) - set(t)
                if lost or invented:
                    problems.append((("lost" if lost else "duplicated"),
                                     f"{name}: {sum(lost.values())} lost (e.g. {list(lost)[:3]}), {len(invented)} "
                                     f"invented (e.g. {list(invented)[:3]})"))
            elif g != e:
                lost, extra = e - g, g - e
                problems.append((("lost" if lost else "duplicated"),
                                 f"{name}: {sum(lost.values())} lost (e.g. {list(lost)[:3]}), {sum(extra.values())} "
                                 f"extra (e.g. {list(extra)[:3]})"))
            continue
        final: dict = {}
        for k, n in g:
            final[k] = max(final.get(k, 0), n)
        want = {k: max(n for kk, n in t if kk == k) for k, _ in t}
        if guarantees == {"exactly-once"}:
            holes = [(k, n) for k, top in final.items() for n in range(1, top + 1) if (k, n) not in g]
            twice = [r for r, c in g.items() if c > 1] if not loose else []
            if holes or twice:
                problems.append(("lost" if holes else "duplicated",
                                 f"{name}: main's count of what it took is not exact: {holes[:3]} missing, "
                                 f"{twice[:3]} twice"))
        bound = crossing if not exact else {"at-least"}
        if guarantees != {"exactly-once"} and not exact:
            bound = {"at-least"} if crossing == {"at-least"} else {"none"}
        if bound == {"at-least"}:
            short = {k: (final.get(k, 0), c) for k, c in want.items() if final.get(k, 0) < c}
            if short:
                problems.append(("lost", f"{name}: keys short of their count (got, truth): {short}"))
        elif bound == {"at-most"}:
            over = {k: (n, want.get(k, 0)) for k, n in final.items() if n > want.get(k, 0)}
            if over:
                problems.append(("duplicated", f"{name}: keys beyond their count (got, truth): {over}"))
    if not problems:
        return "ok", ""
    return problems[0][0], "; ".join(d for _, d in problems)
