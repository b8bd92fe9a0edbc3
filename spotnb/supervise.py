"""Keeping every unfinished job driven: start a job's controller process, restart one that
died, and recognise a job whose store vanished (then only the job DB can say it is lost).

Shared by `spot.train`/`spot.jobs` (api), a following `Job` and the controller itself, so
it imports none of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import fsspec

from spotnb.home import spotnb_home
from spotnb.jobdb import JobDB
from spotnb.protocol import TERMINAL, JobStatus
from spotnb.store import Store, private_dir

__all__ = ["start_controller", "job_vanished", "mark_lost", "ensure_controller"]


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
    if JobDB().controller_alive(row["id"]):
        return False
    why = job_vanished(row)
    if why is not None:
        row.update(mark_lost(row, why))
        return False
    start_controller(row["id"], row["store"])
    return True
