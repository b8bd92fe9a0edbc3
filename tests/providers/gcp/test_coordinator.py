"""The coordinator of a job on several instances on GCP: what is GCP's own (what every cloud's
coordinator must do runs in tests/providers/test_coordinator_contract.py).

The Compute Engine control plane cannot run here (no emulator exists), so it is the one thing
faked, and below `requests`: the provider drives REAL google-cloud-compute clients
(`InstancesClient`, `AddressesClient`, `FirewallsClient`, REST transport) whose requests the
stateful `tests/gce_fake.FakeCompute` answers in-process (VMs that exist, their status,
deletions; a reservation gets an internal IP, as GCE assigns it; firewall rules kept as sent).
What is asserted is what those clients serialised (the JSON bodies of the address, the rules
and the VMs; the order of inserts and deletes), how spotnb reacts to a coordinator that died,
and what it deletes. The real fleet controller runs against it in
`test_a_coordinator_that_never_stays_up_fails_the_job_and_leaves_nothing`. No packet crosses a
firewall rule here, and no VM boots.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions as gexc

import spotnb as spot
from spotnb.core.ledger import Span, compute_breakdown, coordinator_overheads
from spotnb.core.protocol import JobStatus, Progress
from spotnb.core.signing import KEY_ENV, new_key, save_key
from spotnb.errors import ConfigError
from spotnb.providers.base import LaunchSpec
from spotnb.providers.cleanup import JOB_TAG, gc
from spotnb.providers.coordinator import COORDINATOR_ROLE, MAX_COORDINATOR_LAUNCHES, ROLE_TAG
from spotnb.providers.gcp import provider as gcp_module
from spotnb.providers.gcp.coordinator import COORDINATOR_PRICES, address_name, firewall_names, job_network_tag
from spotnb.providers.gcp.provider import GCPProvider
from tests.support.clouds_fixtures import ship_fake
from tests.support.gce_fake import FakeCompute
from tests.support.gcp_transport import gce_error

CANARIES = {
    "AZURE_CLIENT_SECRET": "spotnb-canary-azure-client-secret-4d3c",
    "AZURE_STORAGE_KEY": "spotnb-canary-azure-storage-key-8e7f",
    "GOOGLE_OAUTH_ACCESS_TOKEN": "spotnb-canary-gcp-token-1a2b",
    "AWS_SECRET_ACCESS_KEY": "spotnb-canary-aws-secret-5g6h",
}

PROJECT = "spotnb-test"
ZONE = "us-central1-a"
JOB = "20261125-000000-gc0001"
IP = "10.128.0.42"


def _config(**kw: Any) -> spot.Config:
    base = dict(
        provider="gcp",
        store="gs://spotnb/jobs",
        region=ZONE,
        instance_type="g2-standard-4",
        instances=3,
        min_instances=2,
        gcp_project=PROJECT,
    )
    return spot.Config(**{**base, **kw})


def _spec(n: int = 1) -> LaunchSpec:
    return LaunchSpec(
        job_id=JOB,
        incarnation=n,
        store_url="gs://spotnb/jobs",
        instance_type="g2-standard-4",
        region=ZONE,
        command=["python", "-m", "spotnb.runtime.agent", "--job", JOB, "--incarnation", str(n)],
        spotnb_version="0.1.0",
        slot=n - 1,
        job_key="00" * 32,
    )


def _is_coordinator(body: dict[str, Any]) -> bool:
    return (body.get("labels") or {}).get(ROLE_TAG) == COORDINATOR_ROLE


@pytest.fixture
def gce() -> FakeCompute:
    """A new VM is RUNNING at once."""
    compute = FakeCompute(PROJECT, "us-central1")
    compute.status_on_insert = lambda body: "RUNNING"
    return compute


def _coordinators_die(gce: FakeCompute) -> None:
    """A new coordinator is TERMINATED at once (its boot script powered it off)."""
    gce.status_on_insert = lambda body: "TERMINATED" if _is_coordinator(body) else "RUNNING"


def _provider(gce: FakeCompute, **kw: Any) -> GCPProvider:
    p = GCPProvider(_config(**kw), **gce.clients())
    p.validate()
    p.describe_interval = 0.0  # describe at every call
    return p


def _coordinators(gce: FakeCompute) -> list[dict[str, Any]]:
    """The coordinator VMs that exist now."""
    return [vm for vm in gce.instances.values() if _is_coordinator(vm)]


def _inserted(gce: FakeCompute) -> list[dict[str, Any]]:
    """The bodies of the instances.insert requests that created a VM."""
    made = set(gce.deleted) | {name for _, name in gce.instances}
    return [r.body for r in gce.inserts() if r.body["name"] in made]


def _calls(gce: FakeCompute) -> list[tuple[str, str]]:
    """("insert" | "delete", VM name) of every instance insert and delete sent, in order."""
    out = []
    for r in gce.adapter.requests:
        parts = r.path.split("/")
        if "instances" not in parts or "zones" not in parts:
            continue
        if r.method == "POST" and parts[-1] == "instances":
            out.append(("insert", r.body["name"]))
        elif r.method == "DELETE":
            out.append(("delete", parts[-1]))
    return out


def _script(vm: dict[str, Any]) -> str:
    (script,) = [i["value"] for i in vm["metadata"]["items"] if i["key"] == "startup-script"]
    return script


def test_coordinator_is_standard_on_the_reserved_address_with_the_job_tag(
    gce: FakeCompute, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The canary secrets of the environment and the job's HMAC key never reach the boot script."""
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    key = new_key()
    save_key(JOB, key)
    assert _provider(gce).coordinator(JOB, 2) == f"http://{IP}:29510"
    (address,) = [r for r in gce.adapter.requests if r.method == "POST" and "/addresses" in r.path]
    assert address.path == f"/compute/v1/projects/{PROJECT}/regions/us-central1/addresses"
    body = address.body
    assert (body["name"], body["addressType"], body["purpose"]) == (
        address_name(JOB),
        "INTERNAL",
        "GCE_ENDPOINT",
    )
    assert body["labels"][JOB_TAG] == JOB and body["labels"][ROLE_TAG] == COORDINATOR_ROLE
    (vm,) = _inserted(gce)
    (insert,) = gce.inserts()
    assert insert.path == f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances"
    assert vm["scheduling"]["provisioningModel"] == "STANDARD"  # on demand: never preempted
    assert vm["scheduling"]["automaticRestart"] is True
    assert vm["scheduling"]["onHostMaintenance"] == "MIGRATE"
    assert vm["machineType"] == f"zones/{ZONE}/machineTypes/e2-small"
    assert vm["networkInterfaces"][0]["networkIP"] == IP
    assert vm["tags"]["items"] == [job_network_tag(JOB)]
    assert vm["labels"] == {JOB_TAG: JOB, "spotnb-managed": "true", ROLE_TAG: COORDINATOR_ROLE}
    assert not vm.get("serviceAccounts")  # it reads nothing of the job
    script = _script(vm)
    # the lighthouse module travels in the script (it has no identity to read the store with)
    assert '"$SPOTNB_LIGHTHOUSE" --min-replicas 2' in script and '--bind "[::]:29510"' in script
    assert "spotnb.runtime.group.lighthouse.py" in script and "<<'SPOTNB_MODULE'" in script
    assert not [name for name, value in CANARIES.items() if value in script]
    assert key.hex() not in script and KEY_ENV not in script


def test_firewall_opens_tcp_to_the_members_only(gce: FakeCompute) -> None:
    p = _provider(gce)
    p.coordinator(JOB, 2)
    allow_name, deny_name = firewall_names(JOB)
    rules = [r for r in gce.adapter.requests if r.method == "POST" and "/firewalls" in r.path]
    assert [r.path for r in rules] == [f"/compute/v1/projects/{PROJECT}/global/firewalls"] * 2
    assert {r.body["name"] for r in rules} == {allow_name, deny_name}
    allow, deny = gce.firewalls[allow_name], gce.firewalls[deny_name]
    tag = job_network_tag(JOB)
    assert (allow["direction"], allow["priority"]) == ("INGRESS", 1000)
    assert allow["sourceTags"] == allow["targetTags"] == [tag]
    assert not allow.get("sourceRanges")  # membership only, no address range
    assert allow["allowed"] == [{"IPProtocol": "tcp", "ports": ["0-65535"]}]
    assert not allow.get("denied")
    # default-allow-internal (65534) would admit the whole network: denied right after
    assert (deny["priority"], deny["sourceRanges"], deny["targetTags"]) == (1001, ["0.0.0.0/0"], [tag])
    assert [d["IPProtocol"] for d in deny["denied"]] == ["tcp"] and not deny.get("allowed")
    # the Spot VMs of the job carry the tag, and record the coordinator they train with
    instance = p.launch(_spec())
    spot_vm = _inserted(gce)[-1]
    assert spot_vm["scheduling"]["provisioningModel"] == "SPOT" and spot_vm["tags"]["items"] == [tag]
    assert instance.info["coordinator"]["id"] == _coordinators(gce)[0]["name"]


@pytest.mark.parametrize("death", ["deleted", "powered_off"])
def test_a_dead_coordinator_is_replaced_at_the_same_address(gce: FakeCompute, death: str) -> None:
    p = _provider(gce)
    address = p.coordinator(JOB, 2)
    (dead,) = _coordinators(gce)
    if death == "deleted":
        gce.vanish(ZONE, dead["name"])
    else:  # its idle guard or a failed install powered it off: it still holds the address
        gce.power_off(ZONE, dead["name"])
    assert p.coordinator(JOB, 2) == address
    (replacement,) = _coordinators(gce)
    assert replacement["name"] != dead["name"] and replacement["networkInterfaces"][0]["networkIP"] == IP
    calls = _calls(gce)
    deleted_first = ("delete", dead["name"]) in calls
    assert deleted_first == (death == "powered_off")
    if deleted_first:  # freed before the replacement asked for the address
        assert calls.index(("delete", dead["name"])) < calls.index(("insert", replacement["name"]))


def test_an_address_still_in_use_is_tried_again(gce: FakeCompute) -> None:
    p = _provider(gce)
    address = p.coordinator(JOB, 2)
    gce.instances.clear()
    gce.refuse_next = [
        (
            400,
            gce_error(
                400,
                f"IP_IN_USE_BY_ANOTHER_RESOURCE: IP '{IP}' is already being used by another resource.",
                "badRequest",
            ),
        )
    ]
    assert p.coordinator(JOB, 2) == address and _coordinators(gce) == []
    assert p.coordinator(JOB, 2) == address and len(_coordinators(gce)) == 1
    assert [kind for kind, _ in _calls(gce)] == ["insert", "insert", "insert"]


def test_close_deletes_the_coordinator_the_address_and_the_rules(gce: FakeCompute) -> None:
    p = _provider(gce)
    p.coordinator(JOB, 2)
    p.launch(_spec())
    p.close()
    assert gce.instances == {} and gce.addresses == {} and gce.firewalls == {}
    deletes = {r.path.rsplit("/", 2)[-2] for r in gce.adapter.requests if r.method == "DELETE"}
    assert deletes == {"addresses", "firewalls", "instances"}


def test_gc_reaps_a_powered_off_coordinator_and_its_network(
    gce: FakeCompute, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller died without `close`, and the coordinator's idle guard powered it off
    (TERMINATED still holds its disk and the address): `spotnb gc` deletes it all."""
    from spotnb.control.jobdb import JobDB

    db = JobDB()
    db.add_job(JOB, name=None, provider="gcp", region=ZONE, instance_type="x", store="gs://spotnb/jobs")
    db.update_job(JOB, status="succeeded")
    _provider(gce).coordinator(JOB, 2)  # never closed
    (coordinator,) = _coordinators(gce)
    gce.power_off(ZONE, coordinator["name"])

    class Wired(GCPProvider):
        def __init__(self, config: Any) -> None:
            super().__init__(config, **gce.clients())

    monkeypatch.setattr("spotnb.settings.registry.get_provider_class", lambda name: Wired)
    assert gc("gcp", _config(instances=1, min_instances=1)) == [coordinator["name"]]
    assert gce.instances == {} and gce.addresses == {} and gce.firewalls == {}


def _fit(ctx: Any) -> int:
    return 1


def test_a_coordinator_that_never_stays_up_fails_the_job_and_leaves_nothing(
    gce: FakeCompute, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The real fleet controller and a file store (the boot check of a remote store is lifted:
    no VM reads it here): every coordinator powers off at once; the job fails with the reason,
    and its way out deletes the Spot VMs, the coordinator, the address and the rules."""
    _coordinators_die(gce)

    class Wired(GCPProvider):
        describe_interval = 0.0

        def __init__(self, config: Any) -> None:
            super().__init__(config, **gce.clients())

    monkeypatch.setattr("spotnb.api.get_provider_class", lambda name: Wired)
    monkeypatch.setattr(gcp_module, "require_remote_store", lambda config, name: None)
    job = spot.train(_fit, _config(store=(tmp_path / "store").as_uri()), detach=False)
    assert job.wait(120), f"job still {job.status}"
    assert job.status == JobStatus.FAILED
    assert "did not stay up" in (job.state.error.message if job.state.error else "")
    job.driver._thread.join(timeout=120)
    assert not job.driver._thread.is_alive()
    assert len([c for c in _calls(gce) if c[0] == "insert" and "-coord-" in c[1]]) == MAX_COORDINATOR_LAUNCHES
    assert gce.instances == {} and gce.addresses == {} and gce.firewalls == {}


def test_dry_run_lists_the_coordinator_and_its_price() -> None:
    plan = spot.train(_fit, _config(), dry_run=True)
    coordinator = plan["coordinator"]
    assert coordinator["market"] == "on-demand" and coordinator["instance_type"] == "e2-small"
    assert coordinator["price_on_demand"] == pytest.approx(COORDINATOR_PRICES["e2-small"])
    inserts = [r["body"] for r in plan["requests"] if r["api"] == "compute_v1.InstancesClient.insert"]
    assert [b["scheduling"]["provisioning_model"] for b in inserts] == ["STANDARD", "SPOT"]
    assert inserts[1]["tags"]["items"] == inserts[0]["tags"]["items"]  # one network tag
    rules = [r["body"] for r in plan["requests"] if r["api"] == "compute_v1.FirewallsClient.insert"]
    assert [(bool(r["allowed"]), bool(r["denied"])) for r in rules] == [(True, False), (False, True)]
    text = str(plan)
    line = next(row for row in text.splitlines() if row.strip().startswith("coordinator"))
    assert "e2-small" in line and f"${COORDINATOR_PRICES['e2-small']:.4f}/h on demand" in line
    assert "3 spot instances" in text


def test_ledger_bills_the_coordinator_on_its_own_line(gce: FakeCompute) -> None:
    p = _provider(gce, coordinator_price=0.02)
    p.coordinator(JOB, 2)
    instance = p.launch(_spec())
    started = instance.info["coordinator"]["started"]
    trained = Progress(step=100, compute_s=3540.0)
    span = Span(1, started, started + 60, started + 120, started + 3660, False, trained, 0.2, 0.7)
    plain = compute_breakdown([span], started, started + 3660)
    overheads = coordinator_overheads([instance.info])
    billed = compute_breakdown([span], started, started + 3660, overheads=overheads)
    assert billed.coordinator_cost == pytest.approx(0.02 * 3660 / 3600)
    assert billed.total_cost == pytest.approx(plain.spot_cost + billed.coordinator_cost)
    assert billed.spot_cost == plain.spot_cost and "coordinator $" in billed.table()


def test_a_list_that_lags_behind_never_starts_a_second_coordinator(gce: FakeCompute) -> None:
    p = _provider(gce)
    p.coordinator(JOB, 2)
    gce.list_lags = True
    p.coordinator(JOB, 2)
    gce.list_lags = False
    assert len(_coordinators(gce)) == 1 and len(gce.inserts()) == 1
    listed = [r for r in gce.adapter.requests if r.method == "GET" and r.path.endswith("/instances")]
    assert listed and all(
        f'(labels.{JOB_TAG} = "{JOB}")' in r.query["filter"][0] for r in listed
    )  # the label filter GCE applies


def test_a_coordinator_that_fails_half_way_leaves_no_network(gce: FakeCompute) -> None:
    """The firewall rules were made, then the address was refused: `close` still deletes them."""
    gce.refuse_address = (
        403,
        gce_error(
            403, f"Required 'compute.addresses.create' permission for 'projects/{PROJECT}'", "forbidden"
        ),
    )
    p = _provider(gce)
    with pytest.raises(gexc.Forbidden):
        p.coordinator(JOB, 2)
    assert len(gce.firewalls) == 2
    p.close()
    assert gce.firewalls == {} and gce.instances == {} and gce.addresses == {}


def test_another_jobs_coordinator_is_left_alone(gce: FakeCompute) -> None:
    """Killing one job's coordinator neither counts nor replaces the other job's."""
    p = _provider(gce)
    p.coordinator(JOB, 2)
    p.coordinator("20261125-000000-other1", 2)
    mine = next(vm for vm in _coordinators(gce) if vm["labels"][JOB_TAG] == JOB)
    gce.power_off(ZONE, mine["name"])
    p.coordinator("20261125-000000-other1", 2)
    assert (ZONE, mine["name"]) in gce.instances  # only its own controller call replaces it
    p.coordinator(JOB, 2)
    assert len(_coordinators(gce)) == 2 and (ZONE, mine["name"]) not in gce.instances


def test_a_custom_network_needs_its_subnetwork() -> None:
    with pytest.raises(ConfigError, match="gcp_subnetwork"):
        GCPProvider(_config(gcp_network="projects/p/global/networks/train")).validate()


def test_a_hosted_controller_runs_on_the_coordinator_with_its_service_account(
    gce: FakeCompute, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Config.controller="cloud"`: the coordinator carries the controller (and the job key it
    verifies the spec with), runs as Config.controller_identity, never a credential; the
    notebook's `close` leaves it running, and asking again does not start a second one."""
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    account = f"spotnb-ctl@{PROJECT}.iam.gserviceaccount.com"
    shipped = ship_fake(monkeypatch)  # the store is not reachable here
    p = _provider(gce, controller="cloud", controller_identity=account)
    p.host_controller(JOB, "gs://spotnb/jobs", "cd" * 32)
    p.close()
    (vm,) = _inserted(gce)
    assert [a["email"] for a in vm["serviceAccounts"]] == [account]
    script = _script(vm)
    assert f"spotnb.cli controller {JOB} --store gs://spotnb/jobs" in script
    assert "SPOTNB_WHEEL_EXTRAS='[gcp,elastic]'" in script and "cd" * 32 in script
    assert shipped == [(JOB, bytes.fromhex("cd" * 32))]  # the job's wheel, verified with its key
    assert not [name for name, value in CANARIES.items() if value in script]
    assert not [c for c in _calls(gce) if c[0] == "delete"]  # the job now depends on it
    again = _provider(gce, controller="cloud", controller_identity=account)
    again.host_controller(JOB, "gs://spotnb/jobs", "cd" * 32)
    assert len(gce.inserts()) == 1


def test_a_missing_coordinator_image_names_its_field(gce: FakeCompute) -> None:
    """The coordinator's insert answered GCE's synchronous 404 for its image (GCE's error
    document, mapped by google-api-core itself): the field that names the image is the one to
    fix, not a retry."""
    image = "projects/my-images/global/images/family/gone"
    gce.refuse_next = [(404, gce_error(404, f"The resource '{image}' was not found"))]
    p = _provider(gce, gcp_coordinator_image=image)
    with pytest.raises(ConfigError, match=r"^Config\.gcp_coordinator_image: the image .*family/gone"):
        p.coordinator(JOB, 2)
    assert _coordinators(gce) == [] and len(gce.inserts()) == 1
    assert gce.inserts()[0].body["disks"][0]["initializeParams"]["sourceImage"] == image
