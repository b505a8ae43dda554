"""Who sends to whom in a physical plan, as the coordinator needs it: a task's upstream tasks
(who must finish before it when a job stops with a savepoint) and its consumers (whose
addresses its ``start`` carries). Each is one pass over the plan's channels — a scan of
every channel per task was quadratic in a wide job (cubic in the parallelism of an
all-to-all shuffle; issue 50)."""
from __future__ import annotations


def upstream_tasks(plan) -> dict[str, set[str]]:
    """Task → the tasks feeding it over non-feedback channels (who must finish before it,
    when the job stops with a savepoint). One pass over the channels: a scan of every channel
    per task was quadratic in a wide job (cubic in the parallelism of an all-to-all shuffle)."""
    upstream: dict[str, set[str]] = {t.id: set() for t in plan.tasks}
    for channel in plan.channels.values():
        if not channel.feedback:
            upstream[channel.consumer].add(channel.producer)
    return upstream


def consumer_tasks(plan) -> dict[str, set[str]]:
    """Task → the tasks it sends to (over any channel, feedback included): whose addresses
    its ``start`` carries. One pass over the channels."""
    consumers: dict[str, set[str]] = {t.id: set() for t in plan.tasks}
    for channel in plan.channels.values():
        consumers[channel.producer].add(channel.consumer)
    return consumers
