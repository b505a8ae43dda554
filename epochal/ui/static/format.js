// epochal dashboard: number formatting and chart axes, pure functions (no DOM).
// The page loads it before app.js (window.epochalFormat); node loads it with require() for
// tests/test_dashboard_format.py. Every figure changes its unit with its magnitude:
// durations ms → s → min → h, rates and counts → k → M, bytes B → KiB → … → TiB.
"use strict";
(function (root) {
  const missing = (x) => x === null || x === undefined || Number.isNaN(x);
  // [unit, seconds] from the largest; a duration is written in the largest unit it reaches
  const TIME_UNITS = [["h", 3600], ["min", 60], ["s", 1], ["ms", 1e-3], ["µs", 1e-6]];
  const COUNT_UNITS = [["G", 1e9], ["M", 1e6], ["k", 1e3], ["", 1]];
  const BYTE_UNITS = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10], ["B", 1]];

  function pick(units, x) {  // the largest unit that x reaches (the smallest when it reaches none)
    const a = Math.abs(x);
    return units.find(([, f]) => a >= f) || units[units.length - 1];
  }
  function digits(v) {  // three significant figures at most, no trailing zeros
    const a = Math.abs(v);
    const s = a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : v.toFixed(2);
    return s.includes(".") ? s.replace(/\.?0+$/, "") : s;
  }
  function inUnit(units, x, unit, sep) {
    const f = units.find(([u]) => u === unit)[1];
    return digits(x / f) + (unit ? sep + unit : "");
  }

  /** seconds → "850 ms", "12.5 s", "3.5 min", "2.25 h"; "–" when unknown */
  function fmtS(x) {
    if (missing(x)) return "–";
    if (x === 0) return "0 s";
    return inUnit(TIME_UNITS, x, pick(TIME_UNITS, x)[0], " ");
  }
  /** a count or a rate → "850", "12.5k", "3.2M" */
  function fmtRate(x) {
    if (missing(x)) return "–";
    return inUnit(COUNT_UNITS, x, pick(COUNT_UNITS, x)[0], "");
  }
  /** bytes → "512 B", "1.5 KiB", "3.25 GiB" */
  function fmtBytes(x) {
    if (missing(x)) return "–";
    return inUnit(BYTE_UNITS, x, pick(BYTE_UNITS, x)[0], " ");
  }
  /** a share 0..1 → "97 %" */
  function fmtPct(x) {
    return missing(x) ? "–" : `${Math.round(100 * x)} %`;
  }

  /** The smallest 1, 2, 2.5 or 5 × 10^k at least v (v > 0). */
  function niceCeil(v) {
    if (!(v > 0)) return 1;
    const p = 10 ** Math.floor(Math.log10(v));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v * (1 - 1e-12)) return m * p;
    return 10 * p;
  }
  /** A chart's value axis for values up to vmax of a kind ("time" s, "count", "bytes", "plain"):
   * {max, ticks: [{value, label}], unit}. The axis picks one unit from its top value, rounds
   * that up to a nice number in the unit, and labels 0, half and top in it. */
  function axis(kind, vmax) {
    const units = {time: TIME_UNITS, count: COUNT_UNITS, bytes: BYTE_UNITS}[kind];
    const top = Math.max(vmax || 0, 0);
    if (!units) {
      const max = niceCeil(top || 1);
      return {max, unit: "", ticks: [0, 0.5, 1].map((f) => ({value: max * f, label: digits(max * f)}))};
    }
    const [unit, f] = top > 0 ? pick(units, top) : units[units.length - (kind === "time" ? 3 : 1)];
    const max = niceCeil(top > 0 ? top / f : 1) * f;
    const sep = kind === "count" ? "" : " ";
    return {max, unit, ticks: [0, 0.5, 1].map((k) => ({value: max * k,
      label: k === 0 ? "0" : inUnit(units, max * k, unit, sep)}))};
  }
  /** seconds of a time axis' span → "45 s", "12 min", "3 h" */
  function fmtSpan(s) {
    return missing(s) ? "–" : fmtS(s >= 60 ? Math.round(s / 60) * 60 : Math.round(s));
  }

  const api = {fmtS, fmtRate, fmtBytes, fmtPct, fmtSpan, niceCeil, axis};
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.epochalFormat = api;
})(this);
