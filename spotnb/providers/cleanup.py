"""Tags every cloud VM carries, and `gc`: find and end VMs that no live job owns.

Why: the controller terminates each incarnation's VM when it ends, and a VM powers itself off
after its agent exits, but a notebook kernel can die between a launch and its bookkeeping.
`spotnb gc --provider aws` (the CLI calls `gc`) lists the VMs tagged with a spotnb job id and
terminates those whose job is not running any more (or that no job DB here knows, with
`all_unknown=True`). Tag keys are the same on all clouds and valid GCP label keys. On Azure it
also deletes the virtual network spotnb created on first use (`spotnb-<location>`, tagged
spotnb-managed), once no VM uses it and no job here is live; a user's network is never touched.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spotnb.providers.base import LaunchSpec
    from spotnb.settings.config import Config

__all__ = ["JOB_TAG", "INCARNATION_TAG", "MANAGED_TAG", "job_tags", "gc", "orphans"]

JOB_TAG = "spotnb-job"
INCARNATION_TAG = "spotnb-incarnation"
MANAGED_TAG = "spotnb-managed"
_LIVE = {"pending", "running", "preempted", "restoring"}
_STALE_S = 600.0  # a "running" job whose controller has been silent this long is dead


def job_tags(spec: LaunchSpec) -> dict[str, str]:
    """The tags (AWS, Azure) / labels (GCP) of one incarnation's VM and disks."""
    return {JOB_TAG: spec.job_id.lower(), INCARNATION_TAG: str(spec.incarnation), MANAGED_TAG: "true"}


def _job_is_live(job_id: str, db: Any, now: float) -> bool | None:
    """True/False from the job DB; None when this machine's DB does not know the job."""
    for row in db.jobs():
        if str(row["id"]).lower() == job_id.lower():
            if row.get("status") not in _LIVE:
                return False
            beat = row.get("heartbeat") or row.get("updated") or 0
            return now - float(beat) < _STALE_S
    return None


def _live_jobs(db: Any, provider_name: str, now: float | None = None) -> bool:
    """Whether this machine's job DB has a live job that may use `provider_name`."""
    now = time.time() if now is None else now
    for row in db.jobs():
        if row.get("provider") in (provider_name, "any") and _job_is_live(str(row["id"]), db, now):
            return True
    return False


def orphans(
    tagged: Iterable[tuple[str, str]], db: Any, all_unknown: bool = False, now: float | None = None
) -> list[str]:
    """From (instance id, job id) pairs, the instances no live job owns."""
    now = time.time() if now is None else now
    out = []
    for instance_id, job_id in tagged:
        live = _job_is_live(job_id, db, now)
        if live is False or (live is None and all_unknown):
            out.append(instance_id)
    return out


def gc(
    provider_name: str, config: Config | None = None, *, all_unknown: bool = False, dry_run: bool = False
) -> list[str]:
    """Terminate the provider's spotnb-tagged VMs whose job has ended; returns their ids.

    A job counts as ended when the job DB says succeeded/failed/stopped, or its controller has
    been silent for 10 minutes. VMs of jobs this DB does not know (launched from another
    machine) are left alone unless `all_unknown=True`. `dry_run=True` only lists them.
    """
    from spotnb.control.jobdb import JobDB
    from spotnb.errors import ConfigError
    from spotnb.providers.base import Feature
    from spotnb.settings.config import Config
    from spotnb.settings.registry import get_provider_class

    config = config or Config(provider=provider_name)
    provider = get_provider_class(provider_name)(config)
    if not provider.supports(Feature.CLEANUP):
        provider.close()
        raise ConfigError(
            f"spotnb gc: provider {provider_name!r} leaves nothing behind to clean "
            f"up ({provider.unsupported[Feature.CLEANUP]})"
        )
    try:
        lister = getattr(provider, "list_tagged", None)
        if lister is None:
            return []
        tagged = list(lister())  # (instance, job id) pairs
        ids = {inst.id: inst for inst, _ in tagged}
        db = JobDB()
        doomed = orphans(((inst.id, job) for inst, job in tagged), db, all_unknown)
        if not dry_run:
            for instance_id in doomed:
                provider.terminate(ids[instance_id])
            # the shared network spotnb created on first use (Azure's virtual network), only
            # while no job of this machine may still launch into it; the cloud refuses one in use
            sweep = getattr(provider, "gc_networks", None)
            if sweep is not None and not _live_jobs(db, provider_name):
                sweep()
        return doomed
    finally:
        provider.close()
