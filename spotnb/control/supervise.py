"""Keeping every unfinished job driven: start a job's controller process, restart one that
died, and recognise a job whose store vanished (then only the job DB can say it is lost).

Shared by `spot.train`/`spot.jobs` (api), a following `Job` and the controller itself, so
it imports none of them.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from typing import Any

import fsspec

from spotnb.control.jobdb import JobDB
from spotnb.core.home import spotnb_home
from spotnb.core.protocol import TERMINAL, JobStatus
from spotnb.core.store import Store, private_dir
from spotnb.errors import ConfigError, SpotnbError

__all__ = [
    "start_controller",
    "job_vanished",
    "mark_lost",
    "ensure_controller",
    "ensure_hosted_controller",
    "HOSTED_CHECK_S",
    "hosting_error",
]

#: How often a notebook asks a cloud whether a job's hosted controller (its coordinator) is
#: still there: each ask is a describe call, and a listing of jobs asks for every one.
HOSTED_CHECK_S = 300.0
_hosted_checked: dict[str, float] = {}
log = logging.getLogger("spotnb.control.supervise")


def start_controller(job_id: str, store_url: str) -> int:
    """Start `spotnb controller JOB_ID` in a new session (it outlives this process)."""
    logdir = private_dir(spotnb_home() / "logs" / job_id)
    # umask: every file the controller writes (log, store, job DB) is owner-only
    with open(os.open(logdir / "controller.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spotnb.cli", "controller", job_id, "--store", store_url],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=os.getcwd(),
            umask=0o077,
        )
    return proc.pid


def job_vanished(row: dict[str, Any]) -> str | None:
    """Why an unfinished job's store or job directory is gone for good (None: it is there, or
    the store cannot be reached right now, which is not the same). A local store is looked at
    without opening it, since opening one creates its root again."""
    url = row.get("store") or ""
    try:
        if url.startswith("file://") or "://" not in url:
            root = fsspec.core.url_to_fs(url)[1]
            if not os.path.isdir(root):
                return f"its store {root} no longer exists"
            folder = os.path.join(root, "jobs", row["id"])
            return None if os.path.isdir(folder) else f"its job directory {folder} no longer exists"
        st = Store(url)
        folder = st.job(row["id"])
        return None if st.exists(folder) else f"its job directory {url}/jobs/{row['id']} no longer exists"
    except Exception:  # noqa: BLE001 - unreachable or no credentials: unknown, not lost
        return None


def mark_lost(row: dict[str, Any], reason: str) -> dict[str, Any]:
    """Record in the job DB that a job is lost (the store cannot remember it any more)."""
    reason = f"{reason}; nothing can resume it (start it again, or `spotnb gc` leftover instances)"
    JobDB().update_job(row["id"], status=JobStatus.LOST.value, status_reason=reason, burn_rate=0.0)
    return {**row, "status": JobStatus.LOST.value, "status_reason": reason}


def ensure_controller(row: dict[str, Any]) -> bool:
    """Restart the controller of an unfinished job whose controller died (stale lease).
    Returns True if one was started; the lease keeps two from driving the job at once.
    A job whose store vanished is marked lost instead, once: no controller could run it."""
    if row.get("status") in TERMINAL:
        return False
    if row.get("controller") == "cloud":
        try:
            return ensure_hosted_controller(row)
        except Exception as exc:  # noqa: BLE001 - one job's trouble must not break a listing
            log.warning("job %s: its hosted controller could not be checked: %s", row["id"], exc)
            return False
    if JobDB().controller_alive(row["id"]):
        return False
    why = job_vanished(row)
    if why is not None:
        row.update(mark_lost(row, why))
        return False
    start_controller(row["id"], row["store"])
    return True


def ensure_hosted_controller(row: dict[str, Any]) -> bool:
    """A job whose controller its coordinator runs (`Config.controller="cloud"`) is never
    driven from this machine (two controllers on two machines share no lease): instead the
    job's provider makes sure the coordinator is there, and starts it again if it was ended
    (`Provider.host_controller`, idempotent; on a cloud at most every `HOSTED_CHECK_S`).
    Returns True if this call asked for it. The job's settings come from its signed spec."""
    from spotnb.core.signing import load_key
    from spotnb.core.spec import load_spec
    from spotnb.settings.registry import get_provider_class

    job_id = row["id"]
    now = time.monotonic()
    if row.get("provider") != "local" and now - _hosted_checked.get(job_id, -HOSTED_CHECK_S) < HOSTED_CHECK_S:
        return False
    _hosted_checked[job_id] = now
    key = load_key(job_id)
    if key is None:
        return False  # submitted on another machine: that one, or its coordinator, drives it
    store = Store(row["store"])
    ended = _ended_in_store(store, job_id)
    if ended is not None:  # it ended while no notebook here followed: nothing to host
        JobDB().update_job(job_id, status=ended.value, burn_rate=0.0)
        row["status"] = ended.value
        return False
    config = load_spec(store, job_id, key).to_config()
    provider = get_provider_class(config.provider)(config)
    try:
        provider.host_controller(job_id, store.url, key.hex())
    except Exception as exc:
        raise hosting_error(exc, key.hex()) from None
    finally:
        provider.close()
    return True


def _ended_in_store(store: Store, job_id: str) -> JobStatus | None:
    """The job's final status if its event log says it ended (the last `status` event, so a
    resumed job is running again), else None. Read before asking a cloud for the job's
    coordinator: a hosted job usually ends while no notebook follows it."""
    from spotnb.core.events import EventReader
    from spotnb.core.protocol import Status

    last = None
    for event in EventReader(store, job_id).poll():
        if isinstance(event, Status):
            last = event.status
    return last if last in TERMINAL else None


def hosting_error(exc: BaseException, job_key: str) -> SpotnbError:
    """`exc` from `Provider.host_controller` as an error safe to show and record: a cloud's
    refusal may quote the request it refused (the coordinator's boot script carries the job
    key), so the key is cut out of its text and the original is not chained."""
    if isinstance(exc, ConfigError):  # spotnb's own words: kept as they are, and their type
        return ConfigError(str(exc).replace(job_key, "<the job key>"))
    return SpotnbError(f"{type(exc).__name__}: {exc}".replace(job_key, "<the job key>"))
