"""Key groups of integer key columns, computed in numpy (epochal.columnar.keys.KeyGroups.of):
equal to the record path's key_group_for for every integer type, extreme values, short and
long batches, with nulls (the dictionary path) and for uint64 (hashed another way past 2**63)."""
from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings, strategies as st

from epochal.backends.keygroups import key_group_for
from epochal.columnar.keys import KeyGroups

TYPES = {pa.int8(): 8, pa.int16(): 16, pa.int32(): 32, pa.int64(): 64, pa.uint8(): 8, pa.uint16(): 16,
         pa.uint32(): 32, pa.uint64(): 64}


def _bounds(t: pa.DataType) -> tuple[int, int]:
    bits = TYPES[t]
    return (0, (1 << bits) - 1) if pa.types.is_unsigned_integer(t) else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)


@st.composite
def columns(draw):
    t = draw(st.sampled_from(list(TYPES)))
    lo, hi = _bounds(t)
    value = st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0, min(hi, 1), max(lo, -1)]))
    values = draw(st.lists(value | st.none() if draw(st.booleans()) else value, max_size=120))
    return t, values


@settings(max_examples=200, deadline=None)
@given(column=columns(), max_parallelism=st.sampled_from([1, 2, 7, 128, 32768]))
def test_integer_key_groups_equal_the_record_path(column, max_parallelism):
    t, values = column
    batch = pa.record_batch({"k": pa.array(values, t)})
    assert KeyGroups("k", max_parallelism).of(batch).to_pylist() == [key_group_for(v, max_parallelism) for v in values]


def test_a_long_batch_of_int64_ids():
    ids = list(range(-5000, 5000, 7)) + [2**63 - 1, -2**63]
    batch = pa.record_batch({"id": pa.array(ids, pa.int64()), "x": pa.array([0] * len(ids))})
    assert KeyGroups("id", 128).of(batch).to_pylist() == [key_group_for(i, 128) for i in ids]


def test_uint64_keys_past_int64_hash_as_the_record_path():
    keys = [2**63, 2**64 - 1, 2**63 + 12345] + list(range(40))  # long enough for a vectorized path
    batch = pa.record_batch({"k": pa.array(keys, pa.uint64())})
    assert KeyGroups("k", 128).of(batch).to_pylist() == [key_group_for(k, 128) for k in keys]
