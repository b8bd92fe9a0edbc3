"""The provider contract (`tests/providers/contract.py`) bound to every provider: the local
market, AWS, Azure and GCP. Each binding's docstring says what is real and what is stood in;
only a cloud's compute control plane ever is (no emulator of EC2's spot interruptions, of Azure
Resource Manager or of Compute Engine exists), and always below the cloud's own SDK."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

import boto3
import pytest

import spotnb as spot
from spotnb.providers.aws.provider import AWSProvider
from spotnb.providers.azure.provider import AzureProvider
from spotnb.providers.base import Feature, Instance, LaunchSpec, Provider
from spotnb.providers.cleanup import JOB_TAG
from spotnb.providers.gcp.provider import GCPProvider
from spotnb.providers.local.provider import LocalProvider
from spotnb.runtime.notice import make_watcher
from tests.providers.contract import ProviderContract
from tests.support.azure_transport import ArmCompute, ArmRequest, compute_client, resource_client
from tests.support.clouds_fixtures import *  # noqa: F401,F403 - fixtures
from tests.support.clouds_fixtures import FaultProxy
from tests.support.gce_fake import FakeCompute
from tests.support.jobs import agent_command


# -- the local market ----------------------------------------------------------------------------
def _process_state(pid: int) -> str | None:
    """The kernel's state letter of `pid` (None: no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


class TestLocalContract(ProviderContract):
    """The local spot market, all real: each instance is a real process of this machine (a
    sleeper standing in for the agent), its notice is served by the market's metadata emulator
    and read by spotnb's own notice watcher, its preemption is a real SIGKILL. Nothing is
    mocked. "The cloud" here is the processes the market started; what it launched is read
    from /proc (Linux)."""

    name = "local"
    declared_unsupported = frozenset({Feature.MEMORY_STORE, Feature.MULTI_REGION, Feature.CLEANUP})
    bad_inputs: ClassVar[list[tuple[dict[str, Any], str]]] = [
        ({"local_schedule": [{"after": 1.0, "instance": 3}]}, "local_schedule"),
    ]

    @pytest.fixture
    def cloud(self, tmp_path: Path) -> Any:
        self.store = str(tmp_path / "store")
        self.providers: list[LocalProvider] = []
        yield self.providers
        for p in self.providers:
            p.close()

    def make_provider(self, **overrides: Any) -> Provider:
        fields = {"provider": "local", "store": self.store, "local_alloc_delay": 0}
        config = spot.Config(**{**fields, **overrides})
        provider = LocalProvider(config)
        self.providers.append(provider)
        return provider

    def spec(self, job_id: str, incarnation: int = 1) -> LaunchSpec:
        return LaunchSpec(
            job_id=job_id,
            incarnation=incarnation,
            store_url=self.store,
            instance_type="g4dn.xlarge",
            region=None,
            command=["python", "-c", "import time; time.sleep(300)"],
        )

    def asked_of_cloud(self) -> list[Any]:
        return [pid for p in self.providers for pid in p._procs]

    def job_id_on(self, instance: Instance) -> str | None:
        """The job's log folder in the process's own environment (SPOTNB_INSTANCE_LOG)."""
        environ = Path(f"/proc/{instance.info['pid']}/environ").read_bytes().split(b"\0")
        log = next(e for e in environ if e.startswith(b"SPOTNB_INSTANCE_LOG="))
        return Path(log.split(b"=", 1)[1].decode()).parent.name

    def alive_in_cloud(self, instance: Instance) -> bool:
        return _process_state(int(instance.info["pid"])) not in (None, "Z")

    def take_back(self, provider: Provider, instance: Instance) -> None:
        provider.inject(instance, grace=0.0)  # type: ignore[attr-defined]

    def notice_seen(self, provider: Provider, instance: Instance) -> bool:
        assert isinstance(provider, LocalProvider) and provider.emulator is not None
        watcher = make_watcher(
            provider.notice_settings()["format"], base_url=provider.emulator.base_url(instance.id)
        )
        deadline = time.time() + 10.0
        while time.time() < deadline:
            if watcher.check() is not None:
                return True
            time.sleep(0.1)
        return False


# -- AWS -----------------------------------------------------------------------------------------
def _spot_interrupted(instance_id: str, instance_type: str) -> bytes:
    """EC2's DescribeInstances answer for a spot instance the market took back."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        f"<requestId>{uuid.uuid4()}</requestId><reservationSet><item>"
        "<reservationId>r-0123456789abcdef0</reservationId><ownerId>123456789012</ownerId>"
        f"<groupSet/><instancesSet><item><instanceId>{instance_id}</instanceId>"
        f"<instanceType>{instance_type}</instanceType>"
        "<instanceState><code>48</code><name>terminated</name></instanceState>"
        "<stateReason><code>Server.SpotInstanceTermination</code>"
        "<message>Server.SpotInstanceTermination: Spot instance termination</message></stateReason>"
        "</item></instancesSet></item></reservationSet></DescribeInstancesResponse>"
    ).encode()


class TestAWSContract(ProviderContract):
    """AWS: the real AWSProvider on real boto3 clients, over HTTP to moto_server (EC2, IAM and
    the S3 store), through the loopback FaultProxy of tests/support/clouds_fixtures.py. What
    the cloud was asked is every request boto3 sent (botocore's `before-send` event of the
    provider's session). One answer of EC2's control plane is stood in, because moto cannot give
    it: after the instance is really terminated in moto, the proxy answers DescribeInstances
    with a spot interruption's state reason (Server.SpotInstanceTermination)."""

    name = "aws"
    declared_unsupported = frozenset({Feature.NOTICE_ACK, Feature.FAULT_INJECTION})
    bad_inputs: ClassVar[list[tuple[dict[str, Any], str]]] = [
        ({"region": None, "regions": ["mars-1"]}, "regions"),
        ({"instances": 2, "region": None, "regions": ["us-east-1", "eu-west-1"]}, "regions"),
    ]

    @pytest.fixture
    def cloud(self, ec2_faults: FaultProxy, s3_store_url: str) -> Any:
        self.proxy, self.store = ec2_faults, s3_store_url
        self.sent: list[tuple[str, str]] = []
        self.session = boto3.session.Session()

        def record(request: Any, **_: Any) -> None:
            self.sent.append((request.method, request.url))

        self.session.events.register("before-send", record)
        self.ec2 = boto3.client("ec2", region_name="us-east-1")
        self.image = self.ec2.describe_images()["Images"][0]["ImageId"]
        return ec2_faults

    def make_provider(self, **overrides: Any) -> Provider:
        fields = {"provider": "aws", "store": self.store, "region": "us-east-1b", "aws_image_id": self.image}
        return AWSProvider(spot.Config(**{**fields, **overrides}), session=self.session)

    def spec(self, job_id: str, incarnation: int = 1) -> LaunchSpec:
        return LaunchSpec(
            job_id=job_id,
            incarnation=incarnation,
            store_url=self.store,
            instance_type="g4dn.xlarge",
            region="us-east-1b",
            command=agent_command(self.store, job_id, incarnation),
            spotnb_version="0.1.0",
        )

    def asked_of_cloud(self) -> list[Any]:
        return list(self.sent)

    def _data(self, instance: Instance) -> dict[str, Any]:
        return dict(self.ec2.describe_instances(InstanceIds=[instance.id])["Reservations"][0]["Instances"][0])

    def job_id_on(self, instance: Instance) -> str | None:
        return {t["Key"]: t["Value"] for t in self._data(instance).get("Tags", [])}.get(JOB_TAG)

    def alive_in_cloud(self, instance: Instance) -> bool:
        return self._data(instance)["State"]["Name"] in ("pending", "running", "stopping", "stopped")

    def take_back(self, provider: Provider, instance: Instance) -> None:
        self.ec2.terminate_instances(InstanceIds=[instance.id])  # the market's doing, not the provider's
        body = _spot_interrupted(instance.id, instance.instance_type)
        self.proxy.answer_raw("DescribeInstances", instance.info["aws_region"], 200, body)

    def notice_seen(self, provider: Provider, instance: Instance) -> bool:
        raise AssertionError("AWS declares FAULT_INJECTION unsupported")


# -- Azure ---------------------------------------------------------------------------------------
SUB = "00000000-0000-0000-0000-000000000000"
RG = "spotnb-rg"
SUBNET = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/virtualNetworks/v/subnets/s"
IDENTITY = (
    f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.ManagedIdentity/"
    "userAssignedIdentities/spotnb"
)


class TestAzureContract(ProviderContract):
    """Azure: the real AzureProvider on the real `ComputeManagementClient` and
    `ResourceManagementClient` (their serialisation, pollers and error mapping), whose pipeline
    transport is tests/support/azure_transport.py's ArmTransport, answered in-process by its
    `ArmCompute` (the compute half of tests/support/arm_fake.py's FakeArm): Azure Resource
    Manager's compute control plane is the one thing stood in. What the cloud was asked is
    every request the SDK serialised; an eviction is the VM deleted by the platform (eviction
    policy Delete)."""

    name = "azure"
    declared_unsupported = frozenset({Feature.REBALANCE_HINT})
    bad_inputs: ClassVar[list[tuple[dict[str, Any], str]]] = [
        ({"azure_identity_id": None}, "azure_identity_id"),
        ({"azure_image": "not-an-image"}, "azure_image"),
    ]

    @pytest.fixture
    def cloud(self) -> Any:
        self.arm = ArmCompute()
        self.sent: list[ArmRequest] = []
        return self.arm

    def _answer(self, request: ArmRequest) -> tuple[Any, ...]:
        self.sent.append(request)
        return self.arm(request)

    def make_provider(self, **overrides: Any) -> Provider:
        fields = dict(
            provider="azure",
            store="az://spotnb/jobs",
            region="eastus",
            instance_type="Standard_NC4as_T4_v3",
            azure_subscription_id=SUB,
            azure_resource_group=RG,
            azure_subnet_id=SUBNET,
            azure_identity_id=IDENTITY,
            azure_storage_account="spotnbstore",
        )
        return AzureProvider(
            spot.Config(**{**fields, **overrides}),
            compute=compute_client(self._answer, SUB),
            resources=resource_client(self._answer, SUB),
        )

    def spec(self, job_id: str, incarnation: int = 1) -> LaunchSpec:
        return LaunchSpec(
            job_id=job_id,
            incarnation=incarnation,
            store_url="az://spotnb/jobs",
            instance_type="Standard_NC4as_T4_v3",
            region="eastus",
            command=agent_command("az://spotnb/jobs", job_id, incarnation),
            spotnb_version="0.1.0",
        )

    def asked_of_cloud(self) -> list[Any]:
        return [(r.method, r.path) for r in self.sent]

    def job_id_on(self, instance: Instance) -> str | None:
        return dict(self.arm.vms[instance.id].get("tags") or {}).get(JOB_TAG)

    def alive_in_cloud(self, instance: Instance) -> bool:
        return instance.id in self.arm.vms

    def take_back(self, provider: Provider, instance: Instance) -> None:
        del self.arm.vms[instance.id]

    def notice_seen(self, provider: Provider, instance: Instance) -> bool:
        last = self.sent[-1]
        return last.method == "POST" and last.path.endswith(f"/{instance.id}/simulateEviction")


# -- GCP -----------------------------------------------------------------------------------------
PROJECT = "spotnb-test"


class TestGCPContract(ProviderContract):
    """GCP: the real GCPProvider on real google-cloud-compute REST clients (`InstancesClient`,
    `ZonesClient`, ...), whose HTTP session is mounted on tests/support/gce_fake.py's FakeCompute,
    answering in-process as Compute Engine does (operations, error documents, labels): its
    control plane is the one thing stood in. What the cloud was asked is every request the
    clients sent; a preemption is the VM deleted by the platform (termination action DELETE)."""

    name = "gcp"
    declared_unsupported = frozenset({Feature.NOTICE_ACK, Feature.REBALANCE_HINT})
    bad_inputs: ClassVar[list[tuple[dict[str, Any], str]]] = [
        ({"region": "mars"}, "region"),
        ({"gcp_project": None}, "gcp_project"),
    ]

    @pytest.fixture
    def cloud(self, monkeypatch: pytest.MonkeyPatch) -> Any:
        for name in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
            monkeypatch.delenv(name, raising=False)
        self.gce = FakeCompute(PROJECT, "us-central1")
        return self.gce

    def make_provider(self, **overrides: Any) -> Provider:
        fields = dict(
            provider="gcp",
            store="gs://spotnb/jobs",
            region="us-central1-a",
            instance_type="g2-standard-4",
            gcp_project=PROJECT,
            gcp_service_account="spotnb@spotnb-test.iam.gserviceaccount.com",
        )
        return GCPProvider(spot.Config(**{**fields, **overrides}), **self.gce.clients())

    def spec(self, job_id: str, incarnation: int = 1) -> LaunchSpec:
        return LaunchSpec(
            job_id=job_id,
            incarnation=incarnation,
            store_url="gs://spotnb/jobs",
            instance_type="g2-standard-4",
            region="us-central1-a",
            command=agent_command("gs://spotnb/jobs", job_id, incarnation),
            spotnb_version="0.1.0",
        )

    def asked_of_cloud(self) -> list[Any]:
        return [(r.method, r.path) for r in self.gce.adapter.requests]

    def _vm(self, instance: Instance) -> dict[str, Any] | None:
        return self.gce.instances.get((str(instance.region), instance.id))

    def job_id_on(self, instance: Instance) -> str | None:
        vm = self._vm(instance)
        return dict((vm or {}).get("labels") or {}).get(JOB_TAG)

    def alive_in_cloud(self, instance: Instance) -> bool:
        vm = self._vm(instance)
        return vm is not None and vm["status"] != "TERMINATED"

    def bring_up(self, provider: Provider, instance: Instance) -> None:
        self.gce.boot(str(instance.region), instance.id)

    def take_back(self, provider: Provider, instance: Instance) -> None:
        self.gce.vanish(str(instance.region), instance.id)

    def notice_seen(self, provider: Provider, instance: Instance) -> bool:
        return self.gce.maintenance == [instance.id]
