"""The Provider contract: a small, concrete public surface over a handful of backend hooks.

Public methods (`launch`, `describe`, `terminate`, `prices`) do validation and bookkeeping;
a backend implements `_launch`, `_describe`, `_terminate`, `_prices` (submitit's Executor
shape). Capabilities are data: `unsupported` maps a Feature to the reason, checked before
launch (SkyPilot's pattern). Core code never names a concrete provider.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from spotnb.core.billing import CLOUD_BILLING, CONTINUOUS, Billing
from spotnb.errors import CapacityError, ConfigError
from spotnb.market.prices import Price
from spotnb.settings.base import NOTICE_GRACE

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = [
    "Provider",
    "Feature",
    "LaunchSpec",
    "Instance",
    "InstanceState",
    "InstanceStatus",
    "Price",
    "CapacityError",
]


class Feature(str, Enum):
    NOTICE = "preemption notice before the kill"
    NOTICE_ACK = "acknowledging a notice to end the grace period early"
    REBALANCE_HINT = "early rebalance recommendation"
    FAULT_INJECTION = "injecting a preemption on demand"
    GPU = "GPU instances"
    MULTI_REGION = "launching across several regions"
    REMOTE_STORE = "a store other than the local filesystem"
    MEMORY_STORE = "a memory:// store (visible to one process only)"
    CLEANUP = "finding and ending instances a dead controller left behind (spotnb gc)"
    ELASTIC = "several instances training together (a coordinator that outlives any one instance)"


class InstanceState(str, Enum):
    PENDING = "pending"  # asked for, not running yet
    RUNNING = "running"
    EXITED = "exited"  # the agent ended on its own (see exit_code)
    PREEMPTED = "preempted"  # the market took it back
    TERMINATED = "terminated"  # we terminated it
    UNKNOWN = "unknown"


@dataclass
class LaunchSpec:
    """What one incarnation needs. Holds no cloud credential: the instance reaches the store with
    its own identity (instance profile / managed identity / service account, or the local
    user's). It does carry the job's HMAC key (`job_key`, hidden from repr), which the instance
    needs to verify the job it runs; `Provider.launch` fills it in from the notebook machine's
    key file (without one the instance refuses the job), and the dry run (no key yet) shows a
    placeholder."""

    job_id: str
    incarnation: int
    store_url: str
    instance_type: str
    region: str | None
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    requirements: list[str] = field(default_factory=list)
    spotnb_version: str = ""
    slot: int = 0  # which of the job's `instances` this launch fills (0 for one-instance jobs)
    job_key: str | None = field(default=None, repr=False)  # hex; never logged, never in an event
    #: the wheel of the notebook's spotnb the VM installs (`spotnb.providers.shipping.CodeRef`), filled in
    #: by `launch`/`plan_launch` for a provider that `ships_code`; None: pip-install by spec
    code: Any = None


@dataclass
class Instance:
    id: str
    provider: str
    region: str | None
    instance_type: str
    launched_at: float
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class InstanceStatus:
    state: InstanceState
    exit_code: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)


class Provider(ABC):
    """Launches, watches and ends spot instances for one job."""

    name: ClassVar[str] = "provider"
    unsupported: ClassVar[dict[Feature, str]] = {}
    describe_interval: ClassVar[float] = 10.0  # seconds between describe calls (API quotas)
    # seconds between looks at the prices for a voluntary move (Config.migrate="best-price"):
    # cloud spot prices change every few minutes at most, and each look is an API call
    price_interval: ClassVar[float] = 300.0
    boot_timeout: ClassVar[float] = 1200.0  # VM boot + bootstrap install before the agent speaks

    #: whether its VMs install spotnb with a boot script (the clouds): `launch` then fills in
    #: `LaunchSpec.code`, the notebook's own spotnb shipped through the store (spotnb.providers.shipping)
    ships_code: ClassVar[bool] = False

    #: how to give this provider credentials, for the error of provider="any" without any
    credentials_hint: ClassVar[str] = ""

    def __init__(self, config: Config) -> None:
        self.config = config
        # jobs whose coordinator this provider is starting with their controller on board
        # (`host_controller`), by job id: the coordinator's boot script and identity differ
        self._hosted: dict[str, Any] = {}

    @classmethod
    def has_credentials(cls) -> bool:
        """Whether credentials for this provider are found here, cheaply: no API call and no
        launch (provider="any" places only on the clouds that answer True)."""
        return True

    # -- public, concrete ----------------------------------------------------------------
    def validate(self) -> None:
        """Raise ConfigError for a request this provider cannot serve (before any launch)."""
        store = self.config.store_url()
        if store.startswith("memory://") and Feature.MEMORY_STORE in self.unsupported:
            raise ConfigError(
                f"Config.store: {store!r} cannot be used with provider="
                f"{self.name!r}: {self.unsupported[Feature.MEMORY_STORE]}. "
                "Use a file:// path or a cloud bucket."
            )
        if (
            isinstance(self.config.regions, list)
            and len(self.config.regions) > 1
            and not self.supports(Feature.MULTI_REGION)
        ):
            raise ConfigError(f"Config.regions: {self.unsupported[Feature.MULTI_REGION]}")
        if self.config.instances > 1 and not self.supports(Feature.ELASTIC):
            why = self.unsupported.get(Feature.ELASTIC, "it has no coordinator (Provider.coordinator)")
            raise ConfigError(
                f"Config.instances: {self.config.instances} instances are not available on "
                f"provider={self.name!r}: {why}. Use instances=1, or a provider that has a "
                "coordinator (provider='local', 'aws', 'azure' or 'gcp')"
            )
        self._validate()

    def notice_settings(self, zone: str | None = None) -> dict[str, Any]:
        """How the agent hears of a preemption: protocol (aws | azure | gcp) and grace seconds
        (`zone`: where the instance is asked for; a provider across clouds answers per zone)."""
        return {"format": self.name, "grace": NOTICE_GRACE[self.name]}

    def market_key(self, zone: str | None) -> tuple[str, str | None, str, dict[str, float]]:
        """(provider, zone, instance type, priors) the job DB keys a zone's market by (its
        preemptions and restart times, `JobDB.market`); a provider across clouds answers
        with the zone's own cloud, so that its jobs and single-cloud jobs share their history."""
        from spotnb.settings.registry import provider_info

        priors = provider_info(self.name).settings.market_priors(self.config, zone)
        return (self.name, zone, str(self.config.instance_type), priors)

    def supports(self, feature: Feature) -> bool:
        if feature == Feature.ELASTIC and type(self).coordinator is Provider.coordinator:
            return False
        return feature not in self.unsupported

    def coordinator(self, job_id: str, min_replicas: int) -> str:
        """Start (or find) the job's coordinator: torchft's lighthouse, which must outlive any
        one spot instance. Returns the address the instances reach it at
        ("http://host:port"), the same at every call: the fleet controller calls it every loop
        so that a coordinator that died is started again, and hands the address to every
        replica once. Providers that support `Feature.ELASTIC` implement it; it is idempotent
        per job, and the provider ends the coordinator in `close` (a cloud one costs money)."""
        raise NotImplementedError(f"provider {self.name!r} has no coordinator for several instances")

    def host_controller(self, job_id: str, store_url: str, job_key: str) -> None:
        """Start the job's controller off the notebook's machine (`Config.controller="cloud"`),
        on the job's on-demand coordinator, which restarts it if it crashes and powers off once
        it ends the job; the notebook then only follows the store. Idempotent per job (a live
        coordinator is found by its tags, not doubled), so a later notebook calls it again to
        replace a coordinator that died. The coordinator is not this provider's to end: its
        `close` leaves it running. Providers that support `Feature.ELASTIC` implement it."""
        raise ConfigError(
            f"Config.controller: provider {self.name!r} cannot host the job's controller; "
            "set controller='notebook'"
        )

    def launch(self, spec: LaunchSpec) -> Instance:
        """Ask for one spot instance running `spec.command`. Raises CapacityError when the
        market has none; the controller retries with backoff and moves on to other regions."""
        if not spec.command:
            raise ValueError("LaunchSpec.command is empty")
        if spec.job_key is None:
            from spotnb.core.signing import key_path, load_key

            key = load_key(spec.job_id)
            if key is not None:
                spec = dataclasses.replace(spec, job_key=key.hex())
            else:  # the instance will refuse to run anything: say why here too
                logging.getLogger("spotnb.providers").warning(
                    "job %s: no job key at %s; its instance cannot verify the job and will refuse "
                    "it (drive the job from the machine that submitted it)",
                    spec.job_id,
                    key_path(spec.job_id),
                )
        return self._launch(self._with_code(spec))

    def _with_code(self, spec: LaunchSpec) -> LaunchSpec:
        """`spec` with what its VM installs spotnb from (`Config.spotnb_source`): the store's
        wheel (`spec.code`, for a provider that `ships_code`), or a pip spec of spotnb as the
        first requirement; unchanged for "index" and for a spec that says already."""
        from spotnb.providers.shipping import (
            code_for_launch,
            own_requirement,
            source_requirement,
            store_extra,
        )

        if not self.ships_code or spec.code is not None or own_requirement(spec.requirements):
            return spec
        extra = source_requirement(self.config)
        if extra:
            return dataclasses.replace(spec, requirements=[*extra, *spec.requirements])
        extras = [store_extra(spec.store_url), "elastic" if self.config.instances > 1 else None]
        code = code_for_launch(self.config, spec.job_id, extras)
        return dataclasses.replace(spec, code=code) if code is not None else spec

    def describe(self, instance: Instance) -> InstanceStatus:
        return self._describe(instance)

    def terminate(self, instance: Instance) -> None:
        self._terminate(instance)

    def prices(self, instance_type: str, regions: list[str] | None = None) -> dict[str, Price]:
        """Current $/h per region (or "" for a provider without regions)."""
        return self._prices(instance_type, regions)

    def billing(self, zone: str | None) -> Billing:
        """How `zone` bills an instance's time (`spotnb.core.billing`): the ledger bills it so, and
        `migrate="billing-aware"` times moves to its increments. Default: the cloud's
        documented billing of Linux VMs, continuous for a provider off the clouds."""
        return CLOUD_BILLING.get(self.name, CONTINUOUS)

    def zone_location(self, zone: str | None) -> tuple[str | None, str | None]:
        """(cloud, region) of one of this provider's zones, to price moving the checkpoint
        there (`spotnb.market.transfer`); a provider off the clouds (the local market) is None."""
        from spotnb.market.transfer import EGRESS

        return (self.name if self.name in EGRESS else None, zone)

    def egress_per_gb(self, src: tuple[str | None, str | None], dst: tuple[str | None, str | None]) -> float:
        """$/GB to move bytes from `src` to `dst`, each (cloud, region) as `zone_location` and
        `store_location` give them (`spotnb.market.regional` weighs a checkpoint's copy with it)."""
        from spotnb.market.transfer import egress_per_gb

        return egress_per_gb(src, dst)[0]

    def store_location(self) -> tuple[str | None, str | None]:
        """(cloud, region) of the job's store: its cloud from the URL; the region where the
        provider can ask for it cheaply (None: unknown, priced as another region)."""
        from spotnb.market.transfer import store_cloud

        return (store_cloud(self.config.store_url()), None)

    def plan_launch(self, spec: LaunchSpec) -> dict[str, Any]:
        """The exact requests `launch` would send (API bodies, bootstrap script), sending nothing.
        Used by `spot.train(..., dry_run=True)`."""
        spec = self._with_code(spec)
        plan = self._plan_launch(spec)
        if isinstance(plan, dict) and self.ships_code and "code" not in plan:  # where spotnb comes from
            plan["code"] = _code_text(spec)
        return plan

    def wait_allocated(self, instance: Instance, timeout: float, stop: Any = None) -> InstanceStatus:
        """Poll until the instance leaves PENDING (clouds boot asynchronously)."""
        deadline = time.time() + timeout
        while True:
            status = self.describe(instance)
            if status.state != InstanceState.PENDING or time.time() > deadline:
                return status
            if stop is not None and stop.wait(1.0):
                return status
            elif stop is None:
                time.sleep(1.0)

    def allocation_refusal(self, instance: Instance) -> Exception | None:
        """Why `instance`'s allocation failed after the launch call returned (a cloud that
        creates asynchronously: Azure's AllocationFailed or a quota, read once `wait_allocated`
        said it is not running): a QuotaError ends the job, anything else is retried after a
        backoff. None: nothing known (the default)."""
        return None

    def close(self) -> None:
        """Release what the provider holds (servers, clients)."""

    def resume_state(self, launched: int, first_launch: float) -> None:
        """After a controller restart: `launched` instances were already started, the first at
        `first_launch` (the local market uses this to continue its schedule)."""

    def reclaim(self, record: dict[str, Any]) -> Instance | None:
        """Take over the instance of an `allocated` event whose controller died: return it to
        keep watching it, or end it and return None (the job then relaunches from its last
        checkpoint). The default ends it."""
        instance = Instance(
            id=record["instance_id"],
            provider=self.name,
            region=record.get("region"),
            instance_type=record.get("instance_type", ""),
            launched_at=record.get("launched_at", record["t"]),
            info=dict(record.get("info") or {}),
        )
        try:
            self.terminate(instance)
        except Exception:  # noqa: BLE001 - it may be gone already
            pass
        return None

    # -- backend hooks -------------------------------------------------------------------
    def _validate(self) -> None:
        """Provider-specific checks of the config."""

    def _plan_launch(self, spec: LaunchSpec) -> dict[str, Any]:
        """Backends override to show their request bodies."""
        return {"command": spec.command, "env": spec.env}

    @abstractmethod
    def _launch(self, spec: LaunchSpec) -> Instance:
        """Start one instance (or raise CapacityError)."""

    @abstractmethod
    def _describe(self, instance: Instance) -> InstanceStatus:
        """Report the instance's state."""

    @abstractmethod
    def _terminate(self, instance: Instance) -> None:
        """End the instance and free what it holds (idempotent)."""

    @abstractmethod
    def _prices(self, instance_type: str, regions: list[str] | None) -> dict[str, Price]:
        """Spot and on-demand $/h per region."""


def _code_text(spec: LaunchSpec) -> str:
    """Where a VM of `spec` gets spotnb, in words (a dry run's summary)."""
    if spec.code is not None:
        return str(spec.code.describe())
    own = [r for r in spec.requirements if r.lstrip().startswith("spotnb")]
    if own:
        return f"pip install {' '.join(own)} (the job's spotnb_source or requirements)"
    return f"the package index: spotnb=={spec.spotnb_version or 'this version'} (spotnb_source='index')"
