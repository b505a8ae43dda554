"""epochal.serde: what each kind of user object becomes on the wire.

A class "shipped by value" is built the way a task process sees a class of the driver's
``__main__``: defined under ``__name__ == "__main__"`` and reconstructed by cloudpickle, so
no module holds it by name. The end-to-end paths (channels, state, loops, sinks, Spark)
are in test_user_classes.py; these pin down the encoding itself.
"""
from __future__ import annotations

import dataclasses
import pickle
import pickletools

import cloudpickle
import pytest

from epochal import serde
from epochal.windows import WindowResult as Importable  # a class any process finds by name


def _shipped_class():
    ns: dict = {}
    exec("import dataclasses\n@dataclasses.dataclass(frozen=True)\nclass Word:\n    id: int\n    text: str\n",
         {"__name__": "__main__"}, ns)
    return pickle.loads(cloudpickle.dumps(ns["Word"]))


def _globals(payload: bytes) -> list[str]:
    """The module.name pairs a pickle looks up (STACK_GLOBAL after two strings)."""
    out, strings = [], []
    for op, arg, _ in pickletools.genops(payload):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif op.name == "STACK_GLOBAL":
            out.append(".".join(strings[-2:]))
    return out


def test_a_shipped_class_is_written_once_per_batch_and_instances_stay_on_the_c_pickler():
    Word = _shipped_class()
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        pickle.dumps([Word(1, "a")], 5)  # what every task's plain pickle did
    batch = [Word(i, f"w{i}") for i in range(512)]
    payload = serde.dumps(batch)
    assert _globals(payload).count("epochal.serde._load_class") == 1, _globals(payload)
    assert "cloudpickle.cloudpickle._make_skeleton_class" not in _globals(payload), \
        "the batch itself went through cloudpickle"
    first, second = serde.loads(payload), serde.loads(serde.dumps(batch[:3]))
    assert first == batch[:512] and second == batch[:3]
    assert type(first[0]) is type(second[0]), "one class per process, across batches"


def test_shipped_classes_nested_in_state_and_importable_ones_by_reference():
    Word = _shipped_class()
    state = {"k": [Word(1, "a"), Importable("k", 0, 10, 2)], "t": (Word(3, "c"),)}
    payload = serde.dumps(state)
    assert serde.loads(payload) == state
    names = _globals(payload)
    assert f"{Importable.__module__}.WindowResult" in names, names
    assert names.count("epochal.serde._load_class") == 1, names
    plain = Importable("k", 0, 10, 1)
    assert pickle.dumps(plain, 5) == serde.dumps(plain), "importable records must take the plain pickle path unchanged"


def test_what_the_c_pickler_cannot_do_still_falls_back_to_cloudpickle():
    def local():
        @dataclasses.dataclass
        class Local:
            f: object
        return Local

    Local = local()
    record = Local(lambda x: x + 1)
    back = serde.loads(serde.dumps([record]))[0]
    assert back.f(1) == 2


def test_an_unpicklable_record_names_its_type():
    import threading

    with pytest.raises((TypeError, pickle.PicklingError), match="lock"):
        serde.dumps([threading.Lock()])

