"""PostgreSQL: an exactly-once sink on prepared transactions (seed 004 Table 4.1, the DBMS row).

Re-exported as :class:`epochal.sinks.PostgresSink`. The driver, psycopg 3, is the ``postgres``
extra (``pip install 'epochal[postgres]'``); it is imported only when the sink is used.
"""
from epochal.connectors.postgres.sink import PostgresSink, PostgresSinkWriter, PostgresTransaction

__all__ = ["PostgresSink", "PostgresSinkWriter", "PostgresTransaction"]
