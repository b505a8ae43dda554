"""State that expires: ``ttl=`` on keyed state (processing or event time).

``ep.StateTtl`` configures it; :mod:`epochal.ttl.expiry` holds the pure rules,
:mod:`epochal.ttl.state` the state handles, :mod:`epochal.ttl.registry` an operator's
clocks, restore checks and checkpoint record, :mod:`epochal.ttl.cleanup` the bounded sweep
and :mod:`epochal.ttl.reading` the offline reader's view. Imports only ``epochal.errors``,
``epochal.time.units`` and its own modules.
"""
from epochal.ttl.expiry import StateTtl

__all__ = ["StateTtl"]
