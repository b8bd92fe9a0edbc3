"""Which machine drives a job, recorded in the job's store (`jobs/<id>/controller.json`).

A controller's lease lives in its machine's job DB (`jobdb.py`), which fences controllers of one
machine against each other but knows nothing of another machine: a coordinator VM hosting the
job (`Config.controller="cloud"`) and a `spotnb controller ID` run by hand elsewhere would each
take generation 1 of their own DB and drive the job side by side. So the driving controller
also writes its *site* (host and job DB) and an expiry to the store, renewed with its DB lease;
a controller of another site does not drive while that record is live, and a driver that finds
another site's live record (it took over after ours lapsed) stops driving.

Not a lock: two sites starting within one store round trip can both write, and the later write
wins at the next renewal (the other stops within a quarter TTL). Expiries are wall-clock times
of the writer's machine, so the TTL is generous against clock skew between machines.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import Any

from spotnb.core.store import Store

__all__ = ["StoreLease", "STORE_LEASE_TTL", "site_of"]

#: seconds a site's record keeps other sites away without a renewal (clock skew between
#: machines must stay well below it)
STORE_LEASE_TTL = 60.0


def site_of(db_path: object) -> str:
    """This machine's job DB, as other machines see it: host name and DB path."""
    return f"{socket.gethostname()}:{db_path}"


@dataclass
class StoreLease:
    """The store record of the site that drives job `job_id`."""

    store: Store
    job_id: str
    site: str
    owner: str
    ttl: float = STORE_LEASE_TTL

    @property
    def path(self) -> str:
        return self.store.job(self.job_id, "controller.json")

    def holder(self) -> dict[str, Any] | None:
        """Another site's live record, or None (none, ours, lapsed or unreadable)."""
        try:
            doc = json.loads(self.store.read_bytes(self.path))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None  # unreadable: the DB lease still fences this machine's controllers
        if not isinstance(doc, dict) or doc.get("site") == self.site:
            return None
        expires = doc.get("expires")
        if not isinstance(expires, (int, float)) or expires <= time.time():
            return None
        return doc

    def write(self) -> None:
        """Record this site as the job's driver until now + ttl."""
        doc = {"site": self.site, "owner": self.owner, "expires": time.time() + self.ttl}
        self.store.write_bytes(self.path, json.dumps(doc).encode())
