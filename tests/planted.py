"""A payload that proves code ran when it is unpickled, for the tests that send pickles to
network surfaces after a valid handshake (query directory and servers, the coordinator, the
relay hub, the fuzzers): each asserts afterwards that ``path`` does not exist."""
from __future__ import annotations

import os


class Plant:
    """Unpickling it creates ``path`` (a directory): the proof that code ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))
