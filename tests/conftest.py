"""Shared fixtures: one embedded local Spark session for the whole test run."""
from __future__ import annotations

import logging
import os

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
logging.getLogger("py4j").setLevel(logging.WARNING)

SPARK_SLOTS = 16


def pytest_collection_modifyitems(session, config, items):
    """Task processes cannot import test modules: pickle their functions by value (done at
    collection, so module-scoped fixtures that run jobs work too)."""
    import cloudpickle

    for module in {item.module for item in items if getattr(item, "module", None) is not None}:
        cloudpickle.register_pickle_by_value(module)


@pytest.fixture(scope="session")
def spark():
    """A local SparkSession with enough slots for every test's task count."""
    from epochal.runtime.launch.spark import _local_session

    return _local_session(SPARK_SLOTS)


def pytest_configure(config):
    # Test helper modules are not installed in task processes: ship their functions and
    # classes by value, as users' __main__ code is.
    import sys

    import cloudpickle

    sys.path.insert(0, os.path.dirname(__file__))
    import pipelines
    import ttl_pipelines

    cloudpickle.register_pickle_by_value(pipelines)
    cloudpickle.register_pickle_by_value(ttl_pipelines)


@pytest.fixture(scope="module", autouse=True)
def _forget_memory_files():
    """fsspec's ``memory://`` store is one dict per process, and every ``info``/``ls`` scans
    all of it: what one test module leaves there slowed every later module's memory-backed
    storage (the transactional log's crash-point property took 34 s after the other
    memory-using modules instead of 4.6 s alone). Each module's files are removed when it
    ends; a module's own fixtures and tests still share them."""
    from fsspec.implementations.memory import MemoryFileSystem

    before, dirs = set(MemoryFileSystem.store), set(MemoryFileSystem.pseudo_dirs)
    yield
    for key in set(MemoryFileSystem.store) - before:
        MemoryFileSystem.store.pop(key, None)
    MemoryFileSystem.pseudo_dirs[:] = [d for d in MemoryFileSystem.pseudo_dirs if d in dirs]
