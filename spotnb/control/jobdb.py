"""The job DB (SQLite, `$SPOTNB_HOME/jobs.db`): an index of jobs and what the markets did.

The store remains the source of truth for a job; the DB lists jobs across stores and learns,
per (provider, region, instance type), the mean time to preemption and the restart time R
that the checkpoint policy needs.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spotnb.core.home import spotnb_home
from spotnb.core.protocol import Checkpoint
from spotnb.core.store import private_dir
from spotnb.errors import SpotnbError
from spotnb.policy.base import PRIOR_MTTP, PRIOR_RESTART

__all__ = ["JobDB", "MarketStats", "AmbiguousJobId", "PRIOR_MTTP", "PRIOR_RESTART"]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, name TEXT, provider TEXT, region TEXT, instance_type TEXT, store TEXT,
  status TEXT, created REAL, updated REAL, step INTEGER DEFAULT 0, total_steps INTEGER,
  preemptions INTEGER DEFAULT 0, spot_cost REAL DEFAULT 0, on_demand_cost REAL DEFAULT 0,
  burn_rate REAL DEFAULT 0, controller_pid INTEGER, heartbeat REAL
);
CREATE TABLE IF NOT EXISTS incarnations (
  job_id TEXT, n INTEGER, instance_id TEXT, provider TEXT, region TEXT, instance_type TEXT,
  requested REAL, allocated REAL, ready REAL, ended REAL, end_reason TEXT,
  PRIMARY KEY (job_id, n)
);
CREATE TABLE IF NOT EXISTS leases (
  job_id TEXT PRIMARY KEY, owner TEXT, pid INTEGER, expires REAL
);
CREATE TABLE IF NOT EXISTS lease_generations (
  job_id TEXT PRIMARY KEY, generation INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
  job_id TEXT, n INTEGER, seq INTEGER, kind TEXT, step INTEGER, snapshot_s REAL, upload_s REAL,
  bytes INTEGER, t REAL, PRIMARY KEY (job_id, seq)
);
"""


class AmbiguousJobId(SpotnbError, LookupError):
    """An id prefix matches more than one job: acting on the newest would be a guess."""

    def __init__(self, prefix: str, matches: list[str]) -> None:
        shown = ", ".join(matches[:10]) + (f" and {len(matches) - 10} more" if len(matches) > 10 else "")
        super().__init__(
            f"job id {prefix!r} is ambiguous: it starts {len(matches)} job ids ({shown}); give more of the id"
        )
        self.prefix, self.matches = prefix, matches


def in_region(zone: str | None, region: str, provider: str = "aws") -> bool:
    """Whether an instance recorded in `zone` ran in `region`: the same name, or on AWS and GCP,
    which record zones while a user names regions, one of its zones by the cloud's naming
    (`us-east-1` + one letter; `us-central1` + `-` + one letter). Elsewhere (Azure, the local
    market's emulated zones) only the same name: `east-2` is not a zone of `east`."""
    if zone is None:
        return False
    if zone == region:
        return True
    if not zone.startswith(region):
        return False
    rest = zone[len(region) :]
    if provider == "aws":
        return len(rest) == 1 and "a" <= rest <= "z"
    if provider == "gcp":
        return len(rest) == 2 and rest[0] == "-" and "a" <= rest[1] <= "z"
    return False


class MarketStats:
    """MTTP and R for one market, with a documented prior when there is no history."""

    def __init__(self, mttp: float, restart: float, preemptions: int, exposure: float) -> None:
        self.mttp, self.restart, self.preemptions, self.exposure = mttp, restart, preemptions, exposure

    def as_dict(self) -> dict[str, float]:
        return {"mttp": self.mttp, "restart": self.restart}


class JobDB:
    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path else spotnb_home() / "jobs.db"
        # the DB names every job's store and instances: owner-only, like the home it lives in
        private_dir(self.path.parent)
        if not self.path.exists():
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
        self._lock = threading.Lock()
        with self._connect() as con:
            con.executescript(_SCHEMA)
            cols = {r["name"] for r in con.execute("PRAGMA table_info(jobs)")}
            if "status_reason" not in cols:  # a DB from before terminal reasons were kept here
                con.execute("ALTER TABLE jobs ADD COLUMN status_reason TEXT")
            if "controller" not in cols:  # where the controller runs: NULL (here) or "cloud"
                con.execute("ALTER TABLE jobs ADD COLUMN controller TEXT")

    def _connect(self, timeout: float = 30.0) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=timeout)
        con.row_factory = sqlite3.Row
        con.execute("PRAGMA journal_mode=WAL")
        return con

    def _exec(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock, self._connect() as con:
            return con.execute(sql, args).fetchall()

    # -- jobs --------------------------------------------------------------------------------
    def add_job(
        self,
        job_id: str,
        *,
        name: str | None,
        provider: str,
        region: str | None,
        instance_type: str,
        store: str,
    ) -> None:
        now = time.time()
        self._exec(
            "INSERT OR REPLACE INTO jobs (id, name, provider, region, instance_type, store, "
            "status, created, updated) VALUES (?,?,?,?,?,?,?,?,?)",
            (job_id, name, provider, region, instance_type, store, "pending", now, now),
        )

    def update_job(self, job_id: str, **fields: Any) -> None:
        if not fields:
            return
        fields["updated"] = time.time()
        cols = ", ".join(f"{k}=?" for k in fields)
        self._exec(f"UPDATE jobs SET {cols} WHERE id=?", (*fields.values(), job_id))

    def claim_job(self, job_id: str, expected: str | None, **fields: Any) -> bool:
        """Update the job's row only if its status is still `expected` (what the caller read):
        of two callers that read the same row, one wins. True if this one did."""
        fields["updated"] = time.time()
        cols = ", ".join(f"{k}=?" for k in fields)
        with self._lock, self._connect() as con:
            cur = con.execute(
                f"UPDATE jobs SET {cols} WHERE id=? AND status IS ?", (*fields.values(), job_id, expected)
            )
            return cur.rowcount == 1

    def job(self, job_id: str) -> dict[str, Any] | None:
        """The job with this id, or the one job whose id starts with it; None if none does.

        Raises AmbiguousJobId when a prefix matches several jobs. The prefix is compared as
        text (`substr`), never as a LIKE pattern, so `_` and `%` in it match only themselves."""
        rows = self._exec("SELECT * FROM jobs WHERE id=?", (job_id,))
        if not rows and job_id:
            rows = self._exec(
                "SELECT * FROM jobs WHERE substr(id, 1, ?) = ? ORDER BY created DESC", (len(job_id), job_id)
            )
            if len(rows) > 1:
                raise AmbiguousJobId(job_id, [r["id"] for r in rows])
        return dict(rows[0]) if rows else None

    def jobs(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._exec("SELECT * FROM jobs ORDER BY created DESC")]

    # -- controller leases: one controller drives a job at a time -----------------------------
    # Each takeover increments the job's lease *generation* (kept after the lease is released,
    # so it only ever grows). A controller stamps its generation on everything it writes and
    # renews only the generation it took: a paused controller that wakes up after another took
    # over finds its generation gone and stops, and readers can tell its late writes apart.
    def take_lease(self, job_id: str, owner: str, pid: int, ttl: float) -> dict[str, Any] | None:
        """Take the job's lease as a new generation; None while another live owner holds it.

        Returns {"generation": n, "previous_expiry": t or None}: t is when the predecessor's
        lease ran out (or now, if it was released), the instant after which its writes are void."""
        now = time.time()
        with self._lock, self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            row = con.execute("SELECT owner, expires FROM leases WHERE job_id=?", (job_id,)).fetchone()
            if row is not None and row["owner"] != owner and row["expires"] > now:
                con.execute("ROLLBACK")
                return None
            gen_row = con.execute(
                "SELECT generation FROM lease_generations WHERE job_id=?", (job_id,)
            ).fetchone()
            generation = (gen_row["generation"] if gen_row else 0) + 1
            con.execute("INSERT OR REPLACE INTO lease_generations VALUES (?,?)", (job_id, generation))
            con.execute("INSERT OR REPLACE INTO leases VALUES (?,?,?,?)", (job_id, owner, pid, now + ttl))
            con.execute("UPDATE jobs SET controller_pid=?, heartbeat=? WHERE id=?", (pid, now, job_id))
            con.execute("COMMIT")
        previous = (min(row["expires"], now) if row is not None else now) if generation > 1 else None
        return {"generation": generation, "previous_expiry": previous}

    def renew_lease(self, job_id: str, owner: str, generation: int, ttl: float) -> float | None:
        """Extend a lease this owner holds as `generation`; returns the new expiry, or None if
        the lease is no longer this owner's generation (another controller took the job)."""
        now = time.time()
        # wait for the DB lock a fraction of the TTL only: a renewal stuck behind a busy DB for
        # longer than the lease is worth less than a quick retry (the caller retries)
        with self._lock, self._connect(timeout=max(1.0, min(30.0, ttl / 4))) as con:
            con.execute("BEGIN IMMEDIATE")
            ok = con.execute(
                "SELECT 1 FROM leases l JOIN lease_generations g ON g.job_id = l.job_id "
                "WHERE l.job_id=? AND l.owner=? AND g.generation=?",
                (job_id, owner, generation),
            ).fetchone()
            if ok is None:
                con.execute("ROLLBACK")
                return None
            con.execute("UPDATE leases SET expires=? WHERE job_id=?", (now + ttl, job_id))
            con.execute("UPDATE jobs SET heartbeat=? WHERE id=?", (now, job_id))
            con.execute("COMMIT")
        return now + ttl

    def acquire_lease(self, job_id: str, owner: str, pid: int, ttl: float) -> bool:
        """Take or renew the job's lease; False if another live owner holds it."""
        lease = self.lease(job_id)
        if lease is not None and lease["owner"] == owner:
            gen = self._exec("SELECT generation FROM lease_generations WHERE job_id=?", (job_id,))
            if gen and self.renew_lease(job_id, owner, gen[0]["generation"], ttl) is not None:
                return True
        return self.take_lease(job_id, owner, pid, ttl) is not None

    def release_lease(self, job_id: str, owner: str) -> None:
        self._exec("DELETE FROM leases WHERE job_id=? AND owner=?", (job_id, owner))

    def lease(self, job_id: str) -> dict[str, Any] | None:
        rows = self._exec("SELECT * FROM leases WHERE job_id=?", (job_id,))
        return dict(rows[0]) if rows else None

    def controller_alive(self, job_id: str) -> bool:
        """Whether a controller holds an unexpired lease on the job."""
        lease = self.lease(job_id)
        return lease is not None and lease["expires"] > time.time()

    # -- incarnations ------------------------------------------------------------------------
    def record_incarnation(self, job_id: str, n: int, **fields: Any) -> None:
        rows = self._exec("SELECT 1 FROM incarnations WHERE job_id=? AND n=?", (job_id, n))
        if not rows:
            self._exec("INSERT INTO incarnations (job_id, n) VALUES (?, ?)", (job_id, n))
        if fields:
            cols = ", ".join(f"{k}=?" for k in fields)
            self._exec(
                f"UPDATE incarnations SET {cols} WHERE job_id=? AND n=?", (*fields.values(), job_id, n)
            )

    def record_checkpoint(self, job_id: str, n: int, e: Mapping[str, Any] | Checkpoint) -> None:
        self._exec(
            "INSERT OR REPLACE INTO checkpoints VALUES (?,?,?,?,?,?,?,?,?)",
            (
                job_id,
                n,
                e["seq"],
                e["save_kind"],
                e["step"],
                e.get("snapshot_s"),
                e.get("upload_s"),
                e.get("bytes"),
                e["t"],
            ),
        )

    def market(
        self,
        provider: str,
        region: str | None,
        instance_type: str,
        prior_mttp: float = PRIOR_MTTP,
        prior_restart: float = PRIOR_RESTART,
    ) -> MarketStats:
        """MTTP = (exposure + one prior lifetime) / (preemptions + 1): the exponential MLE over
        every instance's life (censored lives count as exposure without an event), shrunk toward
        the prior so one early preemption does not swing the policy. R: mean of allocation +
        preparation, also with the prior as one observation."""
        rows = self._exec(
            "SELECT allocated, ready, ended, end_reason, requested, region FROM incarnations "
            "WHERE provider=? AND instance_type=? AND (? IS NULL OR substr(region, 1, length(?)) = ?)",
            (provider, instance_type, region, region, region),
        )
        exposure, events, restarts = 0.0, 0, []
        for r in rows:
            if region is not None and not in_region(r["region"], region, provider):
                continue
            if r["allocated"] and r["ended"]:
                exposure += max(0.0, r["ended"] - r["allocated"])
                events += r["end_reason"] == "preempted"
            if r["requested"] and r["ready"]:
                restarts.append(r["ready"] - r["requested"])
        mttp = (exposure + prior_mttp) / (events + 1)
        restart = (sum(restarts) + prior_restart) / (len(restarts) + 1)
        return MarketStats(mttp, restart, events, exposure)
