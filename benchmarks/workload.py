"""The benchmarks' input: deterministic lines of words (standard library only).

One definition for every benchmark script and every peer runner (the peer runners also
run in PyFlink's own virtualenv, hence no other imports). ``tests/test_bench_cli.py``
checks it equals ``tests/pipelines.py`` ``line``, so benchmarks and golden-run tests count
the same input. Scripts that ship ``lines_from`` to epochal tasks register this module
with ``cloudpickle.register_pickle_by_value`` (task processes cannot import it).
"""
from __future__ import annotations

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda"]


def line(split: int, i: int) -> str:
    """Line ``i`` of split ``split``: 1–6 words, a pure function of its position."""
    x = (split * 1_000_003 + i * 7919 + 12345) * 1103515245 % (1 << 31)
    k = 1 + x % 6
    return " ".join(WORDS[(x >> (3 + j)) % len(WORDS)] for j in range(k))


def lines_from(split: int, offset: int):
    """The lines of ``split`` from ``offset`` on (a replayable GeneratorSource function)."""
    i = offset
    while True:
        yield line(split, i)
        i += 1


# ---------------------------------------------------------------------- timestamped events
# The input of benchmarks/event_windows.py: event g (a global index) is (key, t_us, value),
# its event time in integer microseconds. Event time advances EVENT_US per event, minus a
# jitter below the disorder bound, so windows close steadily while a job runs.
EVENT_T0_US = 1_700_000_000 * 1_000_000  # a multiple of 10 s: windows start on round numbers


def event(g: int, keys: int, event_us: int, disorder_us: int) -> tuple:
    """Event ``g``: ``(key, t_us, value)`` — key in ``0 .. keys-1``, value in 1..100,
    ``t_us = T0 + g * event_us - jitter`` with ``0 <= jitter < disorder_us``."""
    x = (g * 1103515245 + 12345) % (1 << 31)
    y = (g * 2654435761 + 97) % (1 << 32)
    return ((x >> 4) % keys, EVENT_T0_US + g * event_us - y % disorder_us, 1 + (x >> 16) % 100)


def events_of(split: int, offset: int, splits: int, per_split: int, keys: int, event_us: int, disorder_us: int):
    """Split ``split`` of ``splits``: events ``g = i * splits + split`` for ``offset <= i < per_split``
    (a replayable GeneratorSource function once the configuration is bound)."""
    for i in range(offset, per_split):
        yield event(i * splits + split, keys, event_us, disorder_us)


# ---------------------------------------------------------------------- Zipf text files
# The input of benchmarks/peers.py's capacity runs: a directory of text files every engine
# reads (epochal's ArrowFileSource and DirectorySource, Spark's readStream.text, Bytewax's
# file source). Words come from a vocabulary of ZIPF_VOCABULARY pseudo-words drawn with
# Zipf's law (rank r with probability ∝ 1/r), 1–8 words a line, one space between words.
ZIPF_VOCABULARY = 20_000


def zipf_vocabulary(n: int = ZIPF_VOCABULARY, seed: int = 7) -> list[str]:
    """``n`` distinct lowercase pseudo-words of 2–10 letters, the same for every seed."""
    import random

    rng, out, seen = random.Random(seed), [], set()
    while len(out) < n:
        w = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 10)))
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def zipf_text(words: int, seed: int, vocabulary: list[str]) -> bytes:
    """About ``words`` words of Zipf-distributed text (whole lines of 1–8 words, each line
    ending in a newline), a pure function of its arguments (numpy, for speed)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    per_line = rng.integers(1, 9, max(1, words * 2 // 9))
    n = int(per_line.sum())
    weights = 1.0 / np.arange(1, len(vocabulary) + 1)
    cdf = np.cumsum(weights) / weights.sum()
    ranks = np.minimum(np.searchsorted(cdf, rng.random(n)), len(vocabulary) - 1)
    lengths = np.array([len(w) for w in vocabulary])
    width = int(lengths.max()) + 1
    table = np.zeros((len(vocabulary), width), np.uint8)
    for i, w in enumerate(vocabulary):
        table[i, :len(w)] = np.frombuffer(w.encode(), np.uint8)
    rows = table[ranks]
    sep = np.full(n, ord(" "), np.uint8)
    sep[np.cumsum(per_line) - 1] = ord("\n")
    rows[np.arange(n), lengths[ranks]] = sep
    keep = np.arange(width)[None, :] <= lengths[ranks][:, None]
    return rows[keep].tobytes()


def zipf_files(directory: str, files: int, words_per_file: int, seed: int = 1) -> dict:
    """Write ``files`` Zipf text files (``part-NNN.txt``) into ``directory`` once and
    return their description: ``{"files": [names], "words": [per file], "counts": [per
    file {word: n}]}`` — the counts taken by plain Python (``str.split`` and a Counter) from
    the written text, the oracle every engine's output is checked against. A directory
    already holding the same description is reused (generating 200M words takes minutes)."""
    import collections
    import json
    import os

    os.makedirs(directory, exist_ok=True)
    marker = os.path.join(directory, "_zipf.json")
    spec = {"files": files, "words_per_file": words_per_file, "seed": seed, "vocabulary": ZIPF_VOCABULARY}
    if os.path.exists(marker):
        with open(marker) as f:
            doc = json.load(f)
        if doc.get("spec") == spec:
            return doc
    vocabulary = zipf_vocabulary()
    doc = {"spec": spec, "files": [], "words": [], "counts": []}
    for i in range(files):
        text = zipf_text(words_per_file, seed * 100_003 + i, vocabulary)
        name = f"part-{i:03d}.txt"
        with open(os.path.join(directory, name), "wb") as f:
            f.write(text)
        counts = collections.Counter(text.decode().split())
        doc["files"].append(name)
        doc["words"].append(sum(counts.values()))
        doc["counts"].append(dict(counts))
    with open(marker + ".tmp", "w") as f:
        json.dump(doc, f)
    os.replace(marker + ".tmp", marker)
    return doc
