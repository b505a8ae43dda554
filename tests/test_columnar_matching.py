"""epochal.columnar.matching.equal_key_pairs against a nested loop: every pair of equal,
non-null keys exactly once, for integer and string keys, with nulls, either side larger,
and key columns of different integer types."""
from __future__ import annotations

import collections

import pyarrow as pa
from hypothesis import given, settings, strategies as st

from epochal.columnar.matching import equal_key_pairs


def _nested(a: list, b: list) -> collections.Counter:
    return collections.Counter((i, j) for i, x in enumerate(a) for j, y in enumerate(b) if x is not None and x == y)


keys = st.one_of(st.none(), st.integers(-3, 6))


@settings(max_examples=150, deadline=None)
@given(a=st.lists(keys, max_size=40), b=st.lists(keys, max_size=40), strings=st.booleans(), narrow=st.booleans())
def test_pairs_equal_the_nested_loop(a, b, strings, narrow):
    if strings:
        a, b = ([None if x is None else f"k{x}" for x in side] for side in (a, b))
        left, right = pa.array(a, pa.string()), pa.array(b, pa.string())
    else:
        left, right = pa.array(a, pa.int64()), pa.array(b, pa.int32() if narrow else pa.int64())
    ia, ib = equal_key_pairs(left, right)
    assert len(ia) == len(ib)
    assert collections.Counter(zip(ia.tolist(), ib.tolist())) == _nested(a, b)
