"""Savepoints of a job of regions (:mod:`epochal.runtime.driver.regions`): where a restore
finds each region's point, and the savepoint of a region that finished while the job's
savepoint was taken.

A savepoint of such a job is one savepoint per region, ``<url>/<region>/``, listed in
``<url>/_regions`` (:data:`REGIONS_DOCUMENT`); :meth:`RegionsHandle.stop_with_savepoint
<epochal.runtime.driver.regions.RegionsHandle.stop_with_savepoint>` takes them one region
after the other (readers of autonomous channels first).
"""
from __future__ import annotations

import logging

from epochal.backends.storage import CheckpointStorage
from epochal.errors import ConfigError
from epochal.regions.layout import REGIONS_DIR, RegionPart, regions_with_checkpoints

log = logging.getLogger("epochal")

#: the document a savepoint of a job with regions keeps at its root: ``{"job", "regions"}``
REGIONS_DOCUMENT = "_regions"


def restore_points(restore_from, job: str, parts: list[RegionPart], allow_non_restored_state: bool) -> dict[str, str]:
    """``restore_from`` of a job with regions → the savepoint (or checkpoint root) of each region.

    ``restore_from`` is a savepoint of such a job (``<url>/_regions`` lists its regions, one
    savepoint each under ``<url>/<region>``) or a job's checkpoint root (``<url>/regions/<region>/<job>``).
    A region the point does not hold starts empty (logged); a region the point holds that the
    job no longer has is refused unless ``allow_non_restored_state``.
    """
    if restore_from is None:
        return {}
    if not isinstance(restore_from, str):
        raise ConfigError(f"restore_from: expected a URL, got {type(restore_from).__name__}")
    url = restore_from.rstrip("/")
    root = CheckpointStorage.at_root(url)
    doc = root.read_document(REGIONS_DOCUMENT)
    if doc is not None:
        held = {name: f"{url}/{name}" for name in doc.get("regions", [])}
    else:
        held = {name: f"{url}/{REGIONS_DIR}/{name}/{job}" for name in regions_with_checkpoints(root, job)}
        if not held:
            raise ConfigError(
                f"restore_from {restore_from}: neither a savepoint of a job with regions ({REGIONS_DOCUMENT} is "
                f"missing) nor a job's checkpoint root with regions ({REGIONS_DIR}/ is missing)")
    names = {p.name for p in parts}
    dropped = sorted(set(held) - names)
    if dropped and not allow_non_restored_state:
        raise ConfigError(
            f"restore_from {restore_from} holds regions {dropped} that the job no longer has (it has "
            f"{sorted(names)}): their state would be dropped; rename the regions back, or pass "
            "allow_non_restored_state=True")
    for name in sorted(names - set(held)):
        log.warning("restore_from %s holds no region %r: it starts empty", restore_from, name)
    return {name: point for name, point in held.items() if name in names}


def savepoint_of_end(handle, url: str, timeout: float | None) -> bool:
    """Write the savepoint of a region that *finished* — its input ended and its FINAL
    epoch committed, no failure, not cancelled — from its latest completed checkpoint (its
    end) to ``url``; False (nothing written) if the region is still running after
    ``timeout``, failed, was cancelled, or stopped with a savepoint of its own.

    Called by :meth:`RegionsHandle.stop_with_savepoint` / :meth:`RegionsHandle.savepoint`
    when a region's own request failed because its job ended while it was taken: the
    regions before it in :func:`cut_order` may have stopped already, so the job's savepoint
    must still hold every region, or a restore would start this one empty and the stopped
    ones would never run on (their input after the cut lost). Restoring the end gives a
    region with nothing left to read; what its relay sinks handed over that the readers'
    cuts do not hold is in that checkpoint (:mod:`epochal.regions.relay`). Like a stop's
    savepoint it records that the region's sinks committed everything up to its epoch
    (``_sinks_committed``): a restore may switch the guarantee. Not idempotent
    (the target must be empty, as for every savepoint)."""
    from epochal.state.location import Checkpoint
    from epochal.state.savepoint import record_savepoint, write_savepoint

    driver = handle._driver
    driver.thread.join(timeout)
    if driver.thread.is_alive() or driver.error is not None or driver.state != "finished" \
            or getattr(driver, "_cancelled", False) or driver.stopped_with_savepoint:
        return False
    storage = driver.storage
    latest = storage.latest_completed()
    if latest is None:
        return False
    epoch, meta = latest
    chk = Checkpoint(storage.file_url(f"chk-{epoch:010d}"), storage, epoch, meta)
    marker = write_savepoint(chk, url, storage.storage_options, signing_key=storage.signing_key)
    record_savepoint(storage, url, marker)
    # a region that finished committed every sink transaction of its end, as a stop with a
    # savepoint does: say so, so a restore under another guarantee is allowed
    # (compatibility.check_sink_mode; the campaign's regions seed 30006 was refused)
    driver._record_sinks_committed(url)
    log.info("job %s: region %r finished while its savepoint was taken; its end (epoch %d) is written to %s",
             driver.plan.job, getattr(driver, "region", None), epoch, url)
    return True
