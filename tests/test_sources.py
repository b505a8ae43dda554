"""Replayable sources: snapshot at any poll boundary, restore, continue — no loss, no duplicate."""
from __future__ import annotations

import itertools
import json
import os
import tempfile
import time
import uuid
from collections import Counter

import cloudpickle
import fsspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.errors import PipelineDefinitionError
from epochal.sources import (
    CollectionSource,
    DirectorySource,
    GeneratorSource,
    Poll,
    Source,
    SourceReader,
)

PROPERTY = settings(max_examples=60, deadline=None)
LINE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), max_size=8)


# ---------------------------------------------------------------- helpers

def read_to_end(reader: SourceReader, sizes, *, max_polls: int = 100_000) -> list:
    """Poll until ``finished``; every poll honours its size."""
    out: list = []
    for _ in range(max_polls):
        size = next(sizes)
        poll = reader.poll(size)
        assert len(poll.records) <= size
        assert not (poll.idle and poll.records)
        out.extend(poll.records)
        if poll.finished:
            return out
    raise AssertionError("reader never finished")


def check_snapshot_restore(source: Source, parallelism: int, data, expected_for,
                           normalize=lambda records: records) -> list:
    """For every subtask: read in random poll sizes, snapshot after a random number of polls,
    finish; then restore from the (JSON round-tripped) state — once from the subtask's own
    state, once from the union of all subtasks' states — and finish again.

    ``expected_for(splits)`` is the exact record sequence of those splits (compared after
    ``normalize``). Returns all records.
    """
    source = cloudpickle.loads(cloudpickle.dumps(source))
    splits = source.splits()
    sizes = iter(lambda: data.draw(st.integers(1, 6)), None)
    runs = []
    for subtask in range(parallelism):
        mine = [s for i, s in enumerate(splits) if i % parallelism == subtask]
        reader = source.create_reader(mine, None, subtask=subtask, parallelism=parallelism)
        before: list = []
        finished = False
        for _ in range(data.draw(st.integers(0, 12))):
            poll = reader.poll(next(sizes))
            before.extend(poll.records)
            if poll.finished:
                finished = True
                break
        state = json.loads(json.dumps(reader.snapshot()))
        rest = [] if finished else read_to_end(reader, sizes)
        reader.close()
        assert normalize(before + rest) == normalize(expected_for(mine))
        runs.append((mine, before, state))
    merged: dict = {}
    for _, _, state in runs:
        for key, value in state.items():
            merged[key] = ({**merged.get(key, {}), **value} if isinstance(value, dict)
                           else sorted(set(merged.get(key, [])) | set(value)) if isinstance(value, list)
                           else value)
    everything: list = []
    for subtask, (mine, before, state) in enumerate(runs):
        for restored_from in (state, merged):
            reader = source.create_reader(mine, restored_from, subtask=subtask, parallelism=parallelism)
            after = read_to_end(reader, sizes)
            reader.close()
            assert normalize(before + after) == normalize(expected_for(mine)), (subtask, restored_from)
        everything.extend(before + after)
    return everything


# ---------------------------------------------------------------- CollectionSource

@PROPERTY
@given(items=st.lists(st.integers(), max_size=40), num_splits=st.integers(1, 7),
       parallelism=st.integers(1, 4), data=st.data())
def test_collection_snapshot_restore_no_loss_no_dup(items, num_splits, parallelism, data):
    src = CollectionSource(items, num_splits=num_splits)

    def expected(splits):
        return [items[i] for s in splits for i in src.split_range(s)]

    everything = check_snapshot_restore(src, parallelism, data, expected)
    assert Counter(everything) == Counter(items)


def test_collection_splits_are_contiguous_chunks_in_order():
    src = CollectionSource(range(10), num_splits=3)
    assert src.splits() == [0, 1, 2]
    chunks = [src.create_reader([s], None).poll(100).records for s in range(3)]
    assert chunks == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]


def test_collection_reader_without_splits_finishes_at_once():
    assert CollectionSource([1, 2]).create_reader([], None).poll(5) == Poll([], finished=True)


def test_invalid_arguments_raise_at_build_time():
    with pytest.raises(PipelineDefinitionError, match="num_splits"):
        CollectionSource([1], num_splits=0)
    with pytest.raises(PipelineDefinitionError, match="fn must be callable"):
        GeneratorSource(42)
    with pytest.raises(PipelineDefinitionError, match="records_per_second"):
        GeneratorSource(lambda s, o: iter(()), records_per_second=0)
    with pytest.raises(PipelineDefinitionError, match="format"):
        DirectorySource("/tmp", format="csv")
    with pytest.raises(PipelineDefinitionError, match="utf-16"):
        DirectorySource("/tmp", encoding="utf-16")


def test_poll_rejects_non_positive_size():
    with pytest.raises(ValueError, match="max_records"):
        CollectionSource([1]).create_reader([0], None).poll(0)


# ---------------------------------------------------------------- GeneratorSource

def numbered(split, offset):
    return ((split, i) for i in itertools.count(offset))


@PROPERTY
@given(limit=st.integers(0, 15), num_splits=st.integers(1, 6), parallelism=st.integers(1, 4),
       data=st.data())
def test_generator_snapshot_restore_no_loss_no_dup(limit, num_splits, parallelism, data):
    src = GeneratorSource(numbered, num_splits=num_splits, limit=limit)

    def by_split(records):  # splits are served round-robin: exact order per split
        return {s: [r for r in records if r[0] == s] for s in range(num_splits)}

    def expected(splits):
        return [(s, i) for s in splits for i in range(limit)]

    everything = check_snapshot_restore(src, parallelism, data, expected, normalize=by_split)
    assert Counter(everything) == Counter(expected(range(num_splits)))


def test_generator_limit_and_finished():
    src = GeneratorSource(lambda split, offset: itertools.count(offset), limit=3)
    reader = src.create_reader([0], None)
    assert reader.poll(2) == Poll([0, 1], split=0)
    assert reader.poll(10) == Poll([2], finished=True, split=0, split_finished=True)
    assert src.create_reader([0], {"0": 3}).poll(1) == Poll([], finished=True)


def test_generator_finite_fn_finishes_without_limit():
    src = GeneratorSource(lambda split, offset: iter(range(offset, 4)))
    assert read_to_end(src.create_reader([0], None), itertools.repeat(3)) == [0, 1, 2, 3]


def test_generator_unbounded_splits_all_progress():
    src = GeneratorSource(numbered, num_splits=3)
    reader = src.create_reader([0, 2], None)
    records = [r for _ in range(4) for r in reader.poll(5).records]
    assert {s for s, _ in records} == {0, 2}
    assert reader.snapshot() == {"0": 10, "2": 10}


def test_generator_rate_limit_returns_idle():
    src = GeneratorSource(numbered, num_splits=1, records_per_second=10)
    reader = src.create_reader([0], None)
    first = reader.poll(1000)
    assert 1 <= len(first.records) <= 1  # burst = max(1, rate/10)
    throttled = reader.poll(1000)
    assert throttled == Poll([], idle=True)
    time.sleep(0.15)
    assert reader.poll(1000).records == [(0, 1)]


# ---------------------------------------------------------------- DirectorySource

def write_files(root: str, contents: list[str]) -> list[str]:
    names = [f"part-{i:03d}.txt" for i in range(len(contents))]
    for name, content in zip(names, contents):
        with open(os.path.join(root, name), "w", encoding="utf-8", newline="") as f:
            f.write(content)
    return names


def lines_of(content: str) -> list[str]:
    parts = content.split("\n")
    return parts[:-1] if parts[-1] == "" else parts


@PROPERTY
@given(files=st.lists(st.tuples(st.lists(LINE, max_size=6), st.booleans()), max_size=6),
       parallelism=st.integers(1, 4), buffer_size=st.integers(1, 16), data=st.data())
def test_directory_snapshot_restore_no_loss_no_dup(files, parallelism, buffer_size, data):
    contents = ["".join(l + "\n" for l in lines) if trailing else "\n".join(lines)
                for lines, trailing in files]
    with tempfile.TemporaryDirectory() as root:
        write_files(root, contents)
        src = DirectorySource(root, pattern="*.txt", buffer_size=buffer_size)
        by_path = dict(zip(src.splits(), contents))

        def expected(splits):
            return [line for path in splits for line in lines_of(by_path[path])]

        everything = check_snapshot_restore(src, parallelism, data, expected)
    assert Counter(everything) == Counter(l for c in contents for l in lines_of(c))


def test_directory_crlf_and_unicode_separators(tmp_path):
    (tmp_path / "a.txt").write_bytes("x\r\ny\u2028z\n\nlast".encode())
    src = DirectorySource(str(tmp_path))
    assert read_to_end(src.create_reader(src.splits(), None), itertools.repeat(10)) == \
        ["x", "y\u2028z", "", "last"]


def test_jsonl_records_and_malformed_line_error(tmp_path):
    (tmp_path / "good.jsonl").write_text('{"a": 1}\n\n[2, 3]\n')
    (tmp_path / "x-bad.jsonl").write_text('{"b": 1}\n{"b": 2}\n\n{broken\n')
    src = DirectorySource(f"file://{tmp_path}", pattern="*.jsonl", format="jsonl")
    splits = src.splits()
    assert [p.rsplit("/", 1)[1] for p in splits] == ["good.jsonl", "x-bad.jsonl"]
    reader = src.create_reader(splits, None)
    assert reader.poll(3).records == [{"a": 1}, [2, 3], {"b": 1}]
    state = reader.snapshot()
    for r in (reader, src.create_reader(splits, state)):  # line number is right after restore too
        with pytest.raises(ValueError, match=r"DirectorySource\(.*x-bad\.jsonl line 4 \(column 2\)"):
            r.poll(10)


def test_epoch_per_file_requests_epoch_at_each_file_end(tmp_path):
    write_files(str(tmp_path), ["a1\na2\n", "b1\nb2\nb3", "", "d1\n"])
    src = DirectorySource(str(tmp_path), epoch_per_file=True)
    reader = src.create_reader(src.splits(), None)
    polls = [reader.poll(2) for _ in range(5)]
    assert polls == [
        Poll(["a1", "a2"], request_epoch=True),  # exact fit: the file end is still detected
        Poll(["b1", "b2"]),
        Poll(["b3"], request_epoch=True),        # never mixes records of the next file
        Poll([], request_epoch=True),            # the empty file
        Poll(["d1"], finished=True, request_epoch=True),
    ]


def test_without_epoch_per_file_polls_span_files(tmp_path):
    write_files(str(tmp_path), ["a\n", "b\n"])
    src = DirectorySource(str(tmp_path))
    assert src.create_reader(src.splits(), None).poll(5) == Poll(["a", "b"], finished=True)


def test_bounded_missing_directory_fails_at_plan_time(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        DirectorySource(str(tmp_path / "nope")).splits()


def test_memory_filesystem_and_pickling():
    root = f"memory://epochal-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    fs.pipe(f"{root}/b.jsonl", b'{"n": 2}\n')
    fs.pipe(f"{root}/a.jsonl", b'{"n": 1}\n{"n": 1.5}')
    src = DirectorySource(root, format="jsonl")
    splits = src.splits()
    shipped = cloudpickle.loads(cloudpickle.dumps(src))
    reader = shipped.create_reader(splits, None)
    assert reader.poll(1).records == [{"n": 1}]
    restored = shipped.create_reader(splits, reader.snapshot())
    assert read_to_end(restored, itertools.repeat(4)) == [{"n": 1.5}, {"n": 2}]


def _poll_until(readers, want: int, timeout: float = 5.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        for r in readers:
            poll = r.poll(100)
            assert not poll.finished
            got.extend(poll.records)
        time.sleep(0.005)
    return got


def test_monitoring_picks_up_new_files_once(tmp_path):
    write_files(str(tmp_path), [f"old{i}\n" for i in range(5)])
    src = DirectorySource(str(tmp_path), monitor_interval=0.01)
    splits = src.splits()
    src = cloudpickle.loads(cloudpickle.dumps(src))  # shipped after planning
    p = 2
    readers = [src.create_reader(splits[i::p], None, subtask=i, parallelism=p) for i in range(p)]
    assert sorted(_poll_until(readers, 5)) == [f"old{i}" for i in range(5)]
    assert all(r.poll(10) == Poll([], idle=True) for r in readers)

    for i in range(8):  # complete files appear atomically (write, then rename)
        tmp = tmp_path / f".new{i}.tmp"
        tmp.write_text(f"new{i}\n")
        tmp.rename(tmp_path / f"new{i}.txt")
    new = _poll_until(readers, 8)
    assert sorted(new) == [f"new{i}" for i in range(8)]  # each exactly once, old ones not again

    states = [r.snapshot() for r in readers]
    (tmp_path / "late.txt").write_text("late\n")
    restored = [src.create_reader(splits[i::p], states[i], subtask=i, parallelism=p) for i in range(p)]
    assert _poll_until(restored, 1) == ["late"]
    time.sleep(0.05)
    assert _poll_until(restored, 1, timeout=0.1) == []  # nothing re-read after restore
