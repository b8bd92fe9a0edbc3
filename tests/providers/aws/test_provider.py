"""AWS provider against moto_server over real HTTP (boto3 via AWS_ENDPOINT_URL): launch with
spot options, tags and user data, describe, terminate, region fallback on a capacity error
injected by a loopback proxy, spot prices per AZ, the no-inbound security group, the store's
instance profile, gc of orphaned instances, and the dry run (no network at all)."""

from __future__ import annotations

import base64
import json
import re

import boto3
import pytest

import spotnb as spot
from spotnb.control.jobdb import JobDB
from spotnb.errors import CapacityError, ConfigError
from spotnb.market.prices import lookup_price
from spotnb.providers.aws.provider import AWSProvider
from spotnb.providers.aws.requests import DEFAULT_IMAGE, SECURITY_GROUP, split_zone
from spotnb.providers.base import Feature, InstanceState, LaunchSpec
from spotnb.providers.cleanup import JOB_TAG, gc
from spotnb.settings.registry import get_provider_class
from tests.support.clouds_fixtures import *  # noqa: F401,F403 - fixtures
from tests.support.jobs import agent_command


def _spec(
    store_url: str, region: str | None = "us-east-1b", job: str = "20261121-000000-abc123", n: int = 1
) -> LaunchSpec:
    return LaunchSpec(
        job_id=job,
        incarnation=n,
        store_url=store_url,
        instance_type="g4dn.xlarge",
        region=region,
        command=agent_command(store_url, job, n),
        requirements=["einops>=0.7"],
        spotnb_version="0.1.0",
    )


def _image() -> str:
    return boto3.client("ec2", region_name="us-east-1").describe_images()["Images"][0]["ImageId"]


@pytest.fixture
def provider(s3_store_url: str) -> AWSProvider:
    cfg = spot.Config(
        provider="aws", store=s3_store_url, region="us-east-1b", aws_image_id=_image(), aws_max_price=0.4
    )
    p = AWSProvider(cfg)
    p.validate()
    yield p
    p.close()


def test_registry_and_features() -> None:
    assert get_provider_class("aws") is AWSProvider
    assert not AWSProvider.unsupported.get(Feature.MULTI_REGION)
    assert Feature.NOTICE_ACK in AWSProvider.unsupported


def test_split_zone() -> None:
    assert split_zone("us-east-1b") == ("us-east-1", "us-east-1b")
    assert split_zone("eu-central-1") == ("eu-central-1", None)
    assert split_zone("us-gov-west-1a") == ("us-gov-west-1", "us-gov-west-1a")


def test_launch_describe_terminate(provider: AWSProvider, s3_store_url: str) -> None:
    spec = _spec(s3_store_url)
    inst = provider.launch(spec)
    assert inst.provider == "aws" and inst.region == "us-east-1b"
    ec2 = boto3.client("ec2", region_name="us-east-1")
    data = ec2.describe_instances(InstanceIds=[inst.id])["Reservations"][0]["Instances"][0]
    assert data["InstanceLifecycle"] == "spot"  # the spot market option reached EC2
    assert data["InstanceType"] == "g4dn.xlarge"
    assert data["Placement"]["AvailabilityZone"] == "us-east-1b"
    tags = {t["Key"]: t["Value"] for t in data["Tags"]}
    assert tags[JOB_TAG] == spec.job_id and tags["spotnb-incarnation"] == "1"
    assert tags["Name"] == f"spotnb-{spec.job_id}-1"
    # user data round trip: exactly the bootstrap script
    raw = ec2.describe_instance_attribute(InstanceId=inst.id, Attribute="userData")["UserData"]["Value"]
    script = base64.b64decode(raw).decode()
    assert script == provider.plan_launch(spec)["bootstrap"]
    assert script.startswith("#!/bin/bash") and "spotnb.runtime.agent" in script
    # this notebook's spotnb from the store (spotnb.providers.shipping), then the job's requirements
    assert f"SPOTNB_WHEEL_URL={s3_store_url}/code/spotnb-0.1.0-" in script
    assert "\"$SPOTNB_WHEEL_FILE$SPOTNB_WHEEL_EXTRAS\" 'einops>=0.7'" in script
    # the security group has no inbound rule
    sg = ec2.describe_security_groups(GroupIds=[g["GroupId"] for g in data["SecurityGroups"]])
    assert [g["GroupName"] for g in sg["SecurityGroups"]] == [SECURITY_GROUP]
    assert sg["SecurityGroups"][0]["IpPermissions"] == []
    assert provider.describe(inst).state == InstanceState.RUNNING
    provider.terminate(inst)
    provider.terminate(inst)  # idempotent
    assert provider.describe(inst).state == InstanceState.TERMINATED
    # a second launch reuses the group
    other = provider.launch(_spec(s3_store_url, n=2))
    groups = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [SECURITY_GROUP]}])
    assert len(groups["SecurityGroups"]) == 1
    provider.terminate(other)


def test_request_body(provider: AWSProvider, s3_store_url: str) -> None:
    body = next(
        r["body"]
        for r in provider.plan_launch(_spec(s3_store_url))["requests"]
        if r["api"] == "ec2.run_instances"
    )
    assert body["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {
            "MaxPrice": "0.4000",
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
        },
    }
    assert body["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert body["MetadataOptions"]["HttpTokens"] == "required"
    assert body["IamInstanceProfile"] == {"Name": f"spotnb-{s3_store_url.split('/')[2]}"}


def test_instance_profile_limited_to_bucket(provider: AWSProvider, s3_store_url: str) -> None:
    inst = provider.launch(_spec(s3_store_url))
    bucket = s3_store_url.split("/")[2]
    iam = boto3.client("iam", region_name="us-east-1")
    profile = iam.get_instance_profile(InstanceProfileName=f"spotnb-{bucket}")["InstanceProfile"]
    role = profile["Roles"][0]["RoleName"]
    doc = iam.get_role_policy(RoleName=role, PolicyName="spotnb-store")["PolicyDocument"]
    doc = json.loads(doc) if isinstance(doc, str) else doc
    resources = [s["Resource"] for s in doc["Statement"]]
    assert resources == [f"arn:aws:s3:::{bucket}/store/*", f"arn:aws:s3:::{bucket}"]
    provider.terminate(inst)


def test_region_fallback_on_capacity_error(ec2_faults, s3_store_url: str) -> None:
    ec2_faults.fail("RunInstances", "us-west-2")
    cfg = spot.Config(
        provider="aws", store=s3_store_url, regions=["us-west-2a", "us-east-1c"], aws_image_id=_image()
    )
    p = AWSProvider(cfg)
    with pytest.raises(CapacityError, match="InsufficientInstanceCapacity in us-west-2a"):
        p.launch(_spec(s3_store_url, region="us-west-2a"))
    assert ("RunInstances", "us-west-2") in ec2_faults.hits
    inst = p.launch(_spec(s3_store_url, region="us-east-1c"))
    assert inst.region == "us-east-1c"
    p.close()  # the safety net terminates what it launched
    assert p.describe(inst).state == InstanceState.TERMINATED


def test_controller_moves_to_next_region(ec2_faults, s3_store_url: str) -> None:
    """The real controller loop: one allocating/alloc_failed pair per failed candidate."""
    from spotnb.control.controller import Controller
    from spotnb.core.store import Store
    from spotnb.job import Job

    ec2_faults.fail("RunInstances", "us-west-2", code="InstanceLimitExceeded", status=400)
    cfg = spot.Config(
        provider="aws", store=s3_store_url, regions=["us-west-2b", "us-east-1a"], aws_image_id=_image()
    )
    store, db = Store(s3_store_url), JobDB()
    job = Job("20261121-000001-fa11ed", store, db, {})
    p = AWSProvider(cfg)
    ctl = Controller(job, cfg, p, store, db)
    assert ctl._take_lease() is not None  # as the controller's main loop does first
    inst = ctl.planner.allocate(1)
    ctl.writer.flush()
    p.close()
    events = [e for e in ctl.pump() if e["kind"] in ("allocating", "alloc_failed", "allocated")]
    assert [(e["kind"], e.get("region")) for e in events] == [
        ("allocating", "us-west-2b"),
        ("alloc_failed", "us-west-2b"),
        ("allocating", "us-east-1a"),
        ("allocated", "us-east-1a"),
    ]
    assert "InstanceLimitExceeded" in events[1]["reason"]
    assert inst is not None and inst.region == "us-east-1a"


def test_spot_prices_per_zone(provider: AWSProvider) -> None:
    prices = provider.prices("g4dn.xlarge", ["us-east-1"])
    assert prices and all(split_zone(z)[1] for z in prices)  # keyed by availability zone
    assert all(p.spot > 0 and p.on_demand > p.spot for p in prices.values())
    one = provider.prices("g4dn.xlarge", ["us-east-1b"])
    assert list(one) == ["us-east-1b"]


def test_validate_rejects_local_store() -> None:
    with pytest.raises(ConfigError, match="s3://"):
        AWSProvider(spot.Config(provider="aws", store="memory://x")).validate()
    with pytest.raises(ConfigError, match="cannot reach"):
        AWSProvider(spot.Config(provider="aws")).validate()  # default file:// store
    with pytest.raises(ConfigError, match="not an AWS region"):
        AWSProvider(spot.Config(provider="aws", store="s3://b/p", regions=["eastus"])).validate()


def test_dry_run_sends_nothing(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A dry run sends nothing and prints nothing: the returned plan shows itself, once, as a
    readable summary (price with its age, boot script in words) with the raw requests behind a
    disclosure, instead of ~180 lines of JSON followed by the same script again."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # any request would fail
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)

    def fit(ctx):
        return 1

    plan = spot.train(
        fit, spot.Config(provider="aws", store="s3://bucket/spotnb", region="us-east-1"), dry_run=True
    )
    apis = [r["api"] for r in plan["requests"]]
    assert apis[0] == "ec2.create_security_group" and apis[-1] == "ec2.run_instances"
    run = plan["requests"][-1]["body"]
    assert run["ImageId"] == DEFAULT_IMAGE and "Placement" not in run
    assert capsys.readouterr().out == ""
    text, page = str(plan), plan._repr_html_()
    assert "ec2.run_instances" in text and "approximate" in text and "old" in text
    assert "\\n" not in text and len(text.splitlines()) < 20
    assert page.count("<details>") == 2 and "spotnb.runtime.agent" in page
    assert page.index("<details>") > page.index("ec2.run_instances")  # summary first, raw behind it


def test_dry_run_states_price_source_and_age() -> None:
    def fit(ctx):
        return 1

    cfg = spot.Config(provider="aws", store="s3://b/jobs", instance_type="g4dn.xlarge", region="us-east-1")
    price = next(line for line in str(spot.train(fit, cfg, dry_run=True)).splitlines() if "price" in line)
    listed = lookup_price("g4dn.xlarge", "aws")
    assert listed is not None and f"${listed.on_demand:.3f}/h on demand" in price
    assert "approximate" in price and re.search(r"\d+ day\(s\) old|dated today", price)


def test_gc_terminates_orphans(provider: AWSProvider, s3_store_url: str) -> None:
    db = JobDB()
    done = _spec(s3_store_url, job="20261121-000002-d0d0d0")
    live = _spec(s3_store_url, job="20261121-000003-11fe11")
    foreign = _spec(s3_store_url, job="20261121-000004-f0f0f0")
    for s, status in ((done, "succeeded"), (live, "running")):
        db.add_job(
            s.job_id,
            name=None,
            provider="aws",
            region="us-east-1",
            instance_type="g4dn.xlarge",
            store=s3_store_url,
        )
        db.update_job(s.job_id, status=status, heartbeat=__import__("time").time())
    insts = {s.job_id: provider.launch(s) for s in (done, live, foreign)}
    cfg = spot.Config(provider="aws", store=s3_store_url, region="us-east-1")
    assert gc("aws", cfg, dry_run=True) == [insts[done.job_id].id]
    assert gc("aws", cfg) == [insts[done.job_id].id]
    assert provider.describe(insts[done.job_id]).state != InstanceState.RUNNING
    assert provider.describe(insts[live.job_id]).state == InstanceState.RUNNING
    assert sorted(gc("aws", cfg, all_unknown=True)) == [insts[foreign.job_id].id]
    provider.terminate(insts[live.job_id])


def test_cheapest_asks_every_region_that_offers_the_type_and_caches_the_prices(s3_store_url: str) -> None:
    """regions="cheapest": the candidates come from the API (the account's regions, kept when
    they offer the type), not a list in spotnb; the prices are cached on disk and say their
    age (moto's EC2 over HTTP)."""
    import json

    from spotnb.core.home import spotnb_home

    p = AWSProvider(spot.Config(provider="aws", store=s3_store_url, regions="cheapest"))
    prices = p.prices("g4dn.xlarge")
    regions = {split_zone(z)[0] for z in prices}
    assert len(regions) > 3 and "eu-west-1" in regions  # beyond the three regions spotnb once listed
    assert all(split_zone(z)[1] for z in prices)  # keyed by availability zone
    assert all("fetched just now" in price.source for price in prices.values())
    (entry,) = [f for f in (spotnb_home() / "cache").glob("aws-spot-g4dn.xlarge-*.json")]
    data = json.loads(entry.read_text())
    data["fetched"] -= 300  # as if fetched five minutes ago: the next ask reads the cache
    entry.write_text(json.dumps(data))
    again = p.prices("g4dn.xlarge")
    assert again.keys() == prices.keys()
    assert all("fetched 5 min ago" in price.source for price in again.values())
    data["fetched"] -= 3600  # older than the TTL: asked again
    entry.write_text(json.dumps(data))
    assert all("fetched just now" in price.source for price in p.prices("g4dn.xlarge").values())


def test_cheapest_with_a_type_no_region_offers_says_so(s3_store_url: str) -> None:
    p = AWSProvider(spot.Config(provider="aws", store=s3_store_url, regions="cheapest"))
    with pytest.raises(ConfigError, match="no AWS region .* offers 'g9zz.nonexistent'"):
        p.prices("g9zz.nonexistent")
