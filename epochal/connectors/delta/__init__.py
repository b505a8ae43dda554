"""Delta Lake: an exactly-once sink (one Delta commit per epoch and subtask, with an
application transaction) and a replayable source over a table's versions.

Re-exported as :class:`epochal.sinks.DeltaSink` and :class:`epochal.sources.DeltaSource`.
The client, deltalake (delta-rs, no JVM), is the ``delta`` extra
(``pip install 'epochal[delta]'``); it is imported only when a job starts or a reader or
writer opens a table.
"""
from epochal.connectors.delta.sink import DeltaSink, DeltaSinkWriter, DeltaTransaction
from epochal.connectors.delta.source import DeltaSource, DeltaSourceError

__all__ = ["DeltaSink", "DeltaSinkWriter", "DeltaSource", "DeltaSourceError", "DeltaTransaction"]
