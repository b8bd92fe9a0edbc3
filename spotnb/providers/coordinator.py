"""What the clouds' coordinators share: the role tag, the cap on failed starts, the price, the
boot script and the record an instance keeps of the coordinator it trains with.

A job on several instances on a cloud runs torchft's lighthouse on a small on-demand machine
(`Provider.coordinator`) behind an address fixed for the job, so a coordinator that died is
replaced where the replicas already look. Each cloud builds that with its own primitives (AWS:
a network interface and a security group; Azure: a NIC with a static private IP, an
application security group and a network security group; GCP: a reserved internal address and
firewall rules by network tag); this module holds what does not depend on the cloud. It imports
no SDK.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spotnb.market.prices import Price, lookup_price
from spotnb.providers.bootstrap import controller_script, coordinator_script

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = [
    "ROLE_TAG",
    "COORDINATOR_ROLE",
    "MAX_COORDINATOR_LAUNCHES",
    "SETTLED_S",
    "KnownCoordinator",
    "HostedController",
    "coordinator_type",
    "coordinator_price",
    "coordinator_record",
    "coordinator_boot_script",
    "failed_starts",
    "host_on_coordinator",
    "planned_hosting",
]

#: Tag (label on GCP) that tells a job's coordinator (and its network) from its spot instances.
ROLE_TAG = "spotnb-role"
COORDINATOR_ROLE = "coordinator"
#: A coordinator started this many times in a row without staying up ends the job visibly
#: instead of launching on demand forever.
MAX_COORDINATOR_LAUNCHES = 5
#: A coordinator running this long booted and installed: its launches stop counting as failed
#: starts (a cloud says "running" before the boot script ran, so "running" alone proves nothing).
SETTLED_S = 900.0


@dataclass
class KnownCoordinator:
    """What a provider knows of one job's coordinator (Azure and GCP; AWS keeps its own)."""

    job_id: str
    region: str  # Azure location / GCP zone it runs in
    private_ip: str
    instance_id: str | None = None
    instance_type: str = ""
    started: float | None = None  # its launch time (billing starts)
    checked: float = 0.0  # when it was last described
    launches: int = 0  # started by this provider without staying up
    extra: dict[str, Any] = field(default_factory=dict)  # the cloud's ids (NIC, address, …)


def coordinator_type(config: Config, default: str) -> str:
    """Config.coordinator_instance_type, else the cloud's small default."""
    return str(config.coordinator_instance_type or default)


def coordinator_price(config: Config, cloud: str, itype: str, figures: dict[str, float]) -> Price | None:
    """The coordinator's on-demand $/h: Config.coordinator_price, else the built-in table,
    else spotnb's figures for the cloud's small types (`figures`); None if unknown."""
    if config.coordinator_price is not None:
        price = float(config.coordinator_price)
        return Price(price, price, "Config.coordinator_price")
    table = lookup_price(itype, cloud)
    if table is not None:
        return Price(table.on_demand, table.on_demand, table.source)
    if itype in figures:
        price = figures[itype]
        return Price(price, price, f"built-in coordinator figure ({cloud} on-demand list price)")
    return None


def coordinator_record(known: KnownCoordinator | None, price: Price | None) -> dict[str, Any]:
    """What an instance's `info` (so its `launched`/`allocated` events) records of the
    coordinator it trains with, for the cost ledger (`ledger.coordinator_overheads`)."""
    if known is None or known.instance_id is None:
        return {}
    return {
        "coordinator": {
            "id": known.instance_id,
            "instance_type": known.instance_type,
            "started": known.started,
            "price": price.on_demand if price else 0.0,
        }
    }


@dataclass(frozen=True)
class HostedController:
    """A job whose controller its coordinator runs (`Config.controller="cloud"`): what the
    coordinator's boot script needs besides the lighthouse's settings."""

    store_url: str
    job_key: str  # hex; the coordinator verifies the job spec with it (never logged)

    def __repr__(self) -> str:  # a repr in a log line must not carry the key
        return f"HostedController(store_url={self.store_url!r}, job_key=<hidden>)"


def coordinator_boot_script(
    config: Config,
    job_id: str,
    cloud: str,
    min_replicas: int | None = None,
    hosted: HostedController | None = None,
) -> str:
    """The coordinator's boot script for `cloud`: the lighthouse alone (no credential, no job
    key), or with `hosted` the job's controller too (and the lighthouse if the job has several
    instances), which carries the job key. Its spotnb comes from where the instances' does
    (`Config.spotnb_source`): a hosting coordinator installs the job's shipped wheel with the
    cloud's and the store's extras; the lighthouse alone carries its one module instead."""
    from spotnb.providers.shipping import code_for_launch, needs_code, source_requirement, store_extra

    requirements = [*source_requirement(config), *config.requirements]
    if hosted is not None:
        extras = [cloud, store_extra(hosted.store_url), "elastic" if config.instances > 1 else None]
        return controller_script(
            job_id,
            store_url=hosted.store_url,
            job_key=hosted.job_key,
            cloud=cloud,
            instances=config.instances,
            min_replicas=config.min_instances if min_replicas is None else min_replicas,
            port=config.coordinator_port,
            requirements=requirements,
            code=code_for_launch(config, job_id, extras, _key(hosted.job_key)),
        )
    return coordinator_script(
        job_id,
        min_replicas=config.min_instances if min_replicas is None else min_replicas,
        cloud=cloud,
        port=config.coordinator_port,
        requirements=requirements,
        idle_minutes=config.coordinator_idle_minutes,
        ship_lighthouse=needs_code(config),
    )


def _key(hex_key: str) -> bytes | None:
    """The hosted job's key as bytes (None for a dry run's placeholder)."""
    try:
        return bytes.fromhex(hex_key)
    except ValueError:
        return None


def failed_starts(known: KnownCoordinator | Any, where: str, hint: str) -> RuntimeError:
    """The error that ends the job when its coordinator was started `MAX_COORDINATOR_LAUNCHES`
    times and never stayed up (a bad image, a failed install): the fleet controller's call
    raises it, and the job fails with it as its message."""
    return RuntimeError(
        f"job {known.job_id}: its coordinator was started {known.launches} times and did not "
        f"stay up (last: {known.instance_id}; see its serial/boot log in {where}). {hint}"
    )


def host_on_coordinator(provider: Any, job_id: str, store_url: str, job_key: str) -> None:
    """`Provider.host_controller` for a provider with a `coordinator` (Azure, GCP): start (or
    find) the job's coordinator with its controller on board, then forget it, so the
    notebook's `close` does not end the coordinator the job now depends on. The network the
    coordinator stands in is forgotten too (its `close` would wait for the VM to go)."""
    lock = provider._coordinator_lock
    with lock:
        provider._hosted[job_id] = HostedController(store_url, job_key)
    try:
        provider.coordinator(job_id, provider.config.min_instances)
    finally:
        with lock:
            provider._hosted.pop(job_id, None)
            known = provider._coordinators.pop(job_id, None)
            networks = getattr(provider, "_job_networks", None)
            if known is not None and networks is not None:
                networks.discard((job_id, known.region))


@contextmanager
def planned_hosting(provider: Any, job_id: str) -> Iterator[bool]:
    """While a dry run plans the coordinator of a job with `Config.controller="cloud"`, its
    boot script and identity are the hosting ones (the key shown as a placeholder). Yields
    whether the job has a coordinator to plan at all (several instances, or a cloud controller)."""
    from spotnb.providers.bootstrap import KEY_PLACEHOLDER

    config = provider.config
    hosted = config.controller == "cloud"
    if hosted:
        provider._hosted[job_id] = HostedController(config.store_url(), KEY_PLACEHOLDER)
    try:
        yield hosted or config.instances > 1
    finally:
        if hosted:
            provider._hosted.pop(job_id, None)
