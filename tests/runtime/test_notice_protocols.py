"""The three notice watchers against spotnb's metadata emulator, protocol detail by protocol
detail (docs/dev/notices.md, "Cloud notices"): IMDSv2 tokens that expire (401 → new token), the
rebalance hint; Azure's DocumentIncarnation and the acknowledgement; GCP's etag long poll and 503 retries.
Nothing is mocked: real HTTP on 127.0.0.1. Waits are on events with a bound, not sleeps."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

import pytest

from spotnb.providers.local.metadata import MetadataEmulator
from spotnb.runtime.notice import AwsWatcher, AzureWatcher, GcpWatcher, Notice, make_watcher


@pytest.fixture
def emulator() -> Any:
    em = MetadataEmulator()
    em.register("vm-1")
    yield em
    em.close()


def _puts(em: MetadataEmulator) -> int:
    return len(em.tokens)


# -- AWS IMDSv2 ------------------------------------------------------------------------------
def test_aws_instance_action_and_token_expiry(emulator: MetadataEmulator) -> None:
    w = AwsWatcher(base_url=emulator.base_url("vm-1"))
    assert w.check() is None and _puts(emulator) == 1
    assert w.check() is None and _puts(emulator) == 1  # the token is reused
    for token in list(emulator.tokens):  # every token expires at once
        emulator.tokens[token] = time.time() - 1
    assert w.check() is None and _puts(emulator) == 2  # 401 → a new token → the retry works
    deadline = time.time() + 120
    emulator.notify("vm-1", deadline)
    notice = w.check()
    assert isinstance(notice, Notice)
    assert notice.source == "aws" and notice.action == "terminate"
    assert abs(notice.deadline - deadline) < 1.0  # ISO time, whole seconds


def test_aws_short_ttl_is_refreshed_before_it_runs_out() -> None:
    em = MetadataEmulator(token_max_ttl=30)  # the server grants less than asked
    em.register("vm-1")
    try:
        w = AwsWatcher(base_url=em.base_url("vm-1"))
        w.check()
        assert w._token_expiry <= time.time() + 30  # the granted TTL was honoured
    finally:
        em.close()


def test_aws_rebalance_is_a_hint_once(emulator: MetadataEmulator) -> None:
    hints: list[dict] = []
    w = AwsWatcher(base_url=emulator.base_url("vm-1"), on_hint=hints.append)
    emulator.rebalance("vm-1")
    assert w.check() is None and w.check() is None  # a hint, not a notice
    assert len(hints) == 1 and hints[0]["hint"] == "rebalance" and "noticeTime" in hints[0]


def test_aws_token_put_without_forwarding(emulator: MetadataEmulator) -> None:
    import urllib.error

    req = urllib.request.Request(
        emulator.base_url("vm-1") + "/latest/api/token",
        method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": "60", "X-Forwarded-For": "10.0.0.1"},
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=2)
    assert err.value.code == 403


# -- Azure Scheduled Events ------------------------------------------------------------------
def test_azure_incarnation_and_ack(emulator: MetadataEmulator) -> None:
    acked = threading.Event()
    emulator.instances["vm-1"].on_ack = acked.set
    w = AzureWatcher(base_url=emulator.base_url("vm-1"))
    assert w.check() is None  # DocumentIncarnation 0, no event
    assert w.document_incarnation == 0
    emulator.notify("vm-1", time.time() + 30)
    notice = w.check()
    assert notice is not None and notice.action == "Preempt" and notice.event_id
    assert w.document_incarnation == 1
    assert w.check() is None  # same incarnation: nothing new
    w.notice = notice
    w.acknowledge()  # after the emergency save
    assert acked.wait(5)  # the platform proceeds (after the reply)
    req = urllib.request.Request(
        emulator.base_url("vm-1") + AzureWatcher.url_suffix, headers={"Metadata": "true"}
    )
    doc = json.loads(urllib.request.urlopen(req, timeout=2).read())
    assert doc["Events"][0]["EventStatus"] == "Started"


def test_azure_ignores_other_vms(emulator: MetadataEmulator) -> None:
    w = AzureWatcher(base_url=emulator.base_url("vm-1"), vm_name="some-other-vm")
    emulator.notify("vm-1", time.time() + 30)  # the event names vm-1
    assert w.check() is None


# -- GCP metadata server -----------------------------------------------------------------------
def _run(w: GcpWatcher) -> threading.Event:
    got = threading.Event()
    w.on_notice = lambda n: got.set()
    w.long_poll_timeout = 5
    w.poll = 0.05
    w.start()
    return got


def test_gcp_long_poll_with_etag(emulator: MetadataEmulator) -> None:
    w = GcpWatcher(base_url=emulator.base_url("vm-1"))
    got = _run(w)
    # wait (bounded) until both watchers are parked in a long poll carrying an etag
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sum("last_etag=" in p for p in emulator.paths) < 2:
        time.sleep(0.01)
    assert sum("last_etag=" in p for p in emulator.paths) >= 2
    emulator.maintenance_event("vm-1", "TERMINATE_ON_HOST_MAINTENANCE")
    assert got.wait(10)
    assert w.notice.action == "TERMINATE_ON_HOST_MAINTENANCE" and w.notice.source == "gcp"
    w.stop()


def test_gcp_notice_already_there_is_seen(emulator: MetadataEmulator) -> None:
    emulator.notify("vm-1", time.time() + 30)  # preempted=TRUE before we look
    w = GcpWatcher(base_url=emulator.base_url("vm-1"))
    got = _run(w)
    assert got.wait(10) and w.notice.action == "PREEMPTED"
    assert "wait_for_change" not in emulator.paths[0]  # first a plain read
    w.stop()


def test_gcp_503_is_retried(emulator: MetadataEmulator) -> None:
    emulator.gcp_unavailable = 4
    w = GcpWatcher(base_url=emulator.base_url("vm-1"))
    got = _run(w)
    emulator.maintenance_event("vm-1", "MIGRATE_ON_HOST_MAINTENANCE")  # not a preemption
    emulator.notify("vm-1", time.time() + 30)
    assert got.wait(10) and w.notice.action == "PREEMPTED"
    assert w.unavailable >= 1 and emulator.gcp_unavailable == 0
    w.stop()


def test_make_watcher() -> None:
    assert isinstance(make_watcher("aws"), AwsWatcher)
    assert make_watcher("gcp").base_url == "http://metadata.google.internal"
    with pytest.raises(ValueError, match="unknown notice format"):
        make_watcher("oracle")
