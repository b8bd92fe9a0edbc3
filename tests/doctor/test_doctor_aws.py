"""`spotnb doctor --provider aws` against moto_server over real HTTP, through boto3's and s3fs's
own request serialisation.

moto lacks three APIs the doctor calls; a loopback proxy in front of it (`tests/support/doctor_proxy.py`)
answers them in AWS's wire format: Service Quotas `GetServiceQuota` for EC2 (moto knows only
VPC's quotas), IAM `SimulatePrincipalPolicy` (not implemented), and SSM `GetParameter` for the
Deep Learning AMI's public parameter (moto holds only Amazon Linux's). The same proxy injects
the faults: refused credentials, a read-only bucket, a cloud answering 500, garbage, or nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from spotnb.doctor.report import FAIL, OK, SKIP, UNKNOWN, Report, doctor
from spotnb.providers.aws.requests import DEFAULT_IMAGE
from tests.support.clouds_fixtures import *  # noqa: F401,F403 - fixtures
from tests.support.clouds_fixtures import _forget_s3fs, free_port
from tests.support.doctor_proxy import HANG, ProxyRequest, RuleProxy

SSM_PATH = DEFAULT_IMAGE.removeprefix("resolve:ssm:")


class FakeAws:
    """The answers moto cannot give, and the faults, as settable knobs."""

    def __init__(self, ami: str) -> None:
        self.ami = ami
        self.quota = 32.0  # vCPUs of the family's spot quota
        self.denied: set[str] = set()  # actions SimulatePrincipalPolicy denies
        self.expired = False  # STS answers ExpiredToken
        self.read_only: str | None = None  # a bucket whose PutObject is AccessDenied
        self.broken: dict[str, Any] = {}  # service → (status, ctype, body) or HANG
        self.actions: dict[str, Any] = {}  # a query-protocol action → (status, ctype, body)

    def __call__(self, r: ProxyRequest) -> Any:
        if r.service in self.broken:
            return self.broken[r.service]
        if "*" in self.broken:
            return self.broken["*"]
        if r.action in self.actions:
            return self.actions[r.action]
        if r.service == "sts" and self.expired:
            return _xml_error(403, "ExpiredToken", "The security token included in the request is expired")
        if r.service == "servicequotas":
            code = json.loads(r.body or b"{}").get("QuotaCode", "")
            quota = {"ServiceCode": "ec2", "QuotaCode": code, "QuotaName": "spot", "Value": self.quota}
            return 200, "application/x-amz-json-1.1", json.dumps({"Quota": quota}).encode()
        if r.service == "ssm" and r.target.endswith("GetParameter"):
            name = json.loads(r.body or b"{}").get("Name")
            if name == SSM_PATH:
                param = {
                    "Name": name,
                    "Type": "String",
                    "Value": self.ami,
                    "Version": 1,
                    "DataType": "aws:ec2:image",
                }
                return 200, "application/x-amz-json-1.1", json.dumps({"Parameter": param}).encode()
        if r.service == "iam" and r.action == "SimulatePrincipalPolicy":
            return _simulate(r.form, self.denied)
        if (
            r.service == "s3"
            and r.method == "PUT"
            and self.read_only
            and r.path.startswith(f"/{self.read_only}/")
        ):
            doc = b"<?xml version='1.0'?><Error><Code>AccessDenied</Code><Message>Denied</Message></Error>"
            return 403, "application/xml", doc
        return None


def _xml_error(status: int, code: str, message: str) -> tuple[int, str, bytes]:
    doc = (
        f"<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error>"
        "<RequestId>doctor-test</RequestId></ErrorResponse>"
    )
    return status, "text/xml", doc.encode()


def _simulate(form: dict[str, list[str]], denied: set[str]) -> tuple[int, str, bytes]:
    actions = [v[0] for k, v in sorted(form.items()) if k.startswith("ActionNames.member.")]
    members = "".join(
        f"<member><EvalActionName>{a}</EvalActionName><EvalResourceName>*</EvalResourceName>"
        f"<EvalDecision>{'implicitDeny' if a in denied else 'allowed'}</EvalDecision>"
        "<MatchedStatements/><MissingContextValues/></member>"
        for a in actions
    )
    doc = (
        '<SimulatePrincipalPolicyResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/">'
        f"<SimulatePrincipalPolicyResult><IsTruncated>false</IsTruncated><EvaluationResults>{members}"
        "</EvaluationResults></SimulatePrincipalPolicyResult>"
        "<ResponseMetadata><RequestId>doctor-test</RequestId></ResponseMetadata></SimulatePrincipalPolicyResponse>"
    )
    return 200, "text/xml", doc.encode()


_AMI: list[str] = []


@pytest.fixture
def fake(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAws]:
    if not _AMI:  # moto's list of images takes most of a second: read it once
        ec2 = boto3.client("ec2", region_name="us-east-1")
        _AMI.append(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])
    state = FakeAws(_AMI[0])
    proxy = RuleProxy(aws_env, state)
    _forget_s3fs()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    state.proxy = proxy  # type: ignore[attr-defined]
    yield state
    _forget_s3fs()
    proxy.close()


def _profile(bucket: str, name: str | None = None) -> str:
    """The instance profile spotnb would create for `bucket` (or `name`), with its role."""
    iam = boto3.client("iam", region_name="us-east-1")
    name = name or f"spotnb-{bucket}"
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
        ],
    }
    iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))
    iam.create_instance_profile(InstanceProfileName=name)
    iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
    return name


def _lines(report: Report) -> dict[str, Any]:
    return dict(report.results)


def _run(store: str, **kw: Any) -> Report:
    report = doctor(
        provider="aws", store=store, region=kw.pop("region", "us-east-1"), timeout=kw.pop("timeout", 8), **kw
    )
    print(report.text())
    return report


def test_every_check_passes(fake: FakeAws, s3_store_url: str) -> None:
    _profile(s3_store_url.split("/")[2])
    report = _run(s3_store_url, instance_type="g4dn.xlarge")
    lines = _lines(report)
    assert [n for n, _ in report.results] == [
        "config",
        "credentials",
        "region",
        "instance type",
        "spot quota",
        "store",
        "identity",
        "image",
        "prices",
    ]
    assert all(r.status == OK for r in lines.values()), report.text()
    assert report.exit_code == 0
    assert (
        "environment variables" in lines["credentials"].detail
        and "123456789012" in lines["credentials"].detail
    )
    assert "4 vCPUs" in lines["instance type"].detail and "T4" in lines["instance type"].detail
    assert "L-3819A6DF" in lines["spot quota"].detail and "needs 4" in lines["spot quota"].detail
    assert "not checked: the bucket policy" in lines["identity"].detail  # says what it cannot see
    assert fake.ami in lines["image"].detail and SSM_PATH in lines["image"].detail
    assert "EC2 spot price history" in lines["prices"].detail
    # the probe object was deleted again, and no secret reached the report
    bucket = s3_store_url.split("/")[2]
    assert boto3.client("s3", region_name="us-east-1").list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    assert "canary" not in report.to_json().lower()


def test_each_aws_check_fails_with_its_fix(fake: FakeAws, s3_store_url: str) -> None:
    """Quota 0, the role denied PutObject, an AMI id that is not there (another region's), a
    read-only bucket: each ✘ with the command that fixes it. EC2's spot price history answering
    garbage: '?' (the provider's own price fetch raises botocore's ResponseParserError, which is
    no BotoCoreError)."""
    bucket = s3_store_url.split("/")[2]
    _profile(bucket)
    fake.quota = 0
    fake.denied = {"s3:PutObject"}
    fake.read_only = bucket
    fake.actions["DescribeSpotPriceHistory"] = (200, "text/xml", b"\x00 not xml")
    report = _run(s3_store_url, instance_type="p5.4xlarge", aws_image_id="ami-0123456789abcdef0")
    lines = _lines(report)
    assert report.exit_code == 1
    quota = lines["spot quota"]
    assert quota.status == FAIL and "L-7212CCBC" in quota.detail and "is 0 vCPUs" in quota.detail
    assert "request-service-quota-increase" in quota.fix and "--desired-value 16" in quota.fix
    identity = lines["identity"]
    assert identity.status == FAIL and "s3:PutObject" in identity.detail
    assert f"put-role-policy --role-name spotnb-{bucket}" in identity.fix
    assert lines["image"].status == FAIL and "ami-0123456789abcdef0" in lines["image"].detail
    store = lines["store"]
    assert store.status == FAIL and "cannot write" in store.detail and "s3:PutObject" in store.fix
    assert lines["prices"].status == UNKNOWN and "ResponseParserError" in lines["prices"].detail


def test_wrong_names_fail_and_their_dependents_are_skipped(fake: FakeAws, s3_store_url: str) -> None:
    """A region that does not exist, an instance type with a typo, a bucket with a typo, an
    instance profile that does not exist."""
    bucket = s3_store_url.split("/")[2]
    typo = bucket[:-1] + ("x" if bucket[-1] != "x" else "y")
    report = _run(f"s3://{typo}/store", region="us-east-9", aws_instance_profile="no-such-profile")
    lines = _lines(report)
    assert lines["region"].status == FAIL and "us-east-9" in lines["region"].detail
    assert "did you mean" in lines["region"].fix and "us-east-1" in lines["region"].fix
    for name in ("instance type", "image", "prices"):
        assert lines[name].status == SKIP and lines[name].detail == "skipped: needs region", name
    assert lines["spot quota"].status == SKIP
    assert lines["store"].status == FAIL and "does not exist" in lines["store"].detail
    assert f"did you mean '{bucket}'" in lines["store"].fix
    assert lines["identity"].status == FAIL and "no-such-profile" in lines["identity"].detail

    report = _run(s3_store_url, instance_type="g4dn.xlarg")
    lines = _lines(report)
    assert lines["instance type"].status == FAIL and "did you mean g4dn.xlarge" in lines["instance type"].fix
    assert lines["spot quota"].detail == "skipped: needs instance type"
    # the default profile does not exist yet: spotnb creates it, and the caller may
    assert lines["identity"].status == OK and "creates it at the first launch" in lines["identity"].detail
    fake.denied = {"iam:PassRole"}
    lines = _lines(_run(s3_store_url))
    assert lines["identity"].status == FAIL and "iam:PassRole denied" in lines["identity"].detail


def test_refused_credentials(fake: FakeAws, s3_store_url: str) -> None:
    fake.expired = True
    report = _run(s3_store_url)
    lines = _lines(report)
    assert lines["credentials"].status == FAIL and "ExpiredToken" in lines["credentials"].detail
    assert "aws sso login" in lines["credentials"].fix
    assert all(lines[n].status == SKIP for n in ("region", "instance type", "store", "identity", "prices"))
    assert report.exit_code == 1


def test_no_credentials(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to find here
    report = _run("s3://some-bucket/jobs")
    lines = _lines(report)
    assert lines["credentials"].status == FAIL and lines["credentials"].detail == "no AWS credentials found"
    assert "aws configure" in lines["credentials"].fix
    assert lines["store"].detail == "skipped: needs credentials"
    assert report.exit_code == 1


@pytest.mark.parametrize(
    "fault",
    [
        (500, "text/html", b"<html><body>500 Internal Server Error</body></html>"),
        (200, "text/xml", b"\x00\xff not xml at all {"),
    ],
    ids=["500", "garbage"],
)
def test_a_cloud_answering_errors_or_garbage(fake: FakeAws, s3_store_url: str, fault: Any) -> None:
    """EC2 broken, everything else fine: EC2's checks say '?' with what came back, the others
    still run; nothing raises."""
    fake.broken["ec2"] = fault
    report = _run(s3_store_url)
    lines = _lines(report)
    assert lines["credentials"].status == OK and lines["store"].status == OK
    assert lines["region"].status == UNKNOWN and "AWS answered" in lines["region"].detail
    assert lines["instance type"].status == SKIP
    assert report.exit_code == 2
    assert "Traceback" not in report.text()


def test_offline_every_check_says_it_could_not_reach_aws(
    aws_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Credentials present, every endpoint a closed port: each line '?', 'could not reach', in
    about a second (no retries, short timeouts)."""
    _forget_s3fs()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    t0 = time.monotonic()
    report = _run("s3://some-bucket/jobs")
    took = time.monotonic() - t0
    print(f"offline doctor took {took:.2f} s")
    lines = _lines(report)
    assert lines["config"].status == OK
    for name, r in report.results[1:]:
        assert r.status == UNKNOWN and "could not reach AWS" in r.detail, (name, r.detail)
    assert report.exit_code == 2


def test_a_hanging_cloud_is_cut_off(fake: FakeAws, s3_store_url: str) -> None:
    fake.broken["*"] = HANG
    t0 = time.monotonic()
    report = _run(s3_store_url, timeout=1.5)
    print(f"hanging doctor took {time.monotonic() - t0:.2f} s")
    lines = _lines(report)
    assert "no answer within 1.5 s" in lines["credentials"].detail
    assert all(r.status == UNKNOWN for _, r in report.results[1:])
    assert report.exit_code == 2


def test_cli_json_and_exit_code(fake: FakeAws, s3_store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from spotnb.cli import main

    _profile(s3_store_url.split("/")[2])
    fake.quota = 0
    code = main(["doctor", "--provider", "aws", "--store", s3_store_url, "--region", "us-east-1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 == out["exit_code"]
    quota = next(c for c in out["checks"] if c["name"] == "spot quota")
    assert (
        quota["status"] == "fail"
        and quota["symbol"] == "✘"
        and "request-service-quota-increase" in quota["fix"]
    )
    code = main(["doctor", "--provider", "aws", "--store", s3_store_url, "--region", "us-east-1"])
    text = capsys.readouterr().out
    assert code == 1 and "✘ spot quota" in text and "fix: aws service-quotas" in text
