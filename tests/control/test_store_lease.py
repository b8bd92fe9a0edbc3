"""The store's record of which machine drives a job (`spotnb.control.lease`): another machine's
live record keeps a controller away; this machine's own, a lapsed one or a damaged one do not
(this machine's job DB lease fences its own controllers). The whole path, with a second
machine's `spotnb controller` refused while a coordinator drives the job, is
`tests/control/test_cloud_controller_killed.py::test_a_second_machine_s_controller_does_not_drive_a_hosted_job`."""

from __future__ import annotations

import json
import time
from pathlib import Path

from spotnb.control.lease import StoreLease
from spotnb.core.store import Store


def _lease(tmp_path: Path, site: str) -> StoreLease:
    return StoreLease(Store(tmp_path.as_uri()), "job", site, f"{site}:owner")


def test_another_sites_live_record_is_the_holder_until_it_lapses(tmp_path: Path) -> None:
    here, there = _lease(tmp_path, "a:/db"), _lease(tmp_path, "b:/db")
    assert here.holder() is None  # nobody yet
    there.write()
    held = here.holder()
    assert held is not None and held["site"] == "b:/db"
    assert there.holder() is None  # a site never fences itself: its DB lease does
    there.ttl = -1.0  # b stopped renewing: its record lapsed
    there.write()
    assert here.holder() is None


def test_a_damaged_record_keeps_nobody_away(tmp_path: Path) -> None:
    here = _lease(tmp_path, "a:/db")
    for raw in (b"not json", b"[1, 2]", json.dumps({"site": "b:/db", "expires": "soon"}).encode()):
        here.store.write_bytes(here.path, raw)
        assert here.holder() is None, raw
    here.store.write_bytes(here.path, json.dumps({"site": "b:/db", "expires": time.time() + 60}).encode())
    assert here.holder() is not None
