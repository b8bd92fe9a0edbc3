"""The coordinator of a job on several instances on AWS (what every cloud's coordinator must do
runs in tests/providers/test_coordinator_contract.py), against moto_server over real HTTP
(boto3 via AWS_ENDPOINT_URL): a small on-demand instance tagged with the job, on a network
interface in the job's security group, whose only inbound rule opens TCP to members of that
group; found again rather than duplicated; replaced behind the same address when it dies;
terminated with its network removed by `close` and by `spotnb gc`; listed with its hourly price
in the dry run and on its own line in the cost ledger; its user data holds no credential.

What moto cannot show: EC2's compute control plane does not run here, so no instance boots,
no user data executes on a VM and no packet crosses a security group. moto also accepts what
EC2 refuses (deleting a group or an interface still in use), so the waits in
`remove_job_network` are not exercised. The coordinator's boot script is run on this machine
instead (`test_coordinator_script_runs_the_lighthouse_and_restarts_it`), with this interpreter
as the image's Python, which already has spotnb and torchft (so nothing is pip-installed).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

import spotnb as spot
from spotnb.control.jobdb import JobDB
from spotnb.core import protocol as ev
from spotnb.core.ledger import Span, compute_breakdown, coordinator_overheads
from spotnb.core.protocol import JobStatus, Progress
from spotnb.core.signing import KEY_ENV, new_key, save_key
from spotnb.core.state import JobState
from spotnb.core.store import Store
from spotnb.errors import ConfigError
from spotnb.providers.aws.coordinator import coordinator_request, job_group_name
from spotnb.providers.aws.provider import AWSProvider
from spotnb.providers.aws.requests import SECURITY_GROUP
from spotnb.providers.base import InstanceState, LaunchSpec
from spotnb.providers.bootstrap import coordinator_script
from spotnb.providers.cleanup import JOB_TAG, gc
from spotnb.providers.coordinator import COORDINATOR_ROLE, ROLE_TAG
from tests.support.clouds_fixtures import *  # noqa: F401,F403 - fixtures
from tests.support.clouds_fixtures import CANARIES, free_port
from tests.support.jobs import agent_command
from tests.support.paths import REPO

ROOT = REPO


def _image() -> str:
    return boto3.client("ec2", region_name="us-east-1").describe_images()["Images"][0]["ImageId"]


def _config(store: str, **fields: Any) -> spot.Config:
    return spot.Config(
        provider="aws",
        store=store,
        region="us-east-1b",
        instances=3,
        min_instances=2,
        aws_image_id=_image(),
        **fields,
    )


def _spec(store: str, job: str, n: int = 1) -> LaunchSpec:
    return LaunchSpec(
        job_id=job,
        incarnation=n,
        store_url=store,
        instance_type="g4dn.xlarge",
        region="us-east-1b",
        command=agent_command(store, job, n),
        spotnb_version="0.1.0",
        slot=n - 1,
    )


def _ec2() -> Any:
    return boto3.client("ec2", region_name="us-east-1")


def _coordinators(job: str, states: tuple[str, ...] = ("pending", "running")) -> list[dict[str, Any]]:
    resp = _ec2().describe_instances(
        Filters=[
            {"Name": f"tag:{JOB_TAG}", "Values": [job]},
            {"Name": f"tag:{ROLE_TAG}", "Values": [COORDINATOR_ROLE]},
            {"Name": "instance-state-name", "Values": list(states)},
        ]
    )
    return [i for r in resp["Reservations"] for i in r["Instances"]]


def _interface(job: str) -> dict[str, Any]:
    found = _ec2().describe_network_interfaces(
        Filters=[
            {"Name": f"tag:{JOB_TAG}", "Values": [job]},
            {"Name": f"tag:{ROLE_TAG}", "Values": [COORDINATOR_ROLE]},
        ]
    )["NetworkInterfaces"]
    assert len(found) == 1
    return found[0]


def _job_group(job: str) -> dict[str, Any] | None:
    found = _ec2().describe_security_groups(Filters=[{"Name": "group-name", "Values": [job_group_name(job)]}])
    return found["SecurityGroups"][0] if found["SecurityGroups"] else None


@pytest.fixture
def job() -> str:
    """A job id of its own per test: the moto server lives for the whole session."""
    return f"20261125-000000-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def provider(s3_store_url: str) -> Iterator[AWSProvider]:
    p = AWSProvider(_config(s3_store_url))
    p.validate()
    yield p
    p.close()


def test_coordinator_is_on_demand_tagged_and_in_the_job_group(provider: AWSProvider, job: str) -> None:
    address = provider.coordinator(job, 2)
    (data,) = _coordinators(job)
    assert "InstanceLifecycle" not in data  # on demand: the spot market cannot take it back
    assert "SpotInstanceRequestId" not in data
    assert data["InstanceType"] == "t3.small"
    tags = {t["Key"]: t["Value"] for t in data["Tags"]}
    assert tags[JOB_TAG] == job and tags[ROLE_TAG] == COORDINATOR_ROLE and tags["spotnb-managed"] == "true"
    eni = _interface(job)
    group = _job_group(job)
    assert group is not None and [g["GroupId"] for g in eni["Groups"]] == [group["GroupId"]]
    assert address == f"http://{eni['PrivateIpAddress']}:29510"
    # the request itself carries no market option, whatever moto makes of it
    body = coordinator_request(
        job, image_id="ami-1", instance_type="t3.small", interface_id="eni-1", user_data=""
    )
    assert "InstanceMarketOptions" not in body and body["CreditSpecification"] == {"CpuCredits": "standard"}


def test_job_group_opens_training_ports_to_its_members_only(
    provider: AWSProvider, s3_store_url: str, job: str
) -> None:
    provider.coordinator(job, 2)
    group = _job_group(job)
    assert group is not None
    rules = group["IpPermissions"]
    assert rules, "the training ports must be open between the members"
    for rule in rules:
        assert rule["IpRanges"] == [] and rule["Ipv6Ranges"] == [] and rule["PrefixListIds"] == []
        assert [pair["GroupId"] for pair in rule["UserIdGroupPairs"]] == [group["GroupId"]]
    assert (rules[0]["IpProtocol"], rules[0]["FromPort"], rules[0]["ToPort"]) == ("tcp", 0, 65535)
    # the spot instances of the job join the group (beside spotnb's no-inbound one)
    instance = provider.launch(_spec(s3_store_url, job))
    data = _ec2().describe_instances(InstanceIds=[instance.id])["Reservations"][0]["Instances"][0]
    assert data["InstanceLifecycle"] == "spot"
    names = {g["GroupName"] for g in data["SecurityGroups"]}
    assert names == {SECURITY_GROUP, job_group_name(job)}
    # and record the coordinator they train with, for the cost ledger
    assert instance.info["coordinator"]["id"] == _coordinators(job)[0]["InstanceId"]
    provider.terminate(instance)


def test_a_second_call_finds_the_same_coordinator(provider: AWSProvider, s3_store_url: str, job: str) -> None:
    first = provider.coordinator(job, 2)
    assert provider.coordinator(job, 2) == first
    other = AWSProvider(_config(s3_store_url))  # another controller (the first one died)
    other.describe_interval = 0.0
    assert other.coordinator(job, 2) == first
    assert other.coordinator(job, 2) == first
    assert len(_coordinators(job)) == 1
    assert (
        len(
            _ec2().describe_security_groups(
                Filters=[{"Name": "group-name", "Values": [job_group_name(job)]}]
            )["SecurityGroups"]
        )
        == 1
    )


def test_a_terminated_coordinator_is_replaced_at_the_same_address(provider: AWSProvider, job: str) -> None:
    provider.describe_interval = 0.0  # describe at every call
    address = provider.coordinator(job, 2)
    (dead,) = _coordinators(job)
    _ec2().terminate_instances(InstanceIds=[dead["InstanceId"]])
    assert provider.coordinator(job, 2) == address
    (replacement,) = _coordinators(job)
    assert replacement["InstanceId"] != dead["InstanceId"]
    assert replacement["NetworkInterfaces"][0]["NetworkInterfaceId"] == _interface(job)["NetworkInterfaceId"]


def test_close_terminates_the_coordinator_and_removes_the_network(s3_store_url: str, job: str) -> None:
    p = AWSProvider(_config(s3_store_url))
    p.coordinator(job, 2)
    instance = p.launch(_spec(s3_store_url, job))
    (coordinator,) = _coordinators(job)
    p.close()
    assert _coordinators(job) == []
    assert _coordinators(job, states=("terminated",))[0]["InstanceId"] == coordinator["InstanceId"]
    assert p.describe(instance).state == InstanceState.TERMINATED
    assert _job_group(job) is None
    assert (
        _ec2().describe_network_interfaces(Filters=[{"Name": f"tag:{JOB_TAG}", "Values": [job]}])[
            "NetworkInterfaces"
        ]
        == []
    )


def test_gc_reaps_the_coordinator_of_an_ended_job(s3_store_url: str, job: str) -> None:
    """A controller died without `close`: `spotnb gc` ends the coordinator and its network."""
    db = JobDB()
    db.add_job(
        job, name=None, provider="aws", region="us-east-1", instance_type="g4dn.xlarge", store=s3_store_url
    )
    db.update_job(job, status="succeeded", heartbeat=time.time())
    AWSProvider(_config(s3_store_url)).coordinator(job, 2)  # never closed: its controller died
    (coordinator,) = _coordinators(job)
    cfg = spot.Config(provider="aws", store=s3_store_url, region="us-east-1")
    assert gc("aws", cfg) == [coordinator["InstanceId"]]
    assert _coordinators(job) == []
    assert _job_group(job) is None


def test_coordinator_user_data_holds_no_credential_and_no_job_key(provider: AWSProvider, job: str) -> None:
    """The canary credentials of the environment (clouds_fixtures.CANARIES, the same scan as
    the AWS end-to-end test) and the job's HMAC key never reach the coordinator's user data."""
    key = new_key()
    save_key(job, key)
    provider.coordinator(job, 2)
    (data,) = _coordinators(job)
    raw = _ec2().describe_instance_attribute(InstanceId=data["InstanceId"], Attribute="userData")
    import base64

    script = base64.b64decode(raw["UserData"]["Value"]).decode()
    assert script.startswith("#!/bin/bash") and "spotnb.runtime.group.lighthouse" in script
    assert "--min-replicas 2" in script and '--bind "[::]:29510"' in script
    # no identity to read the store's wheel with: it carries the module and installs torchft
    assert "<<'SPOTNB_MODULE'" in script and "pip install --quiet torchft-nightly==" in script
    assert not [name for name, value in CANARIES.items() if value in script]
    assert key.hex() not in script and KEY_ENV not in script


def test_dry_run_lists_the_coordinator_and_its_price(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # any request would fail

    def fit(ctx: Any) -> int:
        return 1

    cfg = spot.Config(provider="aws", store="s3://bucket/spotnb", region="us-east-1", instances=3)
    plan = spot.train(fit, cfg, dry_run=True)
    coordinator = plan["coordinator"]
    assert coordinator["market"] == "on-demand" and coordinator["instance_type"] == "t3.small"
    assert coordinator["price_on_demand"] == pytest.approx(0.0208)
    assert "spotnb.runtime.group.lighthouse" in coordinator["bootstrap"]
    runs = [r["body"] for r in plan["requests"] if r["api"] == "ec2.run_instances"]
    assert len(runs) == 2 and "InstanceMarketOptions" not in runs[0]  # the coordinator, on demand
    assert runs[1]["InstanceMarketOptions"]["MarketType"] == "spot"  # the training instances
    assert f"<id of security group {job_group_name('<job-id>')}>" in runs[1]["SecurityGroupIds"]
    ingress = next(r["body"] for r in plan["requests"] if r["api"] == "ec2.authorize_security_group_ingress")
    assert all(not rule.get("IpRanges") for rule in ingress["IpPermissions"])
    text = str(plan)
    line = next(row for row in text.splitlines() if row.strip().startswith("coordinator"))
    assert "t3.small" in line and "$0.0208/h on demand" in line and "not spot" in line
    assert "3 spot instances" in text
    assert "approximate" in text  # the spot instances' price row is still there


def test_ledger_bills_the_coordinator_on_its_own_line(
    provider: AWSProvider, s3_store_url: str, job: str
) -> None:
    """The coordinator an instance recorded in its info (which reaches its `allocated` event)
    is priced at its on-demand rate on its own line: not in the spot cost, not in the
    on-demand baseline of the training work, but in the total the savings are measured from."""
    provider.coordinator(job, 2)
    instance = provider.launch(_spec(s3_store_url, job))
    provider.terminate(instance)
    started = instance.info["coordinator"]["started"]
    trained = Progress(step=100, compute_s=3540.0)
    span = Span(1, started, started + 60, started + 120, started + 3660, False, trained, 0.158, 0.526)
    plain = compute_breakdown([span], started, started + 3660)
    billed = compute_breakdown(
        [span], started, started + 3660, overheads=coordinator_overheads([instance.info, instance.info])
    )
    assert billed.coordinator_cost == pytest.approx(0.0208 * 3660 / 3600)
    assert billed.coordinator_price == pytest.approx(0.0208)
    assert (billed.spot_cost, billed.on_demand_cost) == (plain.spot_cost, plain.on_demand_cost)
    assert billed.total_cost == pytest.approx(plain.spot_cost + billed.coordinator_cost)
    assert billed.savings == pytest.approx(1 - billed.total_cost / plain.on_demand_cost)
    assert billed.savings < plain.savings
    assert "coordinator $" in billed.table() and plain.coordinator_cost == 0.0


def _fit(ctx: Any) -> int:
    return 1


def test_a_failed_spot_launch_ends_the_coordinator_and_removes_its_network(
    ec2_faults: Any, s3_store_url: str
) -> None:
    """The real fleet controller: the coordinator starts, then every spot launch is refused
    with an error that is not a shortage (the fault proxy answers the RunInstances bodies that
    carry InstanceMarketOptions, i.e. the spot ones, with UnauthorizedOperation; the on-demand
    coordinator's goes through to moto). The job fails visibly and its way out (`close`)
    terminates the coordinator and deletes the job's interface and security group: nothing
    on demand is left billing."""
    ec2_faults.fail(
        "RunInstances", "us-east-1", code="UnauthorizedOperation", status=403, when="InstanceMarketOptions"
    )
    job = spot.train(_fit, _config(s3_store_url), detach=False)
    assert job.wait(240), f"job still {job.status}"
    assert job.status == JobStatus.FAILED
    assert "UnauthorizedOperation" in (job.state.error.message if job.state.error else "")
    assert ("RunInstances", "us-east-1") in ec2_faults.hits
    # the job says "failed" before its controller's way out (`provider.close()`) ran: wait
    # for the controller's thread to end
    job.driver._thread.join(timeout=300)
    assert not job.driver._thread.is_alive()
    assert _coordinators(job.id) == []
    assert len(_coordinators(job.id, states=("terminated",))) == 1
    assert _job_group(job.id) is None
    assert (
        _ec2().describe_network_interfaces(Filters=[{"Name": f"tag:{JOB_TAG}", "Values": [job.id]}])[
            "NetworkInterfaces"
        ]
        == []
    )


def test_a_coordinator_that_fails_half_way_leaves_no_network(
    ec2_faults: Any, s3_store_url: str, job: str
) -> None:
    """The job group was made, then the interface was refused: `close` still deletes the group."""
    from botocore.exceptions import ClientError

    ec2_faults.fail("CreateNetworkInterface", "us-east-1", code="UnauthorizedOperation", status=403)
    p = AWSProvider(_config(s3_store_url))
    with pytest.raises(ClientError, match="UnauthorizedOperation"):
        p.coordinator(job, 2)
    assert _job_group(job) is not None
    p.close()
    assert _job_group(job) is None and _coordinators(job) == []


def coordinator_job_events(coordinator: Any) -> list[ev.Event]:
    """A one-hour, one-instance AWS job whose instance recorded `coordinator` in its info, in its
    `launched` and `allocated` events, as the provider writes it (also fed hostile values by
    tests/market/test_zones_and_costs_bad_input.py)."""
    return [
        ev.Submitted(t=0.0, name="fit", provider="aws", instance_type="g4dn.xlarge", config={}),
        ev.Allocating(t=0.0, incarnation=1, region="us-east-1", attempt=1),
        ev.Launched(
            t=30.0,
            incarnation=1,
            instance_id="i-1",
            region="us-east-1b",
            instance_type="g4dn.xlarge",
            launched_at=30.0,
            info={"aws_region": "us-east-1", "coordinator": coordinator},
        ),
        ev.Allocated(
            t=60.0,
            incarnation=1,
            instance_id="i-1",
            region="us-east-1b",
            instance_type="g4dn.xlarge",
            alloc_s=60.0,
            info={"aws_region": "us-east-1", "incarnation": 1, "coordinator": coordinator},
            spot_price=0.158,
            on_demand_price=0.526,
        ),
        ev.Ready(t=120.0, incarnation=1, prep_s=60.0, step=0),
        ev.Progress(t=3660.0, incarnation=1, step=100, total=100, compute_s=3540.0),
        ev.Status(t=3660.0, status=JobStatus.SUCCEEDED),
    ]


def test_the_job_state_bills_the_coordinator_its_instances_recorded() -> None:
    """What every view reads (JobState: job.breakdown(), job.cost(), the widget, the panel's
    row): the coordinator named in the instances' `launched` events is its own line, and the
    savings, the projection and the one-line summary are measured from the total."""
    coordinator = {"id": "i-coord", "instance_type": "t3.small", "started": 10.0, "price": 0.0208}
    events = coordinator_job_events(coordinator)
    state = JobState.from_events(events)
    b = state.breakdown()
    assert b.coordinator_cost == pytest.approx(0.0208 * 3650 / 3600)
    assert b.total_cost == pytest.approx(b.spot_cost + b.coordinator_cost)
    cost = state.cost(b)
    assert cost["coordinator"] == pytest.approx(b.coordinator_cost) and cost["total"] == b.total_cost
    assert cost["savings"] == pytest.approx(1 - b.total_cost / b.on_demand_cost)
    assert cost["projected"] == pytest.approx(b.total_cost)
    assert "coordinator $" in cost["savings_baseline"]
    plain = JobState.from_events(
        [
            e
            if not isinstance(e, (ev.Launched, ev.Allocated))
            else dataclasses.replace(e, info={"aws_region": "us-east-1"})
            for e in events
        ]
    )
    assert plain.breakdown().coordinator_price is None
    assert "coordinator" not in plain.cost()["savings_baseline"]
    assert plain.cost()["savings"] > cost["savings"]
    from spotnb.job import Job

    job = Job("20261125-000000-c00rd1", Store("memory://coordinator-ledger"))
    job._ingest(events)
    assert "coordinator $" in job.summary() and "spent $" in job.summary()
    from spotnb.views.widget.view import render_info_html

    # the widget's headline is the whole spend, not the spot instances' alone
    assert f"<b>${b.total_cost:.4f}</b> spent" in render_info_html(state, job.id)
    assert f"<b>${plain.breakdown().spot_cost:.4f}</b> spot" in render_info_html(plain, job.id)


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _lighthouse_pids(job: str) -> list[int]:
    out = subprocess.run(
        ["pgrep", "-f", f"spotnb.runtime.group.lighthouse.*--job {job}"], capture_output=True, text=True
    )
    return [int(pid) for pid in out.stdout.split()]


def test_coordinator_script_runs_the_lighthouse_and_restarts_it(tmp_path: Path) -> None:
    """The real boot script on this machine: it finds this interpreter (torchft already there,
    so no install), serves the lighthouse from the module the script carries on its port and
    starts it again when it dies."""
    pytest.importorskip("torchft")
    port, job = free_port(), f"test-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "coordinator.sh"
    script.write_text(
        coordinator_script(
            job, min_replicas=1, cloud="aws", port=port, spotnb_version=spot.__version__, ship_lighthouse=True
        )
    )
    env = {
        **os.environ,
        "SPOTNB_PYTHON": sys.executable,
        "SPOTNB_LOG": str(tmp_path / "coordinator.log"),
        "SPOTNB_POWEROFF_CMD": "true",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.Popen(["bash", str(script)], env=env, start_new_session=True)
    try:
        _wait(lambda: _answers(port), 60, "the lighthouse to listen")
        log = (tmp_path / "coordinator.log").read_text()
        assert "pip install" not in log and "install failed" not in log
        (first,) = _lighthouse_pids(job)
        os.kill(first, signal.SIGKILL)
        _wait(lambda: _lighthouse_pids(job) not in ([], [first]), 30, "a new lighthouse")
        _wait(lambda: _answers(port), 60, "the new lighthouse to listen")
        assert "starting it again" in (tmp_path / "coordinator.log").read_text()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_hosted_controller_runs_on_the_coordinator_with_its_instance_profile(
    s3_store_url: str, job: str
) -> None:
    """`Config.controller="cloud"` (against moto): the coordinator carries the controller and
    the job key, runs with Config.controller_identity as its instance profile, never a
    credential; the notebook's `close` leaves it; asking again finds it."""
    cfg = _config(s3_store_url, controller="cloud", controller_identity="spotnb-controller")
    with pytest.raises(ConfigError, match="controller_identity.*no instance profile"):
        AWSProvider(cfg).host_controller(job, s3_store_url, "ef" * 32)
    assert not _coordinators(job)  # refused before anything was launched
    iam = boto3.client("iam", region_name="us-east-1")
    try:
        iam.create_instance_profile(InstanceProfileName="spotnb-controller")
    except iam.exceptions.EntityAlreadyExistsException:
        pass  # the moto server lives for the whole session
    p = AWSProvider(cfg)
    p.host_controller(job, s3_store_url, "ef" * 32)
    p.close()
    (data,) = _coordinators(job)
    assert data["IamInstanceProfile"]["Arn"].endswith("/spotnb-controller")
    raw = _ec2().describe_instance_attribute(InstanceId=data["InstanceId"], Attribute="userData")
    import base64

    script = base64.b64decode(raw["UserData"]["Value"]).decode()
    assert f"spotnb.cli controller {job} --store {s3_store_url}" in script
    # this notebook's spotnb (shipped now: the job had no code.json) with the cloud's extras
    assert f"SPOTNB_WHEEL_URL={s3_store_url}/code/spotnb-" in script and "ef" * 32 in script
    assert "SPOTNB_WHEEL_EXTRAS='[aws,elastic]'" in script
    assert not [name for name, value in CANARIES.items() if value in script]
    again = AWSProvider(cfg)
    again.host_controller(job, s3_store_url, "ef" * 32)
    again.close()
    assert len(_coordinators(job)) == 1
    AWSProvider(cfg).close()  # nothing of the job is this one's: still running
    assert len(_coordinators(job)) == 1


def test_dry_run_of_a_cloud_controller_shows_its_coordinator(monkeypatch: pytest.MonkeyPatch) -> None:
    """One instance, controller='cloud': the dry run plans the coordinator that hosts the
    controller (its instance profile, its script running `spotnb controller`, the key shown
    as a placeholder) and its price."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # any request would fail

    def fit(ctx: Any) -> int:
        return 1

    cfg = spot.Config(
        provider="aws",
        store="s3://bucket/spotnb",
        region="us-east-1",
        controller="cloud",
        controller_identity="spotnb-controller",
    )
    plan = spot.train(fit, cfg, dry_run=True)
    coordinator = plan["coordinator"]
    assert "spotnb.cli controller" in coordinator["bootstrap"]
    assert "spotnb.runtime.group.lighthouse" not in coordinator["bootstrap"]  # one instance: no quorum
    assert "<the job key, added at launch>" in coordinator["bootstrap"]
    runs = [r["body"] for r in plan["requests"] if r["api"] == "ec2.run_instances"]
    assert runs[0]["IamInstanceProfile"] == {"Name": "spotnb-controller"}
    assert "InstanceMarketOptions" not in runs[0]
