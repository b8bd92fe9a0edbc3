"""What a first run on Azure needs (issue #25, item 5), through the real SDKs:

- the notebook opens its own az:// store with `azure_storage_account` (adlfs, no environment);
- a virtual network and subnet created on first use when `azure_subnet_id` is not given: named
  in the dry run, created once and found again (a virtual network is never PUT twice: that
  would replace its subnets), tagged as spotnb's, and deleted by `spotnb gc` only if spotnb
  made it;
- a finished VM is deleted by the controller (Azure's Stopped VM is still billed), and a VM
  that ends itself deallocates through Resource Manager (the boot scripts, the coordinator's
  idle guard) and is then read as the exit it is, not as an eviction;
- the notice watcher waits out Scheduled Events' slow first call in its own thread.

Azure Resource Manager is `tests.support.azure_transport.ArmCompute` behind the real
ComputeManagementClient and ResourceManagementClient (azure-core's pipeline, serialisation,
pollers and error mapping all run); Scheduled Events is the local market's metadata emulator.
"""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

import pytest

import spotnb as spot
from spotnb.control.controller import Controller
from spotnb.control.jobdb import JobDB
from spotnb.core import protocol as ev
from spotnb.core.events import EventWriter
from spotnb.core.store import Store
from spotnb.job import Job
from spotnb.providers.azure.coordinator import NETWORK_API_VERSION, default_network_ids
from spotnb.providers.azure.provider import AzureProvider, vm_name
from spotnb.providers.base import InstanceState, InstanceStatus, LaunchSpec
from spotnb.providers.bootstrap import coordinator_script
from spotnb.providers.cleanup import MANAGED_TAG, gc
from spotnb.providers.local.metadata import MetadataEmulator
from spotnb.runtime.notice import AzureWatcher
from tests.support.azure_transport import SUBSCRIPTION, ArmCompute, compute_client, resource_client
from tests.support.clouds_fixtures import ship_fake
from tests.support.jobs import agent_command

RG = "spotnb-eastus"
IDENTITY = (
    f"/subscriptions/{SUBSCRIPTION}/resourceGroups/ids/providers/Microsoft.ManagedIdentity/"
    "userAssignedIdentities/x"
)
VNET, SUBNET = default_network_ids(SUBSCRIPTION, RG, "eastus")
JOB = "20261202-000000-az0001"


@pytest.fixture
def ship(monkeypatch: pytest.MonkeyPatch) -> Any:
    return ship_fake(monkeypatch)


def _config(**kw: Any) -> spot.Config:
    base = dict(
        provider="azure",
        store="az://spotnb/jobs",
        region="eastus",
        instance_type="Standard_NC4as_T4_v3",
        azure_subscription_id=SUBSCRIPTION,
        azure_identity_id=IDENTITY,
        azure_storage_account="spotnbstore",
    )
    return spot.Config(**{**base, **kw})


def _provider(arm: ArmCompute, **kw: Any) -> AzureProvider:
    return AzureProvider(_config(**kw), compute=compute_client(arm), resources=resource_client(arm.generic))


def _spec(n: int = 1, job: str = JOB) -> LaunchSpec:
    url = _config().store_url()
    return LaunchSpec(
        job_id=job,
        incarnation=n,
        store_url=url,
        instance_type="Standard_NC4as_T4_v3",
        region="eastus",
        command=agent_command(url, job, n),
        spotnb_version="0.1.0",
    )


# -- the store account reaches the notebook side -------------------------------------------------
def test_the_notebook_opens_its_store_with_the_configured_account(monkeypatch: pytest.MonkeyPatch) -> None:
    """adlfs needs the account; only the VM got it ("Must provide either a connection_string or
    account_name" at submit). The store's URL now carries it, so every process that opens the
    store by URL (this notebook, a detached controller, the VM, a later kernel) finds it."""
    from spotnb.providers.code_fetch import azure_request
    from spotnb.submit import open_store as _open_store

    for name in (
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_CONNECTION_STRING",
        "AZURE_STORAGE_ACCOUNT_KEY",
    ):
        monkeypatch.delenv(name, raising=False)
    cfg = _config()
    assert cfg.store_url() == "az://spotnb@spotnbstore.blob.core.windows.net/jobs"
    store = _open_store(cfg.store_url())  # the submit's own open
    assert store.fs.account_name == "spotnbstore" and store.root == "spotnb/jobs"
    assert Store(store.url).fs.account_name == "spotnbstore"  # a detached controller's open
    assert spot.Config(store="az://spotnb/jobs").store_url() == "az://spotnb/jobs"  # no account: as given
    # the VM: its boot script's store URL, and the wheel fetch that reads the account from it
    assert AzureProvider(cfg).storage_account() == "spotnbstore"
    monkeypatch.setattr("spotnb.providers.code_fetch._read", lambda *a, **k: b'{"access_token": "t"}')
    url, _ = azure_request("spotnb@spotnbstore.blob.core.windows.net", "jobs/code/x.whl", {})
    assert url == "https://spotnbstore.blob.core.windows.net/spotnb/jobs/code/x.whl"


# -- a network of spotnb's own when azure_subnet_id is not given ---------------------------------
def test_a_network_is_created_on_first_use_found_again_and_named_in_the_dry_run(ship: Any) -> None:
    arm = ArmCompute()
    p = _provider(arm)
    p.validate()  # azure_subnet_id is no longer required
    p.launch(_spec(1))
    p.launch(_spec(2))
    puts = [rid for rid, _ in arm.generic.puts]
    assert puts.count(VNET) == 1  # once per location
    body = dict(arm.generic.puts)[VNET]
    assert body["tags"] == {MANAGED_TAG: "true"} and body["location"] == "eastus"
    assert body["properties"]["subnets"][0]["name"] == "spotnb"
    vm_puts = [r for r in arm.generic.log if r[0] == "put"]
    assert vm_puts[0][1].lower().endswith("/resourcegroups/spotnb-eastus")  # the group, then the network
    network_requests = [r for r in p.resources.transport.requests if "virtualNetworks" in r.path]
    assert network_requests and all(
        r.query.get("api-version") == [NETWORK_API_VERSION] for r in network_requests
    )
    nic = arm.vms[vm_name(_spec(1))]["properties"]["networkProfile"]["networkInterfaceConfigurations"][0]
    assert nic["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"] == SUBNET
    # a second controller (a new provider) finds it: a GET, never a second PUT of the network
    again = _provider(arm)
    again.launch(_spec(3))
    assert [rid for rid, _ in arm.generic.puts].count(VNET) == 1
    # the dry run names it
    plan = spot.train(lambda ctx: 1, _config(), dry_run=True)
    (planned,) = [r for r in plan["requests"] if r["args"].get("resource_id") == VNET]
    assert planned["body"] == body and "azure_subnet_id is not set" in planned["note"]
    assert plan["subnet"] == SUBNET
    # a configured subnet is used as it is: nothing created
    mine = ArmCompute()
    _provider(
        mine,
        azure_subnet_id="/subscriptions/s/resourceGroups/r/providers/Microsoft.Network/virtualNetworks/v/subnets/s",
    ).launch(_spec())
    assert not [rid for rid, _ in mine.generic.puts if "virtualNetworks" in rid]


def test_gc_deletes_spotnb_s_network_only(ship: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    arm = ArmCompute()
    p = _provider(arm)
    p.launch(_spec(1))
    theirs = (
        f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{RG}/providers/Microsoft.Network/virtualNetworks/prod"
    )
    arm.generic.store[theirs] = {"location": "eastus", "tags": {}, "properties": {}}
    lookalike = f"{theirs.rsplit('/', 1)[0]}/spotnb-x"  # spotnb's name, not spotnb's tag
    arm.generic.store[lookalike] = {"location": "eastus", "tags": {"owner": "me"}, "properties": {}}
    # a live job here: spotnb's network is kept (a launch may be about to use it)
    JobDB().add_job(JOB, name="j", provider="azure", region="eastus", instance_type="x", store="az://s/j")
    JobDB().update_job(JOB, status="running", heartbeat=time.time())

    monkeypatch.setattr(
        "spotnb.settings.registry.get_provider_class", lambda name: lambda cfg: _provider(arm)
    )
    gc("azure", _config())
    assert VNET in arm.generic.store
    JobDB().update_job(JOB, status="succeeded")
    gc("azure", _config())
    assert VNET not in arm.generic.store and ("delete", VNET) in arm.generic.log
    assert theirs in arm.generic.store and lookalike in arm.generic.store  # never another's


# -- a finished VM: deleted, or deallocated, never left Stopped ----------------------------------
def test_the_controller_deletes_a_vm_whose_guest_powered_off(ship: Any, tmp_path: Any) -> None:
    """The agent reports done and its script powers the OS off: Azure shows the VM Stopped
    (still allocated, still billed). The real controller reads that as the exit it is and
    deletes the VM (DELETE through the compute SDK) before the job is marked succeeded."""
    arm = ArmCompute()
    p = _provider(arm)
    store_url = (tmp_path / "store").as_uri()
    store, db = Store(store_url), JobDB()
    job = Job(JOB, store, db, {})
    ctl = Controller(job, p.config, p, store, db)
    ctl.start()
    name = vm_name(_spec(1))
    deadline = time.monotonic() + 20
    while name not in arm.vms and time.monotonic() < deadline:
        time.sleep(0.05)
    agent = EventWriter(store, JOB, 1, "agent")
    agent.emit(ev.Ready(prep_s=0.1, step=0, total=1))
    agent.emit(ev.Done(result="result.pkl", step=1))
    agent.flush()
    arm.power[name] = "stopped"  # the guest shut itself down after the agent exited
    ctl._thread.join(30)
    assert job.status == "succeeded"
    assert ("DELETE", name) in arm.log and name not in arm.vms
    exited = [e for e in job.events if e.kind == "exited"]
    assert exited and exited[-1]["reason"] == "done"


def test_a_vm_that_deallocated_itself_after_its_agent_exited_is_no_eviction(tmp_path: Any) -> None:
    """A deallocated VM reads as an eviction (policy Deallocate). After the boot script said the
    agent exited, it is the VM ending itself: the agent's error fails the job (it was relaunched
    as preempted)."""
    from spotnb.core.protocol import Outcome
    from spotnb.providers.base import Instance

    store_url = (tmp_path / "store").as_uri()
    store, db = Store(store_url), JobDB()
    job = Job(JOB, store, db, {})
    ctl = Controller(job, _config(), AzureProvider(_config()), store, db)
    w = EventWriter(store, JOB, 1, "agent")
    w.emit(ev.Error(message="boom", exc_type="ValueError"))
    w.flush()
    boot = EventWriter(store, JOB, 1, "boot")
    boot.emit(ev.Bootstrap(phase="agent_exited", cloud="azure", code=1))
    boot.flush()
    ctl.pump()
    inst = Instance("vm", "azure", "eastus", "x", time.time())
    out = ctl.classify(
        1, inst, InstanceStatus(InstanceState.PREEMPTED, detail={"azure": ["PowerState/deallocated"]})
    )
    assert out.reason == Outcome.USER_ERROR and out.code == 1
    # without the script's word, or when a signal ended the agent (the platform's shutdown of
    # an evicted VM), it is an eviction, as before
    for job_id, code in (("20261202-000000-az0002", None), ("20261202-000000-az0003", 143)):
        if code is not None:
            boot = EventWriter(store, job_id, 1, "boot")
            boot.emit(ev.Bootstrap(phase="agent_exited", cloud="azure", code=code))
            boot.flush()
        other = Controller(Job(job_id, store, db, {}), _config(), AzureProvider(_config()), store, db)
        other.pump()
        assert other.classify(1, inst, InstanceStatus(InstanceState.PREEMPTED)).reason == Outcome.PREEMPTED


def test_azure_scripts_end_their_vm_by_deallocation(ship: Any) -> None:
    """The instances' boot script and the coordinator's idle guard end the VM through Resource
    Manager (a power-off leaves it Stopped and billed), and start Scheduled Events at boot."""
    arm = ArmCompute()
    p = _provider(arm)
    p.launch(_spec(1))
    data = arm.vms[vm_name(_spec(1))]["properties"]["osProfile"]["customData"]
    cloud_config = base64.b64decode(data).decode()
    from spotnb.providers.bootstrap import azure_cloud_config

    coordinator = base64.b64decode(
        azure_cloud_config(coordinator_script(JOB, min_replicas=1, cloud="azure"))
    ).decode()
    for text in (cloud_config, coordinator):
        assert "/deallocate?api-version=" in text and "$imds/identity/oauth2/token" in text
        assert "SPOTNB_POWEROFF_CMD=${SPOTNB_POWEROFF_CMD:-spotnb_azure_end}" in text
        assert text.index("spotnb_azure_end()") < text.index("${SPOTNB_POWEROFF_CMD:-shutdown -h now}")
        assert "metadata/scheduledevents?api-version=2020-07-01" in text
    assert "spotnb coordinator: no replica for" in coordinator  # the idle guard uses it
    # the identity it deallocates with
    assert list(arm.vms[vm_name(_spec(1))]["identity"]["userAssignedIdentities"]) == [IDENTITY]


# -- Scheduled Events' slow first call -----------------------------------------------------------
def test_the_watcher_waits_out_a_slow_first_scheduled_events_call() -> None:
    """Scheduled Events is switched on by a first call that may take up to two minutes; one
    given up on after 2 s switches nothing on, and an early notice was never seen."""
    em = MetadataEmulator()
    em.register("vm-1")
    em.azure_first_call_s = 2.5
    got = threading.Event()
    w = AzureWatcher(base_url=em.base_url("vm-1"), poll=0.05, on_notice=lambda n: got.set())
    started = time.monotonic()
    w.start()
    assert time.monotonic() - started < 0.5  # the training goes on meanwhile
    em.notify("vm-1", time.time() + 30)  # an early notice, while the first call waits
    try:
        assert got.wait(10), "the notice was never seen"
        assert w.notice is not None and w.notice.action == "Preempt"
    finally:
        w.stop()
        em.close()


def test_a_metadata_server_that_never_answers_blocks_nothing() -> None:
    em = MetadataEmulator()
    em.register("vm-1")
    em.azure_first_call_s = float("inf")
    w = AzureWatcher(base_url=em.base_url("vm-1"), poll=0.05)
    w.first_timeout = 0.5
    started = time.monotonic()
    w.start()
    time.sleep(0.8)
    w.stop()
    assert time.monotonic() - started < 1.3  # start and stop never wait for the server
    assert w.notice is None and w.errors >= 1 and not w.answered
    em.close()
