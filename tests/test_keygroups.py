"""Key groups (seed 004 §4.2.1–4.2.2): stable hashing, ranges, routing."""
import collections
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.backends import keygroups
from epochal.backends.keygroups import (
    DEFAULT_MAX_PARALLELISM,
    KeyGroupAssigner,
    key_group_for,
    key_group_range,
    stable_hash,
    subtask_for_key_group,
)
from epochal.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]

SAMPLE_KEYS = [
    None, True, False, 0, 1, -1, 2**40, -(2**63), 2**63, 2**200, -(2**100), 1.5, -0.0, 1e300,
    float("inf"), float("nan"), "", "a", "word", "ünïcødé", "\ud800", b"", b"\x00\xff",
    ("a", 1), ("a", ("b", None)), (), frozenset({"x", 2}), frozenset(),
]

atoms = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text() | st.binary()
)
keys = st.recursive(
    atoms,
    lambda inner: st.tuples(inner, inner) | st.lists(inner, max_size=4).map(tuple)
    | st.frozensets(atoms, max_size=4),
    max_leaves=8,
)


def _hashes_in_subprocess(seed: str) -> list[int]:
    code = (
        "import json, pickle, sys\n"
        "from epochal.backends.keygroups import stable_hash\n"
        "keys = pickle.loads(bytes.fromhex(sys.stdin.read()))\n"
        "print(json.dumps([stable_hash(k) for k in keys]))\n"
    )
    env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(SAMPLE_KEYS).hex(),
        capture_output=True, text=True, env=env, check=True, cwd=REPO,
    )
    return json.loads(out.stdout)


def test_hash_is_identical_across_processes_with_different_hash_seeds():
    here = [stable_hash(k) for k in SAMPLE_KEYS]
    assert _hashes_in_subprocess("1") == here
    assert _hashes_in_subprocess("4242") == here
    # Python's own hash differs between those processes for str: we must not rely on it.


def test_golden_values_never_change():
    # Checkpoints written by one epochal version are restored by the next: changing the
    # hash re-routes keys away from their state. Change these only with a format bump.
    golden_keys = ["word", 7, ("a", 1), b"x", None, 1.5, frozenset({"a", "b"})]
    assert [stable_hash(k) for k in golden_keys] == [
        0x6C318FBC, 0x740729CBE468D1DD, 0xDE40E614, 0xBFD1AFE9, 0xE1DA90D4, 0x38BD9646, 0x63467A42,
    ]
    assert [key_group_for(k, 128) for k in golden_keys] == [60, 93, 20, 105, 84, 70, 66]
    assert stable_hash(0) == 0 and stable_hash(1) == 0xB456BCFC34C2CB2C


def test_equal_dict_keys_hash_equal_and_types_are_tagged():
    assert stable_hash(1) == stable_hash(True) == stable_hash(1.0)
    assert stable_hash(0) == stable_hash(False) == stable_hash(-0.0)
    assert stable_hash(2**70) == stable_hash(float(2**70))
    assert stable_hash(1) != stable_hash("1")
    assert stable_hash("1") != stable_hash(b"1")
    assert stable_hash(("ab", "c")) != stable_hash(("a", "bc"))
    assert stable_hash((1, "x")) == stable_hash((True, "x")) == stable_hash((1.0, "x"))
    assert stable_hash(frozenset({"a", "b", 3})) == stable_hash(frozenset({3, "b", "a"}))
    assert stable_hash(float("nan")) == stable_hash(float("nan"))


def test_enum_subclasses_hash_like_their_values():
    import enum

    class Color(enum.IntEnum):
        RED = 3

    class Name(str, enum.Enum):
        A = "a"

    assert stable_hash(Color.RED) == stable_hash(3)
    assert stable_hash(Name.A) == stable_hash("a")


@pytest.mark.parametrize("bad", [[1], {"a": 1}, {1}, object(), bytearray(b"x"), ("ok", [1])])
def test_unsupported_key_types_raise_type_error_naming_the_type(bad):
    with pytest.raises(TypeError, match=r"key of type \w+ is not supported by key_by: use str/int"):
        stable_hash(bad)


@pytest.mark.parametrize(
    "make", [lambda i: f"user-{i}", lambda i: i, lambda i: i * 128, lambda i: (i % 7, str(i))]
)
def test_keys_spread_evenly_over_key_groups(make):
    n = 128 * 200
    counts = collections.Counter(key_group_for(make(i), 128) for i in range(n))
    assert len(counts) == 128
    # expected 200 per group, sd ~14: a 5-sigma band
    assert min(counts.values()) > 130 and max(counts.values()) < 270
    chi2 = sum((c - 200) ** 2 / 200 for c in counts.values())
    assert chi2 < 220  # 127 dof: p(chi2 > 220) < 1e-6


@settings(max_examples=300, deadline=None)
@given(key=keys, max_p=st.integers(1, 4096))
def test_key_group_is_in_range_and_deterministic(key, max_p):
    kg = key_group_for(key, max_p)
    assert 0 <= kg < max_p
    assert kg == key_group_for(key, max_p)


@settings(max_examples=500, deadline=None)
@given(data=st.data(), max_p=st.integers(1, 2048))
def test_ranges_partition_and_agree_with_subtask_for_key_group(data, max_p):
    p = data.draw(st.integers(1, max_p))
    ranges = [key_group_range(i, p, max_p) for i in range(p)]
    assert ranges[0].start == 0 and ranges[-1].stop == max_p
    for a, b in zip(ranges, ranges[1:]):
        assert a.stop == b.start
    sizes = {len(r) for r in ranges}
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    kg = data.draw(st.integers(0, max_p - 1))
    owner = subtask_for_key_group(kg, p, max_p)
    assert kg in ranges[owner]


def test_exhaustive_small_consistency():
    for max_p in range(1, 65):
        for p in range(1, max_p + 1):
            for i in range(p):
                for kg in key_group_range(i, p, max_p):
                    assert subtask_for_key_group(kg, p, max_p) == i


def test_flink_formula_examples():
    assert [key_group_range(i, 3, 128) for i in range(3)] == [range(0, 43), range(43, 86), range(86, 128)]
    assert key_group_range(0, 1, DEFAULT_MAX_PARALLELISM) == range(0, 128)
    assert DEFAULT_MAX_PARALLELISM == 128


@pytest.mark.parametrize(
    "call",
    [
        lambda: key_group_range(0, 129, 128),
        lambda: key_group_range(0, 0, 128),
        lambda: key_group_range(3, 3, 128),
        lambda: key_group_range(-1, 3, 128),
        lambda: key_group_range(0, 1, 0),
        lambda: subtask_for_key_group(0, 200, 128),
        lambda: subtask_for_key_group(128, 2, 128),
    ],
)
def test_invalid_arguments_raise_config_error(call):
    with pytest.raises(ConfigError):
        call()


def test_parallelism_above_max_parallelism_message():
    with pytest.raises(ConfigError, match="exceeds max_parallelism 128"):
        key_group_range(0, 129, 128)


# ------------------------------------------------------------------ KeyGroupAssigner

TRICKY = SAMPLE_KEYS + [
    1.0, 0.0, 0, False, True, 2.0**64, 2**64, -(2**63) - 1, 2**63 - 1, float("-inf"),
    "1", b"1", "\u00e9", "e\u0301", "\U0001f600", "\udfff", "a\x00b", ("a",), ((),), (1, 1.0, True),
    (None, b"x", "y", -0.0), frozenset({1}), frozenset({1.0}),
]
#: plain keys only (the memo's domain); tuples of them
plain = st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary()
batch_keys = st.lists(plain | st.tuples(plain, plain) | st.sampled_from(TRICKY), max_size=80)


def _reference(keys_, max_p):
    return [key_group_for(k, max_p) for k in keys_]


@pytest.mark.parametrize("max_p", [1, 7, 128, 32768])
def test_assigner_equals_key_group_for_on_tricky_keys(max_p):
    kgs = KeyGroupAssigner(max_p)
    assert [kgs.assign(k) for k in TRICKY] == _reference(TRICKY, max_p)
    assert [kgs.assign(k) for k in TRICKY] == _reference(TRICKY, max_p)  # now from the memo
    assert KeyGroupAssigner(max_p).assign_all(TRICKY) == _reference(TRICKY, max_p)
    assert kgs.assign_all(TRICKY * 3) == _reference(TRICKY, max_p) * 3


@pytest.mark.parametrize("vectorized", [True, False])
@pytest.mark.parametrize("make", [
    lambda i: f"user-{i}", lambda i: f"ünï-{i % 50}", lambda i: f"\udc80{i % 40}", lambda i: i * 2654435761, lambda i: -i,
    lambda i: i % 2 == 0, lambda i: 2**64 + i if i % 97 == 0 else i,  # beyond 64 bits: stable_hash's path
])
def test_assign_all_equals_key_group_for_on_batches(monkeypatch, vectorized, make):
    if not vectorized:
        monkeypatch.setattr(keygroups, "_np", None)
    kgs = KeyGroupAssigner(128, memo_limit=300)
    seen = []
    for start in range(0, 2000, 250):  # batches of new and repeated keys; the memo is cleared on the way
        batch = [make(i) for i in range(start // 2, start // 2 + 250)]
        seen.append(kgs.assign_all(batch) == _reference(batch, 128))
        assert len(kgs._memo) <= 300
    assert all(seen)


@settings(max_examples=400, deadline=None)
@given(batches=st.lists(batch_keys | st.lists(st.text(), min_size=30, max_size=60), max_size=6),
       max_p=st.sampled_from([1, 2, 3, 128, 1000, 32768]), limit=st.integers(1, 64), bypass=st.integers(0, 2))
def test_assigner_equals_key_group_for_property(batches, max_p, limit, bypass):
    kgs = KeyGroupAssigner(max_p, memo_limit=limit, bypass_batches=bypass)
    for batch in batches:
        assert kgs.assign_all(batch) == _reference(batch, max_p)
        assert [kgs.assign(k) for k in batch] == _reference(batch, max_p)
        assert len(kgs._memo) <= limit


@settings(max_examples=300, deadline=None)
@given(a=plain | st.tuples(plain, plain), b=plain | st.tuples(plain, plain))
def test_equal_plain_keys_hash_equal_which_the_memo_relies_on(a, b):
    if a == b:
        assert stable_hash(a) == stable_hash(b)


def test_assign_all_skips_the_memo_while_most_keys_are_new_then_probes_it_again():
    kgs = KeyGroupAssigner(128, bypass_batches=2)
    ids = [[f"id-{b}-{i}" for i in range(64)] for b in range(4)]
    words = [f"w{i % 5}" for i in range(64)]
    assert kgs.assign_all(ids[0]) == _reference(ids[0], 128)
    assert kgs._bypass == 2 and len(kgs._memo) == 64
    for batch in (ids[1], words):  # two batches without the memo: nothing learnt
        assert kgs.assign_all(batch) == _reference(batch, 128)
    assert kgs._bypass == 0 and len(kgs._memo) == 64
    assert kgs.assign_all(words) == _reference(words, 128)  # the probe: 5 new keys of 64, memo on
    assert kgs._bypass == 0 and len(kgs._memo) == 69
    assert kgs.assign_all(words) == _reference(words, 128) and len(kgs._memo) == 69


def test_assigner_rejects_what_stable_hash_rejects_even_if_an_equal_key_is_memoized():
    import decimal
    import fractions

    import numpy as np

    kgs = KeyGroupAssigner(128)
    kgs.assign_all([1, 1, 1])
    kgs.assign((1, "a"))
    for bad in [decimal.Decimal(1), fractions.Fraction(1), np.int64(1), (decimal.Decimal(1), "a"), [1], {1: 2}]:
        with pytest.raises(TypeError, match="is not supported by key_by"):
            kgs.assign(bad)
        with pytest.raises(TypeError, match="is not supported by key_by"):
            kgs.assign_all([1, bad])


def test_assigner_subclass_keys_hash_like_their_values():
    import enum

    class Color(enum.IntEnum):
        RED = 3

    class Name(str, enum.Enum):
        A = "a"

    kgs = KeyGroupAssigner(128)
    assert kgs.assign_all([Color.RED, 3, Name.A, "a"]) == _reference([3, 3, "a", "a"], 128)


def test_assigner_validates_max_parallelism():
    with pytest.raises(ConfigError):
        KeyGroupAssigner(0)
