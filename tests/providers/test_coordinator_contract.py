"""The coordinator contract (`tests/providers/contract.py`, `CoordinatorContract`) bound to
each cloud with a coordinator: AWS, Azure and GCP. What is real and what is stood in is as in
the provider contract (`test_contract.py`): only a cloud's compute control plane, always below
its own SDK. (The local market's coordinator is a real torchft lighthouse process: its jobs on
several instances run in tests/runtime/group, marked `elastic`.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest

import spotnb as spot
from spotnb.providers.aws import coordinator as aws_coordinator
from spotnb.providers.aws.provider import AWSProvider
from spotnb.providers.azure import coordinator as azure_coordinator
from spotnb.providers.azure.provider import AzureProvider
from spotnb.providers.base import LaunchSpec, Provider
from spotnb.providers.cleanup import JOB_TAG
from spotnb.providers.coordinator import COORDINATOR_ROLE, ROLE_TAG
from spotnb.providers.gcp import coordinator as gcp_coordinator
from spotnb.providers.gcp.provider import GCPProvider
from tests.providers.contract import CoordinatorContract
from tests.support.azure_transport import ArmCompute, compute_client, resource_client
from tests.support.clouds_fixtures import *  # noqa: F401,F403 - fixtures
from tests.support.gce_fake import FakeCompute
from tests.support.jobs import agent_command


class _Made:
    """The providers a test made, closed when it ends (a coordinator left running would leak
    into the next test's cloud)."""

    made: list[Provider]

    def track(self, provider: Provider) -> Provider:
        self.made.append(provider)
        return provider

    def close_all(self) -> None:
        for p in self.made:
            p.close()


# -- AWS -----------------------------------------------------------------------------------------
class TestAWSCoordinatorContract(_Made, CoordinatorContract):
    """AWS: the real AWSProvider on real boto3 clients over HTTP to moto_server (EC2, IAM, the
    S3 store). Nothing is stood in: moto keeps the instances, the coordinator's network
    interface and the job's security group; a coordinator that powers off is terminated
    (InstanceInitiatedShutdownBehavior=terminate)."""

    default_type = aws_coordinator.COORDINATOR_TYPE
    expected_price = aws_coordinator.COORDINATOR_PRICES[aws_coordinator.COORDINATOR_TYPE]
    two_regions = ["us-east-1b", "eu-west-1a"]
    one_region = ["us-east-1a", "us-east-1c"]

    @pytest.fixture
    def cloud(self, s3_store_url: str) -> Iterator[Any]:
        self.store, self.made = s3_store_url, []
        self.ec2 = boto3.client("ec2", region_name="us-east-1")
        self.image = self.ec2.describe_images()["Images"][0]["ImageId"]
        yield self.ec2
        self.close_all()

    def make_provider(self, **overrides: Any) -> Provider:
        fields = dict(
            provider="aws",
            store=self.store,
            region="us-east-1b",
            instances=3,
            min_instances=2,
            aws_image_id=self.image,
        )
        return self.track(AWSProvider(spot.Config(**{**fields, **overrides})))

    def spec(self, job_id: str) -> LaunchSpec:
        return LaunchSpec(
            job_id=job_id,
            incarnation=1,
            store_url=self.store,
            instance_type="g4dn.xlarge",
            region="us-east-1b",
            command=agent_command(self.store, job_id),
            spotnb_version="0.1.0",
        )

    def _instances(self, job_id: str) -> list[dict[str, Any]]:
        filters = [
            {"Name": f"tag:{JOB_TAG}", "Values": [job_id.lower()]},
            {"Name": f"tag:{ROLE_TAG}", "Values": [COORDINATOR_ROLE]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
        ]
        found = self.ec2.describe_instances(Filters=filters)["Reservations"]
        return [i for r in found for i in r["Instances"]]

    def coordinators(self, job_id: str) -> list[str]:
        return [str(i["InstanceId"]) for i in self._instances(job_id)]

    def coordinator_tags(self, job_id: str, name: str) -> dict[str, str]:
        (data,) = [i for i in self._instances(job_id) if i["InstanceId"] == name]
        return {t["Key"]: t["Value"] for t in data.get("Tags", [])}

    def network(self, job_id: str) -> list[str]:
        name = aws_coordinator.job_group_name(job_id)
        groups = self.ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [name]}])
        interfaces = self.ec2.describe_network_interfaces(
            Filters=[{"Name": f"tag:{JOB_TAG}", "Values": [job_id.lower()]}]
        )
        return [g["GroupId"] for g in groups["SecurityGroups"]] + [
            i["NetworkInterfaceId"] for i in interfaces["NetworkInterfaces"]
        ]

    def delete(self, name: str) -> None:
        self.ec2.terminate_instances(InstanceIds=[name])

    def power_off(self, name: str) -> None:
        self.ec2.terminate_instances(InstanceIds=[name])


# -- Azure ---------------------------------------------------------------------------------------
SUB = "00000000-0000-0000-0000-000000000000"
RG = "spotnb-rg"
SUBNET = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/virtualNetworks/v/subnets/s"
IDENTITY = (
    f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.ManagedIdentity/"
    "userAssignedIdentities/spotnb"
)


class TestAzureCoordinatorContract(_Made, CoordinatorContract):
    """Azure: the real AzureProvider on the real ComputeManagementClient and
    ResourceManagementClient, whose pipeline ends in ArmTransport, answered in-process by
    `ArmCompute` (VMs, their power state) over its `GenericResources` (the job's NIC, public IP
    and security groups, by id): Azure Resource Manager is the one thing stood in."""

    default_type = azure_coordinator.COORDINATOR_SIZE
    expected_price = azure_coordinator.COORDINATOR_PRICES[azure_coordinator.COORDINATOR_SIZE]
    two_regions = ["eastus", "westus2"]
    one_region = ["eastus"]

    @pytest.fixture
    def cloud(self) -> Iterator[Any]:
        self.arm, self.made = ArmCompute(), []
        yield self.arm
        self.close_all()

    def make_provider(self, **overrides: Any) -> Provider:
        fields = dict(
            provider="azure",
            store="az://spotnb/jobs",
            region="eastus",
            instance_type="Standard_NC4as_T4_v3",
            instances=3,
            min_instances=2,
            azure_subscription_id=SUB,
            azure_resource_group=RG,
            azure_subnet_id=SUBNET,
            azure_identity_id=IDENTITY,
            azure_storage_account="spotnbstore",
        )
        provider = AzureProvider(
            spot.Config(**{**fields, **overrides}),
            compute=compute_client(self.arm, SUB),
            resources=resource_client(self.arm, SUB),
        )
        return self.track(provider)

    def spec(self, job_id: str) -> LaunchSpec:
        return LaunchSpec(
            job_id=job_id,
            incarnation=1,
            store_url="az://spotnb/jobs",
            instance_type="Standard_NC4as_T4_v3",
            region="eastus",
            command=agent_command("az://spotnb/jobs", job_id),
            spotnb_version="0.1.0",
        )

    def coordinators(self, job_id: str) -> list[str]:
        return [
            name
            for name, vm in self.arm.vms.items()
            if (vm.get("tags") or {}).get(ROLE_TAG) == COORDINATOR_ROLE
            and (vm.get("tags") or {}).get(JOB_TAG) == job_id.lower()
        ]

    def coordinator_tags(self, job_id: str, name: str) -> dict[str, str]:
        return dict(self.arm.vms[name].get("tags") or {})

    def network(self, job_id: str) -> list[str]:
        held = {rid.lower() for rid in self.arm.generic.store}
        ids = azure_coordinator.job_network_ids(SUB, RG, job_id).values()
        return [rid for rid in ids if rid.lower() in held]

    def delete(self, name: str) -> None:
        self.arm.vms.pop(name)

    def power_off(self, name: str) -> None:
        self.arm.power[name] = "stopped"


# -- GCP -----------------------------------------------------------------------------------------
PROJECT = "spotnb-test"
ZONE = "us-central1-a"


class TestGCPCoordinatorContract(_Made, CoordinatorContract):
    """GCP: the real GCPProvider on real google-cloud-compute REST clients (instances,
    addresses, firewalls), whose HTTP session is mounted on FakeCompute (tests/support/gce_fake.py),
    answering as Compute Engine does: its control plane is the one thing stood in. A new VM
    is RUNNING at once."""

    default_type = gcp_coordinator.COORDINATOR_MACHINE
    expected_price = gcp_coordinator.COORDINATOR_PRICES[gcp_coordinator.COORDINATOR_MACHINE]
    two_regions = ["us-central1-a", "europe-west4-b"]
    one_region = ["us-central1-a", "us-central1-b"]

    @pytest.fixture
    def cloud(self) -> Iterator[Any]:
        self.gce, self.made = FakeCompute(PROJECT, "us-central1"), []
        self.gce.status_on_insert = lambda body: "RUNNING"
        yield self.gce
        self.close_all()

    def make_provider(self, **overrides: Any) -> Provider:
        fields = dict(
            provider="gcp",
            store="gs://spotnb/jobs",
            region=ZONE,
            instance_type="g2-standard-4",
            instances=3,
            min_instances=2,
            gcp_project=PROJECT,
        )
        return self.track(GCPProvider(spot.Config(**{**fields, **overrides}), **self.gce.clients()))

    def spec(self, job_id: str) -> LaunchSpec:
        return LaunchSpec(
            job_id=job_id,
            incarnation=1,
            store_url="gs://spotnb/jobs",
            instance_type="g2-standard-4",
            region=ZONE,
            command=agent_command("gs://spotnb/jobs", job_id),
            spotnb_version="0.1.0",
        )

    def _vms(self, job_id: str) -> dict[str, dict[str, Any]]:
        return {
            name: vm
            for (_, name), vm in self.gce.instances.items()
            if (vm.get("labels") or {}).get(ROLE_TAG) == COORDINATOR_ROLE
            and (vm.get("labels") or {}).get(JOB_TAG) == job_id.lower()
        }

    def coordinators(self, job_id: str) -> list[str]:
        return list(self._vms(job_id))

    def coordinator_tags(self, job_id: str, name: str) -> dict[str, str]:
        return dict(self._vms(job_id)[name].get("labels") or {})

    def network(self, job_id: str) -> list[str]:
        address = gcp_coordinator.address_name(job_id)
        rules = gcp_coordinator.firewall_names(job_id)
        return [n for n in self.gce.addresses if n == address] + [n for n in self.gce.firewalls if n in rules]

    def delete(self, name: str) -> None:
        self.gce.vanish(ZONE, name)

    def power_off(self, name: str) -> None:
        self.gce.power_off(ZONE, name)
