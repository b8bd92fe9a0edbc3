"""The behaviours every provider must have, as one abstract test class each provider binds
(fsspec's `tests/abstract` pattern): `ProviderContract` holds the tests, a binding
(`tests/providers/test_contract.py`) subclasses it once per provider and supplies the hooks
below. A new provider gets the whole suite by writing one binding; a behaviour added here is
asked of every provider at once, so the clouds cannot drift apart unnoticed.

What is asked of every provider (the `Provider` interface, `spotnb/providers/base.py`):

- launch: the instance it returns is its own (`provider`, `instance_type`) and, once the
  cloud has booted it, `describe` polls it RUNNING;
- the job id is on what it launched, where the cloud keeps it (a tag, a label; the local
  market: the process's own log folder), so a later controller and `spotnb gc` find it;
- listed: `list_tagged` (Feature.CLEANUP) finds it with its job id, and stops finding it once
  it is terminated;
- a preemption notice: `inject` (Feature.FAULT_INJECTION) makes the platform give the notice
  (what the binding can observe of the notice: the local market serves it to the real notice
  watcher; a faked control plane records the simulate call);
- preempted: an instance the market takes back polls PREEMPTED, not EXITED or TERMINATED
  (the controller relaunches only the former);
- terminate: `terminate` ends it (twice is fine), it polls TERMINATED and the cloud holds it
  no more; `close` ends what the provider launched and did not end;
- unsupported features are declared with a reason (data, not a NotImplementedError at run
  time), and `supports` agrees with the declaration;
- bad input is refused by `validate` with a ConfigError naming the Config field, before
  anything is asked of the cloud;
- a dry run (`plan_launch`) shows the request and asks nothing of the cloud.

A feature the provider declares unsupported skips its behaviour with the declared reason;
the binding's `declared_unsupported` pins which ones that is, so a feature that silently
disappears from a provider fails here.

`CoordinatorContract` does the same for the coordinator of a job on several instances (what
every cloud's must do; tests/providers/test_coordinator_contract.py binds it to AWS, Azure and
GCP, and each cloud's test_coordinator.py keeps what is its own).
"""

from __future__ import annotations

import abc
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from spotnb.errors import ConfigError
from spotnb.providers.base import Feature, Instance, InstanceState, LaunchSpec, Provider
from spotnb.providers.cleanup import JOB_TAG
from spotnb.providers.coordinator import COORDINATOR_ROLE, MAX_COORDINATOR_LAUNCHES, ROLE_TAG

__all__ = ["ProviderContract", "CoordinatorContract", "new_job_id", "wait_state"]


def new_job_id() -> str:
    """A job id of spotnb's shape, unique per test (a binding's cloud may outlive one test)."""
    return f"20261128-000000-{uuid.uuid4().hex[:6]}"


def wait_state(provider: Provider, instance: Instance, state: InstanceState, timeout: float = 30.0) -> str:
    """Poll `describe` until it says `state` (bounded); the last state seen."""
    deadline = time.time() + timeout
    while True:
        seen = provider.describe(instance).state
        if seen == state or time.time() > deadline:
            return seen.value
        time.sleep(0.1)


class ProviderContract(abc.ABC):
    """The provider contract; a binding subclasses it as `Test<Provider>Contract` and
    supplies the hooks. Not collected itself (no `Test` prefix)."""

    #: the provider's registry name (`Provider.name`)
    name: ClassVar[str]
    #: the features the provider declares unsupported (`Provider.unsupported`), pinned
    declared_unsupported: ClassVar[frozenset[Feature]]
    #: (Config overrides, the field its ConfigError must name) the provider refuses; a
    #: `memory://` store is added for every provider (no VM can see the notebook's memory)
    bad_inputs: ClassVar[list[tuple[dict[str, Any], str]]] = []

    # -- hooks a binding supplies ---------------------------------------------------------
    # `cloud`: a fixture every binding defines (its fakes and fixtures), set up before the
    # provider; pytest names it if a binding forgets it.

    @abc.abstractmethod
    def make_provider(self, **overrides: Any) -> Provider:
        """A provider on the binding's cloud, its Config changed by `overrides`, not validated."""

    @abc.abstractmethod
    def spec(self, job_id: str, incarnation: int = 1) -> LaunchSpec:
        """One incarnation's launch spec for this provider."""

    @abc.abstractmethod
    def asked_of_cloud(self) -> list[Any]:
        """Everything asked of the cloud's control plane so far, in order (SDK requests; the
        local market: the processes it started)."""

    @abc.abstractmethod
    def job_id_on(self, instance: Instance) -> str | None:
        """The job id as the cloud keeps it on the launched instance (read from the cloud)."""

    @abc.abstractmethod
    def alive_in_cloud(self, instance: Instance) -> bool:
        """Whether the cloud still holds the instance alive (billed, or about to be)."""

    def bring_up(self, provider: Provider, instance: Instance) -> None:
        """The cloud finishes booting the instance (a no-op where it runs at once)."""

    @abc.abstractmethod
    def take_back(self, provider: Provider, instance: Instance) -> None:
        """The market reclaims the instance, as the platform does after a notice."""

    @abc.abstractmethod
    def notice_seen(self, provider: Provider, instance: Instance) -> bool:
        """After `provider.inject(instance)`: whether the notice was given, as far as the
        binding can observe it."""

    # -- shared fixtures ------------------------------------------------------------------
    @pytest.fixture
    def provider(self, cloud: Any) -> Iterator[Provider]:
        p = self.make_provider()
        p.validate()
        yield p
        p.close()

    def launched(self, provider: Provider, job_id: str | None = None) -> Instance:
        instance = provider.launch(self.spec(job_id or new_job_id()))
        self.bring_up(provider, instance)
        return instance

    def declared(self, provider: Provider, feature: Feature) -> None:
        """Skip the behaviour of a feature the provider declares unsupported, with its reason."""
        if not provider.supports(feature):
            reason = provider.unsupported.get(feature, "")
            assert feature in self.declared_unsupported, f"{feature.name} is unsupported but not pinned"
            pytest.skip(f"{self.name}: {feature.name} declared unsupported: {reason}")

    # -- the behaviours -------------------------------------------------------------------
    def test_launch_then_polled_running(self, provider: Provider) -> None:
        job = new_job_id()
        instance = self.launched(provider, job)
        assert instance.provider == self.name
        assert instance.instance_type == self.spec(job).instance_type
        assert wait_state(provider, instance, InstanceState.RUNNING) == "running"
        provider.terminate(instance)

    def test_the_job_id_is_on_what_it_launched(self, provider: Provider) -> None:
        job = new_job_id()
        instance = self.launched(provider, job)
        assert (self.job_id_on(instance) or "").lower() == job.lower()
        provider.terminate(instance)

    def test_listed_by_its_job_tag_until_terminated(self, provider: Provider) -> None:
        self.declared(provider, Feature.CLEANUP)
        job = new_job_id()
        instance = self.launched(provider, job)
        listed = {i.id: tagged for i, tagged in provider.list_tagged()}  # type: ignore[attr-defined]
        assert listed.get(instance.id, "").lower() == job.lower()
        provider.terminate(instance)
        assert instance.id not in {i.id for i, _ in provider.list_tagged()}  # type: ignore[attr-defined]

    def test_an_injected_preemption_gives_a_notice(self, provider: Provider) -> None:
        self.declared(provider, Feature.FAULT_INJECTION)
        instance = self.launched(provider)
        provider.inject(instance)  # type: ignore[attr-defined]
        assert self.notice_seen(provider, instance)
        provider.terminate(instance)

    def test_a_reclaimed_instance_polls_preempted(self, provider: Provider) -> None:
        instance = self.launched(provider)
        assert wait_state(provider, instance, InstanceState.RUNNING) == "running"
        self.take_back(provider, instance)
        assert wait_state(provider, instance, InstanceState.PREEMPTED) == "preempted"
        provider.terminate(instance)  # ending a reclaimed instance is fine too

    def test_terminate_then_gone(self, provider: Provider) -> None:
        instance = self.launched(provider)
        assert self.alive_in_cloud(instance)
        provider.terminate(instance)
        provider.terminate(instance)  # idempotent
        assert wait_state(provider, instance, InstanceState.TERMINATED) == "terminated"
        assert not self.alive_in_cloud(instance)

    def test_close_ends_what_it_launched(self, cloud: Any) -> None:
        provider = self.make_provider()
        provider.validate()
        instance = self.launched(provider)
        provider.close()
        assert not self.alive_in_cloud(instance)

    def test_unsupported_features_are_declared_with_reasons(self, provider: Provider) -> None:
        declared = type(provider).unsupported
        assert frozenset(declared) == self.declared_unsupported
        for feature, reason in declared.items():
            assert isinstance(feature, Feature)
            assert isinstance(reason, str) and len(reason.split()) >= 3, (feature, reason)
            assert not provider.supports(feature)
        for feature in set(Feature) - set(declared):
            if feature == Feature.ELASTIC:  # supported exactly when the provider has a coordinator
                assert provider.supports(feature) == (type(provider).coordinator is not Provider.coordinator)
            else:
                assert provider.supports(feature), feature

    def test_bad_input_is_refused_before_any_launch_naming_the_field(self, cloud: Any) -> None:
        for overrides, field in [({"store": "memory://spotnb"}, "store"), *self.bad_inputs]:
            before = list(self.asked_of_cloud())
            with pytest.raises(ConfigError, match=rf"\bConfig\.{re.escape(field)}\b"):
                self.make_provider(**overrides).validate()
            assert self.asked_of_cloud() == before, overrides

    def test_a_dry_run_asks_nothing_of_the_cloud(self, provider: Provider) -> None:
        before = list(self.asked_of_cloud())
        plan = provider.plan_launch(self.spec(new_job_id()))
        assert isinstance(plan, dict) and plan
        assert self.asked_of_cloud() == before


class CoordinatorContract(abc.ABC):
    """The coordinator contract (`Provider.coordinator`, Feature.ELASTIC): what every cloud's
    coordinator of a job on several instances must do, whatever it is built of (AWS: a network
    interface and a security group; Azure: a NIC with a static IP and its security groups; GCP:
    a reserved address and firewall rules). A binding subclasses it as
    `Test<Cloud>CoordinatorContract`; the cloud-specific checks (request bodies, the order of
    deletes, the other ways a coordinator dies) stay in each cloud's test_coordinator.py.

    - a provider with a coordinator supports several instances;
    - a second controller finds the job's coordinator instead of starting another, and creates
      none of its network again;
    - the coordinator carries the job id and the coordinator role, where the cloud keeps tags;
    - one that died is replaced at the address the replicas already know;
    - one that never stays up ends the job after `MAX_COORDINATOR_LAUNCHES` starts, leaving no
      coordinator behind;
    - `close` ends the coordinator and deletes its network;
    - a job on several instances is refused across regions, or on "cheapest", naming the field
      (and accepted across the zones of one region);
    - a dry run lists the coordinator, on demand, with its price.
    """

    #: the cloud's default coordinator type, and the $/h on demand a dry run shows for it
    default_type: ClassVar[str]
    expected_price: ClassVar[float]
    #: two candidates in different regions (one job's network cannot span them), and
    #: candidates within one region (it can)
    two_regions: ClassVar[list[str]]
    one_region: ClassVar[list[str]]

    # -- hooks a binding supplies ---------------------------------------------------------
    # `cloud`: a fixture every binding defines (its fakes and fixtures).

    @abc.abstractmethod
    def make_provider(self, **overrides: Any) -> Provider:
        """A provider for a job on 3 instances (2 at least), describing at every call, not validated."""

    @abc.abstractmethod
    def spec(self, job_id: str) -> LaunchSpec: ...

    @abc.abstractmethod
    def coordinators(self, job_id: str) -> list[str]:
        """The job's coordinator VMs the cloud holds alive (ids or names)."""

    @abc.abstractmethod
    def coordinator_tags(self, job_id: str, name: str) -> dict[str, str]:
        """The tags (labels) the cloud keeps on the coordinator `name`."""

    @abc.abstractmethod
    def network(self, job_id: str) -> list[str]:
        """What of the job's network (addresses, interfaces, groups, rules) the cloud holds."""

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """The platform deletes (terminates) the coordinator `name`."""

    @abc.abstractmethod
    def power_off(self, name: str) -> None:
        """The coordinator `name` powers itself off (its boot script failed)."""

    # -- the behaviours -------------------------------------------------------------------
    @pytest.fixture
    def job(self) -> str:
        return new_job_id()

    def provider_for(self, **overrides: Any) -> Provider:
        p = self.make_provider(**overrides)
        p.validate()
        p.describe_interval = 0.0  # type: ignore[misc]  # describe at every call
        return p

    def test_supports_several_instances(self, cloud: Any) -> None:
        assert self.provider_for().supports(Feature.ELASTIC)

    def test_a_second_controller_finds_the_same_coordinator(self, cloud: Any, job: str) -> None:
        first = self.provider_for().coordinator(job, 2)
        network = self.network(job)
        assert network
        assert self.provider_for().coordinator(job, 2) == first
        assert len(self.coordinators(job)) == 1
        assert sorted(self.network(job)) == sorted(network)

    def test_the_coordinator_carries_the_job_and_its_role(self, cloud: Any, job: str) -> None:
        self.provider_for().coordinator(job, 2)
        (name,) = self.coordinators(job)
        tags = self.coordinator_tags(job, name)
        assert tags[JOB_TAG].lower() == job.lower() and tags[ROLE_TAG] == COORDINATOR_ROLE

    def test_a_dead_coordinator_is_replaced_at_the_same_address(self, cloud: Any, job: str) -> None:
        p = self.provider_for()
        address = p.coordinator(job, 2)
        (dead,) = self.coordinators(job)
        self.delete(dead)
        assert p.coordinator(job, 2) == address
        (replacement,) = self.coordinators(job)
        assert replacement != dead

    def test_a_coordinator_that_never_stays_up_ends_the_job(self, cloud: Any, job: str) -> None:
        p = self.provider_for()
        for _ in range(MAX_COORDINATOR_LAUNCHES):
            p.coordinator(job, 2)
            for name in self.coordinators(job):
                self.power_off(name)
        with pytest.raises(
            RuntimeError, match=f"started {MAX_COORDINATOR_LAUNCHES} times and did not stay up"
        ):
            p.coordinator(job, 2)
        assert self.coordinators(job) == []

    def test_close_ends_the_coordinator_and_deletes_its_network(self, cloud: Any, job: str) -> None:
        p = self.provider_for()
        p.coordinator(job, 2)
        assert self.coordinators(job) and self.network(job)
        p.close()
        assert self.coordinators(job) == []
        assert self.network(job) == []

    def test_several_instances_need_one_region(self, cloud: Any) -> None:
        for regions in (self.two_regions, "cheapest"):
            with pytest.raises(ConfigError, match=r"\bConfig\.regions\b"):
                self.make_provider(region=None, regions=regions).validate()
        self.make_provider(region=None, regions=self.one_region).validate()

    def test_a_dry_run_lists_the_coordinator_on_demand_with_its_price(self, cloud: Any, job: str) -> None:
        plan = self.provider_for().plan_launch(self.spec(job))
        coordinator = plan["coordinator"]
        assert coordinator["market"] == "on-demand" and coordinator["instance_type"] == self.default_type
        assert coordinator["price_on_demand"] == pytest.approx(self.expected_price)
        assert self.coordinators(job) == []
