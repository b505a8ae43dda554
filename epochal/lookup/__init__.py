"""Lookup enrichment: each record joined with the row of its key in a table users keep their
dimensions in (PostgreSQL: :class:`~epochal.connectors.postgres.lookup.PostgresTable`; Delta:
:class:`~epochal.connectors.delta.lookup.DeltaLookupTable`), read
through a bounded cache with a refresh policy (:mod:`epochal.lookup.cache`).

    stream.flat_map("enrich", Lookup(PostgresTable(dsn, "customers", "id"), key=lambda o: o["customer"],
                                     max_entries=10_000, refresh_after="60s"))

**Outside the exactly-once cut.** The table is read as it is when a record is enriched (or
as the cache last saw it), not as of a checkpoint: after a restore, replayed records may meet
newer rows than in the first attempt. The output is still committed exactly once per epoch,
but what an enriched record says depends on when it was read. For results that must not
depend on timing, join a changelog of the table with a temporal join (:mod:`epochal.joins`).
"""
from epochal.lookup.api import Lookup, LookupTable
from epochal.lookup.cache import LookupCache

__all__ = ["Lookup", "LookupCache", "LookupTable"]
