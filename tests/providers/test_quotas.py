"""A new account's quota errors are clear and final (issue #25, item 4), through each cloud's
REAL SDK request serialisation:

- AWS: boto3 against moto_server over HTTP. moto cannot refuse a launch for a quota, nor knows
  EC2's quotas in Service Quotas, so a loopback proxy in front of it (`tests.support.clouds_fixtures.
  FaultProxy`) answers RunInstances with EC2's error document (the code and message EC2 sends)
  and GetServiceQuota with Service Quotas' JSON; everything else reaches moto.
- Azure: the real ComputeManagementClient over `tests.support.azure_transport.ArmTransport`, Azure
  Resource Manager's answers from `ArmCompute` (a refused PUT, an operation that fails later,
  the Usage API, a persistent 429 the SDK's own retry policy gives up on).
- GCP: google-cloud-compute's REST transport (`tests.support.gcp_transport`), GCE's JSON error
  documents (a synchronous 403 quotaExceeded, an operation's QUOTA_EXCEEDED).

A quota never reads as "no capacity": it names the quota, its value where the error or an API
gives it, and how to raise it; the real controller ends the job failed, with an error event,
before any instance is launched (or, mid-job, keeping the checkpoint to resume from), while a
shortage is still waited out (`max_wait`, 1 h by default, naming each region and what it said).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest

import spotnb as spot
from spotnb.control.controller import Controller
from spotnb.control.jobdb import JobDB
from spotnb.core.store import Store
from spotnb.errors import CapacityError, QuotaError
from spotnb.job import Job
from spotnb.providers.aws.provider import AWSProvider
from spotnb.providers.azure.provider import AzureProvider
from spotnb.providers.base import LaunchSpec
from spotnb.providers.gcp.provider import GCPProvider
from tests.support.azure_transport import SUBSCRIPTION, ArmCompute, compute_client, resource_client
from tests.support.clouds_fixtures import *  # noqa: F401,F403 - fixtures
from tests.support.clouds_fixtures import ship_fake
from tests.support.gcp_transport import compute_clients, done_operation, gce_error
from tests.support.jobs import agent_command

_MAX_SPOT = "Max spot instance count exceeded"


@pytest.fixture
def ship(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The job's shipped spotnb, stood in for (`ship_fake`): no wheel is built."""
    return ship_fake(monkeypatch)


def _spec(
    store: str, region: str | None, itype: str = "g4dn.xlarge", job: str = "20261201-000000-q0001"
) -> LaunchSpec:
    return LaunchSpec(
        job_id=job,
        incarnation=1,
        store_url=store,
        instance_type=itype,
        region=region,
        command=agent_command(store, job),
        spotnb_version="0.1.0",
    )


def _aws(store: str, **kw: Any) -> spot.Config:
    """An AWS config whose launches go straight to RunInstances (a given group, profile and
    image: nothing set up first; the refusals under test come before any of them matters)."""
    base = dict(
        provider="aws",
        store=store,
        aws_image_id="ami-0123456789abcdef0",
        aws_security_group_ids=["sg-0123456789abcdef0"],
        aws_instance_profile="spotnb-test",
    )
    return spot.Config(**{**base, **kw})


def _sq(proxy: Any, region: str, code: str, value: float) -> None:
    proxy.answer_json(
        "ServiceQuotasV20190624.GetServiceQuota",
        region,
        200,
        {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "QuotaName": "x", "Value": value}},
    )


# -- AWS ----------------------------------------------------------------------------------------
def test_aws_spot_quota_is_final_and_says_how_to_raise_it(
    ec2_faults: Any, s3_store_url: str, ship: Any
) -> None:
    ec2_faults.fail(
        "RunInstances", "us-east-1", code="MaxSpotInstanceCountExceeded", status=400, message=_MAX_SPOT
    )
    _sq(ec2_faults, "us-east-1", "L-3819A6DF", 0.0)
    p = AWSProvider(_aws(s3_store_url, region="us-east-1b"))
    with pytest.raises(QuotaError) as err:
        p.launch(_spec(s3_store_url, "us-east-1b"))
    message = str(err.value)
    assert not isinstance(err.value, CapacityError)
    assert "'All G and VT Spot Instance Requests' (L-3819A6DF) in us-east-1 is 0 vCPUs" in message
    assert "g4dn.xlarge needs 4 vCPUs" in message  # EC2's DescribeInstanceTypes (moto)
    assert (
        "aws service-quotas request-service-quota-increase --service-code ec2 --quota-code "
        "L-3819A6DF --region us-east-1 --desired-value 4" in message
    )
    assert (
        "https://us-east-1.console.aws.amazon.com/servicequotas/home/services/ec2/quotas/L-3819A6DF"
        in message
    )
    assert "MaxSpotInstanceCountExceeded: Max spot instance count exceeded" in message
    assert ("ServiceQuotasV20190624.GetServiceQuota", "us-east-1") in ec2_faults.hits
    assert (
        err.value.covers("us-east-1a")
        and err.value.covers("us-east-1")
        and not err.value.covers("us-east-2a")
    )
    p.close()


def test_aws_vcpu_limit_from_the_message_when_service_quotas_says_no(
    ec2_faults: Any, s3_store_url: str, ship: Any
) -> None:
    ec2_faults.fail(
        "RunInstances",
        "us-east-1",
        code="VcpuLimitExceeded",
        status=400,
        message="You have requested more vCPU capacity than your current vCPU limit of 8 allows for the "
        "instance bucket that the specified instance type belongs to.",
    )
    ec2_faults.answer_json(  # no servicequotas:GetServiceQuota permission
        "ServiceQuotasV20190624.GetServiceQuota",
        "us-east-1",
        400,
        {"__type": "AccessDeniedException", "message": "not authorized"},
    )
    p = AWSProvider(_aws(s3_store_url, region="us-east-1"))
    with pytest.raises(
        QuotaError, match=r"\(L-7212CCBC\) in us-east-1 is 8 vCPUs; p4d\.24xlarge needs 96"
    ) as err:
        p.launch(_spec(s3_store_url, "us-east-1", itype="p4d.24xlarge"))
    assert "--desired-value 104" in str(err.value)
    p.close()


def test_aws_a_5xx_without_an_error_document_is_asked_again(
    ec2_faults: Any, s3_store_url: str, ship: Any
) -> None:
    """EC2 unavailable (503, no body) after botocore's own retry: asked again later, never read
    as a quota (it was a ClientError: the controller failed the job)."""
    ec2_faults.answer_raw("RunInstances", "us-east-1", 503, b"")
    p = AWSProvider(_aws(s3_store_url, region="us-east-1b"))
    with pytest.raises(CapacityError, match="EC2 answered HTTP 503") as err:
        p.launch(_spec(s3_store_url, "us-east-1b"))
    assert not isinstance(err.value, QuotaError)
    p.close()


def _controller(cfg: spot.Config, provider: Any, store_url: str, job_id: str) -> tuple[Controller, Job]:
    store, db = Store(store_url), JobDB()
    job = Job(job_id, store, db, {})
    return Controller(job, cfg, provider, store, db), job


def _run(ctl: Controller, within: float = 30.0) -> None:
    """The real controller's thread, to the job's end (its last pump feeds `job.events`)."""
    ctl.start()
    ctl._thread.join(within)
    assert not ctl._thread.is_alive(), "the controller did not end the job"


def test_every_region_over_quota_fails_the_job_before_anything_is_billed(
    ec2_faults: Any, s3_store_url: str, ship: Any
) -> None:
    """Two regions, both at a zero quota: each asked once, no backoff, no instance, the job
    failed with an error naming both; a shortage in a third is still worth its wait."""
    for region in ("us-west-2", "us-east-1"):
        ec2_faults.fail(
            "RunInstances", region, code="MaxSpotInstanceCountExceeded", status=400, message=_MAX_SPOT
        )
        _sq(ec2_faults, region, "L-3819A6DF", 0.0)
    cfg = _aws(s3_store_url, regions=["us-west-2a", "us-east-1b", "us-west-2b"])
    ctl, job = _controller(cfg, AWSProvider(cfg), s3_store_url, "20261201-000000-q0002")
    started = time.monotonic()
    _run(ctl)
    assert time.monotonic() - started < 20
    events = list(job.events)
    assert [(e.kind, e.get("region")) for e in events if e.kind in ("allocating", "alloc_failed")] == [
        ("allocating", "us-west-2a"),
        ("alloc_failed", "us-west-2a"),  # us-west-2b is in the same region: never asked
        ("allocating", "us-east-1b"),
        ("alloc_failed", "us-east-1b"),
    ]
    assert not [e for e in events if e.kind in ("launched", "allocated")]
    assert all(e["retry_in"] == 0.0 for e in events if e.kind == "alloc_failed")
    assert job.status == "failed"
    (error,) = [e for e in events if e.kind == "error"]
    assert error["exc_type"] == "QuotaError"
    assert "in us-west-2 is 0 vCPUs" in error["message"] and "in us-east-1 is 0 vCPUs" in error["message"]
    assert [e for e in events if e.kind == "status"][-1]["reason"] == "quota"


def test_max_wait_names_each_region_and_what_it_said(ec2_faults: Any, s3_store_url: str, ship: Any) -> None:
    """A quota takes its region out; the shortage elsewhere is waited out up to max_wait,
    whose message names each region tried and its answer."""
    assert spot.Config().max_wait == 3600.0  # finite by default
    ec2_faults.fail(
        "RunInstances", "us-west-2", code="MaxSpotInstanceCountExceeded", status=400, message=_MAX_SPOT
    )
    ec2_faults.fail(  # (400, not EC2's 500: botocore's own retry of a 5xx would use up the wait)
        "RunInstances",
        "us-east-1",
        status=400,
        message="We currently do not have sufficient g4dn.xlarge capacity",
    )
    cfg = _aws(s3_store_url, regions=["us-west-2a", "us-east-1b"], max_wait="2s")
    ctl, job = _controller(cfg, AWSProvider(cfg), s3_store_url, "20261201-000000-q0003")
    _run(ctl)
    assert job.status == "stopped"
    (stopped,) = [e for e in job.events if e.kind == "stopped"]
    reason = stopped["reason"]
    assert reason.startswith("max_wait=2s reached")
    assert "us-west-2a (AWS quota: 'All G and VT Spot Instance Requests'" in reason
    assert "us-east-1b (InsufficientInstanceCapacity in us-east-1b: We currently do not have" in reason
    asked = [e.get("region") for e in job.events if e.kind == "allocating"]
    assert asked.count("us-west-2a") == 1 and asked.count("us-east-1b") >= 2


def test_a_quota_mid_job_fails_it_and_keeps_the_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first instance trains and saves, the market takes it back, and the relaunch is
    refused for a quota (the local market's own provider, its second launch answered with the
    QuotaError the AWS provider builds from EC2's words): the job fails at once, naming the
    quota and the checkpoint a resume goes on from."""
    from spotnb import api
    from spotnb.providers.local.provider import LocalProvider
    from spotnb.providers.quotas import aws_quota_error
    from tests.support import jobfns

    class QuotaAfterFirst(LocalProvider):
        def _launch(self, spec: LaunchSpec) -> Any:
            if spec.incarnation > 1:
                raise aws_quota_error(  # type: ignore[misc]
                    "MaxSpotInstanceCountExceeded",
                    _MAX_SPOT,
                    instance_type="g4dn.xlarge",
                    region="us-east-1",
                    where="us-east-1a",
                )
            return super()._launch(spec)

    monkeypatch.setattr(api, "get_provider_class", lambda name: QuotaAfterFirst)
    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=40, step_time=0.01),
        spot.Config(
            ship_modules=["tests.support.jobfns"],
            save_every=5,
            local_schedule=[{"step": 12, "phase": "step"}],
        ),
        detach=False,
    )
    with pytest.raises(spot.JobFailed, match="All G and VT Spot Instance Requests") as err:
        job.result(timeout=90)
    assert job.status == "failed"
    assert "spot.resume(" in str(err.value) and "checkpoint of step" in str(err.value)
    assert len([e for e in job.events if e.kind == "allocated"]) == 1


# -- Azure --------------------------------------------------------------------------------------
_RG = "spotnb-rg"
_GROUP = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{_RG}/providers"
_SUBNET = f"{_GROUP}/Microsoft.Network/virtualNetworks/v/subnets/s"
_IDENTITY = f"{_GROUP}/Microsoft.ManagedIdentity/userAssignedIdentities/x"
_AZ_QUOTA = (
    "Operation could not be completed as it results in exceeding approved LowPriorityCores quota. "
    "Additional details - Deployment Model: Resource Manager, Location: eastus, Current Limit: 0, "
    "Current Usage: 0, Additional Required: 4, (Minimum) New Limit Required: 4. Submit a request for "
    "Quota increase at https://aka.ms/ProdCportalCRP/#blade/Microsoft_Azure_Capacity/UsageAndQuota.ReactView"
)


def _azure(**kw: Any) -> tuple[AzureProvider, ArmCompute, Any]:
    cfg = spot.Config(
        **{
            **dict(
                provider="azure",
                store="az://spotnb/jobs",
                region="eastus",
                instance_type="Standard_NC4as_T4_v3",
                azure_subscription_id=SUBSCRIPTION,
                azure_resource_group=_RG,
                azure_subnet_id=_SUBNET,
                azure_identity_id=_IDENTITY,
                azure_storage_account="spotnbstore",
            ),
            **kw,
        }
    )
    arm = ArmCompute()
    compute = compute_client(arm)
    return AzureProvider(cfg, compute=compute, resources=resource_client(arm.generic)), arm, compute


@pytest.mark.parametrize(
    ("status", "code", "message", "says"),
    [
        pytest.param(
            409,
            "OperationNotAllowed",
            _AZ_QUOTA,
            "'LowPriorityCores' in eastus is 0 vCPUs (0 in use), 4 needed",
            id="operation-not-allowed",
        ),
        pytest.param(
            409,
            "QuotaExceeded",
            "Quota exceeded for this subscription",
            "is 8 vCPUs (2 in use)",
            id="quota-exceeded-usage-api",
        ),
    ],
)
def test_azure_quota_is_final_and_says_how_to_raise_it(
    status: int, code: str, message: str, says: str, ship: Any
) -> None:
    p, arm, compute = _azure()
    arm.usages["eastus"] = {"cores": (0, 100), "lowPriorityCores": (2, 8)}
    arm.refuse_all = (status, code, message)
    with pytest.raises(QuotaError) as err:
        p.launch(_spec("az://spotnb/jobs", "eastus", itype="Standard_NC4as_T4_v3"))
    text = str(err.value)
    assert says in text, text
    assert "az quota update --resource-name lowPriorityCores --scope /subscriptions/" in text
    assert "/providers/Microsoft.Compute/locations/eastus" in text and "--resource-type lowPriority" in text
    assert "Microsoft_Azure_Capacity/QuotaMenuBlade" in text and "az vm list-usage --location eastus" in text
    assert [m for m, _ in arm.log] == ["PUT"]  # asked once: nothing was created


def test_azure_throttling_is_not_a_quota(ship: Any) -> None:
    """Compute answers throttling with 429 and the same broad OperationNotAllowed code: the
    SDK's retry policy asks again (honouring Retry-After), then spotnb waits, like a shortage."""
    p, arm, compute = _azure()
    arm.refuse_all = (
        429,
        "OperationNotAllowed",
        "The server rejected the request because too many requests have been received for this subscription.",
    )
    with pytest.raises(CapacityError, match="throttled") as err:
        p.launch(_spec("az://spotnb/jobs", "eastus", itype="Standard_NC4as_T4_v3"))
    assert not isinstance(err.value, QuotaError)
    assert len([m for m, _ in arm.log if m == "PUT"]) > 1  # azure-core's RetryPolicy retried it


def test_azure_other_operation_not_allowed_is_azures_answer(ship: Any) -> None:
    from azure.core.exceptions import HttpResponseError

    p, arm, _ = _azure()
    arm.refuse_all = (
        409,
        "OperationNotAllowed",
        "The subscription is disabled and therefore marked as read only.",
    )
    with pytest.raises(HttpResponseError, match="disabled"):
        p.launch(_spec("az://spotnb/jobs", "eastus", itype="Standard_NC4as_T4_v3"))


def test_azure_a_malformed_error_body(ship: Any) -> None:
    """A body that is no ARM document: a 5xx (after the SDK's own retries) is asked again
    later; a 4xx is Azure's answer as it is. Neither reads as a quota."""
    from azure.core.exceptions import HttpResponseError

    p, arm, _ = _azure()
    arm.refuse_all = (500, "", "")
    arm.generic.refuse.clear()
    original = arm.__call__

    def garbage(request: Any) -> Any:
        answer = original(request)
        return (answer[0], b"<html>upstream error</html>") if answer[0] >= 400 else answer

    p._compute = compute_client(garbage)
    with pytest.raises(CapacityError, match="Azure answered HTTP 500"):
        p.launch(_spec("az://spotnb/jobs", "eastus", itype="Standard_NC4as_T4_v3"))
    arm.refuse_all = (409, "", "")
    with pytest.raises(HttpResponseError) as err:
        p.launch(_spec("az://spotnb/jobs", "eastus", itype="Standard_NC4as_T4_v3"))
    assert not isinstance(err.value, (QuotaError, CapacityError))


def test_gcp_a_bare_503_is_asked_again(ship: Any) -> None:
    p, _ = _gce((503, {"error": {"code": 503, "message": "<html>Service Unavailable</html>"}}))
    with pytest.raises(CapacityError):
        p.launch(_spec("gs://spotnb/jobs", "us-central1-a", itype="g2-standard-4"))


def test_azure_allocation_failure_backs_off_and_a_late_quota_ends_the_job(ship: Any, tmp_path: Any) -> None:
    """Azure accepts the create, then its operation fails (AllocationFailed): the controller
    deletes the VM and asks again only after an exponential, jittered wait (it asked again at
    once: a tight create/delete loop). An operation that fails for a quota ends the job."""
    p, arm, _ = _azure(max_wait="3.5s")
    arm.fail_all_later = (
        "AllocationFailed",
        "Allocation failed. We do not have sufficient capacity for the requested VM size in this region.",
    )
    cfg = p.config
    url = (tmp_path / "store").as_uri()
    ctl, job = _controller(cfg, p, url, "20261201-000000-q0004")
    _run(ctl)
    failed = [e for e in job.events if e.kind == "alloc_failed"]
    assert len(failed) >= 2 and "AllocationFailed" in failed[0]["reason"]
    waits = [e["retry_in"] for e in failed]
    assert all(w > 0 for w in waits[:-1]), waits
    assert waits[1] > waits[0] * 0.9 or waits[1] >= 0.5  # exponential steps, jittered
    asked = [e.t for e in job.events if e.kind == "allocating"]
    for before, after, wait in zip(failed, asked[1:], waits, strict=False):
        assert after - before.t >= wait * 0.9  # it really waited
    puts, deletes = [n for m, n in arm.log if m == "PUT"], [n for m, n in arm.log if m == "DELETE"]
    assert len(puts) <= 4 and set(puts) <= set(deletes)  # each failed VM deleted, few creates
    assert job.status == "stopped"  # max_wait: a shortage is not final

    p2, arm2, _ = _azure()
    arm2.fail_all_later = ("OperationNotAllowed", _AZ_QUOTA)
    ctl2, job2 = _controller(p2.config, p2, url, "20261201-000000-q0005")
    _run(ctl2)
    assert job2.status == "failed"
    (error,) = [e for e in job2.events if e.kind == "error"]
    assert "LowPriorityCores" in error["message"] and error["exc_type"] == "QuotaError"


# -- GCP ----------------------------------------------------------------------------------------
_PROJECT = "spotnb-test"


def _gce(answer: tuple[int, Any]) -> tuple[GCPProvider, Any]:
    def handler(request: Any) -> tuple[int, Any]:
        if request.method == "GET" and request.path.endswith("/zones"):
            region = f"https://www.googleapis.com/compute/v1/projects/{_PROJECT}/regions/us-central1"
            return 200, {
                "items": [{"name": f"us-central1-{z}", "status": "UP", "region": region} for z in "abc"]
            }
        return answer

    instances, zones, adapter = compute_clients(handler)
    cfg = spot.Config(
        provider="gcp",
        store="gs://spotnb/jobs",
        region="us-central1",
        instance_type="g2-standard-4",
        gcp_project=_PROJECT,
        gcp_service_account="spotnb@spotnb-test.iam.gserviceaccount.com",
    )
    return GCPProvider(cfg, instances=instances, zones=zones), adapter


@pytest.mark.parametrize(
    ("answer", "says", "scope"),
    [
        pytest.param(
            (
                403,
                gce_error(
                    403,
                    "Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region us-central1.",
                    "quotaExceeded",
                ),
            ),
            "GCP quota: NVIDIA_L4_GPUS in us-central1 is 0",
            "region",
            id="regional-403",
        ),
        pytest.param(
            (
                200,
                done_operation(
                    "us-central1-a",
                    error=(403, "QUOTA_EXCEEDED", "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally."),
                ),
            ),
            "GCP quota: GPUS_ALL_REGIONS in every region (a project-wide quota) is 0",
            "global",
            id="global-operation",
        ),
        pytest.param(
            (200, done_operation("us-central1-a", error=(403, "QUOTA_EXCEEDED", "<html>quota</html>"))),
            "for a quota it did not name",
            "region",
            id="unnamed-operation",
        ),
    ],
)
def test_gcp_quota_is_final_and_says_how_to_raise_it(
    answer: tuple[int, Any], says: str, scope: str, ship: Any
) -> None:
    p, adapter = _gce(answer)
    with pytest.raises(QuotaError) as err:
        p.launch(_spec("gs://spotnb/jobs", "us-central1", itype="g2-standard-4"))
    text = str(err.value)
    assert says in text, text
    assert f"https://console.cloud.google.com/iam-admin/quotas?project={_PROJECT}" in text
    assert "gcloud compute " in text
    assert err.value.scope == scope
    inserts = [r for r in adapter.requests if r.method == "POST"]
    assert len(inserts) == 1  # the region's other zones share the quota: not asked
    if scope == "global":
        assert err.value.covers("europe-west4-a") and not err.value.covers("aws/us-east-1a")


def test_gcp_rate_limit_is_not_a_quota(ship: Any) -> None:
    p, _ = _gce(
        (
            429,
            gce_error(
                429,
                "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute'",
                "rateLimitExceeded",
            ),
        )
    )
    with pytest.raises(CapacityError):
        p.launch(_spec("gs://spotnb/jobs", "us-central1-a", itype="g2-standard-4"))
