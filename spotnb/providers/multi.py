"""`provider="any"`: one job placed across the clouds the user has credentials for.

A thin provider over the real ones: each cloud of the `instance_type` mapping whose
credentials are found (`Provider.has_credentials`, no API call) gets its own provider, built
from the job's Config with that cloud as the provider and its instance type
(`any_settings.sub_config`). Zones are named `<cloud>/<zone>`; prices, launches, watching and
ending an instance are handed to the zone's cloud, and the controller ranks the zones of every
cloud in one table (`spotnb.market.placement`): the price, the market, and moving the checkpoint
between the store (one URI, where it is) and the zone, across clouds at the internet egress
price (`spotnb.market.transfer`).

One cloud's price API being down, slow or answering garbage leaves that cloud's zones out of
this look (logged), never the job: the others are ranked without it (`PRICE_WAIT`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import TYPE_CHECKING, Any, ClassVar

from spotnb.core.billing import CLOUD_BILLING, CONTINUOUS, Billing
from spotnb.errors import ConfigError, ProviderUnavailable
from spotnb.market.prices import Price
from spotnb.providers.base import Feature, Instance, InstanceStatus, LaunchSpec, Provider
from spotnb.settings.any import ANY_CLOUDS, split_zone, sub_config
from spotnb.settings.base import NOTICE_GRACE
from spotnb.settings.registry import get_provider_class, provider_info

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = ["AnyCloudProvider", "PRICE_WAIT"]

log = logging.getLogger("spotnb.providers.multi")

#: seconds the prices of all clouds are waited for; a cloud slower than that is left out of
#: this look (its API call goes on in the background and fills its cache for the next one)
PRICE_WAIT = 20.0


class AnyCloudProvider(Provider):
    """Spot instances on whichever cloud has the best zone: AWS, Azure or GCP."""

    name = "any"
    ships_code = True  # its VMs install the notebook's spotnb from the store
    unsupported: ClassVar[dict[Feature, str]] = {
        Feature.ELASTIC: "the instances of a job on several instances share one network; pick one cloud",
        Feature.FAULT_INJECTION: "inject through the zone's cloud (its own provider)",
        Feature.CLEANUP: "run `spotnb gc --provider aws` (azure, gcp): each cloud lists its own VMs",
        Feature.NOTICE_ACK: "depends on the zone's cloud",
        Feature.REBALANCE_HINT: "depends on the zone's cloud (AWS only)",
    }
    price_wait: float = PRICE_WAIT

    def __init__(self, config: Config, providers: dict[str, Provider] | None = None) -> None:
        """`providers`: a cloud's provider to use instead of building one (tests hand in
        providers whose compute control plane is mocked)."""
        super().__init__(config)
        self._given = dict(providers or {})
        self._subs: dict[str, Provider] = {}
        self._clouds: list[str] | None = None
        self.left_out: dict[str, str] = {}  # cloud → why it is not considered
        self._lock = threading.Lock()
        self._inner: dict[str, tuple[str, Instance]] = {}  # our instance id → (cloud, theirs)

    # -- the clouds ------------------------------------------------------------------------
    @property
    def mapping(self) -> dict[str, str]:
        it = self.config.instance_type
        return dict(it) if isinstance(it, dict) else {}

    def clouds(self) -> list[str]:
        """The clouds considered, in order: those of the mapping (or `any_clouds`), named by
        `regions` when it is a list, with credentials found here."""
        if self._clouds is not None:
            return self._clouds
        wanted = list(self.config.any_clouds or self.mapping)
        named = [self.config.region] if self.config.region else []
        if isinstance(self.config.regions, list):
            named += self.config.regions
        if named:
            zones = {split_zone(n)[0] for n in named}
            wanted = [c for c in wanted if c in zones]
        out = []
        for cloud in wanted:
            if cloud in self._given:
                out.append(cloud)
                continue
            try:
                cls = get_provider_class(cloud)
            except ProviderUnavailable as exc:
                self.left_out[cloud] = str(exc)
                continue
            if not cls.has_credentials():
                self.left_out[cloud] = "no credentials found here (" + cls.credentials_hint + ")"
                continue
            out.append(cloud)
        self._clouds = out
        return out

    def sub(self, cloud: str) -> Provider:
        """The provider of one cloud (built once)."""
        with self._lock:
            if cloud not in self._subs:
                given = self._given.get(cloud)
                self._subs[cloud] = given or get_provider_class(cloud)(sub_config(self.config, cloud))
            return self._subs[cloud]

    # -- validation and planning -----------------------------------------------------------
    def _validate(self) -> None:
        clouds = self.clouds()
        if not clouds:
            hints = []
            for cloud in self.config.any_clouds or self.mapping:
                try:
                    hints.append(get_provider_class(cloud).credentials_hint)
                except ProviderUnavailable:
                    hints.append(f"{cloud}: {provider_info(cloud).install}")
            raise ConfigError(
                "Config.provider: provider='any' found credentials for none of the clouds of "
                f"instance_type ({', '.join(self.mapping)}), so nothing could be launched. Set "
                "credentials for at least one: " + "; ".join(hints)
            )
        for cloud in clouds:
            try:
                self.sub(cloud).validate()
            except ConfigError as exc:
                raise ConfigError(f"provider='any', on {cloud}: {exc}") from None

    def _plan_launch(self, spec: LaunchSpec) -> dict[str, Any]:
        """Each cloud's requests, as its own provider would send them for this job."""
        requests: list[dict[str, Any]] = []
        plans: dict[str, Any] = {}
        for cloud in self.clouds():
            sub = self.sub(cloud)
            sub_regions = sub.config.candidate_regions()
            first = sub_regions[0] if isinstance(sub_regions, list) and sub_regions else None
            try:
                plan = sub.plan_launch(
                    dataclasses.replace(spec, region=first, instance_type=self.mapping[cloud])
                )
            except ConfigError as exc:
                plans[cloud] = {"error": str(exc)}
                continue
            plans[cloud] = plan
            for r in plan.get("requests", []) if isinstance(plan, dict) else []:
                requests.append({**r, "api": f"{cloud}: {r.get('api', '?')}"})
        bootstrap = next(
            (p.get("bootstrap") for p in plans.values() if isinstance(p, dict) and p.get("bootstrap")), None
        )
        return {
            "provider": self.name,
            "instance_type": self.config.instance_type_name(),
            "clouds": plans,
            "clouds_left_out": dict(self.left_out),
            "requests": requests,
            "bootstrap": bootstrap,
        }

    # -- zones -----------------------------------------------------------------------------
    def notice_settings(self, zone: str | None = None) -> dict[str, Any]:
        cloud, inner = self._where(zone)
        try:
            return self.sub(cloud).notice_settings(inner)
        except Exception:  # noqa: BLE001 - a cloud whose provider cannot be built: its defaults
            return {"format": cloud, "grace": NOTICE_GRACE.get(cloud, 30.0)}

    def market_key(self, zone: str | None) -> tuple[str, str | None, str, dict[str, float]]:
        cloud, inner = split_zone(zone)
        if cloud not in self.mapping:
            return (self.name, zone, self.config.instance_type_name(), {})
        priors = provider_info(cloud).settings.market_priors(sub_config(self.config, cloud), inner)
        return (cloud, inner, self.mapping[cloud], priors)

    def zone_location(self, zone: str | None) -> tuple[str | None, str | None]:
        cloud, inner = self._where(zone)
        try:
            return self.sub(cloud).zone_location(inner)
        except Exception:  # noqa: BLE001 - the cloud's provider cannot be built: name only
            return (cloud, inner)

    def billing(self, zone: str | None) -> Billing:
        cloud, _ = self._where(zone)
        return CLOUD_BILLING.get(cloud, CONTINUOUS)

    def store_location(self) -> tuple[str | None, str | None]:
        from spotnb.market.transfer import store_cloud

        cloud = store_cloud(self.config.store_url())
        if cloud in self.clouds():
            return self.sub(cloud).store_location()
        return (cloud, None)

    def _where(self, zone: str | None) -> tuple[str, str | None]:
        cloud, inner = split_zone(zone)
        if cloud is None:  # no zone: the first cloud's own default
            clouds = self.clouds()
            return (clouds[0] if clouds else ANY_CLOUDS[0]), None
        return cloud, inner

    # -- prices ----------------------------------------------------------------------------
    def _prices(self, instance_type: str, regions: list[str] | None) -> dict[str, Price]:
        """Every cloud's zones, `<cloud>/<zone>` → Price, asked in parallel; a cloud that
        fails, is slower than `price_wait` or answers prices that are not finite numbers is
        left out of this answer (logged), the others are not."""
        asks: dict[str, list[str] | None] = {}
        if regions is None and self.config.regions != "cheapest":  # the job's own zones
            named = self.config.regions if isinstance(self.config.regions, list) else [self.config.region]
            regions = [r for r in named if r]
        if regions is None:
            asks = {cloud: None for cloud in self.clouds()}
        else:
            for name in regions:
                cloud, inner = split_zone(name)
                if cloud in self.clouds() and inner:
                    asks.setdefault(cloud, []).append(inner)  # type: ignore[union-attr]
        out: dict[str, Price] = {}
        if not asks:
            return out
        pool = ThreadPoolExecutor(max_workers=len(asks), thread_name_prefix="spotnb-prices")
        futures = {
            cloud: pool.submit(self.sub(cloud).prices, self.mapping[cloud], zones)
            for cloud, zones in asks.items()
        }
        pool.shutdown(wait=False)  # a slow cloud's call finishes on its own
        deadline = time.monotonic() + self.price_wait  # one wait for all the clouds
        for cloud, fut in futures.items():
            try:
                got = fut.result(timeout=max(0.0, deadline - time.monotonic()))
            except FuturesTimeout:
                log.warning("%s prices: no answer in %.0f s; its zones are left out", cloud, self.price_wait)
                continue
            except Exception as exc:  # noqa: BLE001 - one cloud's API down is not the job's end
                log.warning("%s prices could not be read (%r); its zones are left out", cloud, exc)
                continue
            if not got and asks[cloud] is None:
                log.warning(
                    "%s priced no zone for regions='cheapest' (GCP's dated table has no regions); "
                    "list its zones in regions, e.g. '%s/<zone>'",
                    cloud,
                    cloud,
                )
            for zone, price in (got or {}).items():
                if _sane(price):
                    out[f"{cloud}/{zone}"] = price
                else:
                    log.warning("%s prices: %r for %s is not a price; left out", cloud, price, zone)
        return out

    # -- instances -------------------------------------------------------------------------
    def _launch(self, spec: LaunchSpec) -> Instance:
        if spec.region is None:  # regions='cheapest' and no cloud priced a zone of its type
            clouds = self.clouds()
            example = f"{clouds[0]}/<zone>" if clouds else "aws/us-east-1a"
            raise ConfigError(
                f"Config.instance_type: no zone of {', '.join(clouds) or 'any cloud'} prices "
                f"{self.config.instance_type_name()}, so regions='cheapest' has no zone to launch "
                f"in (a type name one cloud does not offer; GCP prices no zone without a list). "
                f"Check each cloud's type name, or list zones: regions=['{example}', ...]"
            )
        cloud, inner = self._where(spec.region)
        if cloud not in self.clouds():
            raise ConfigError(
                f"Config.regions: {spec.region!r} is on {cloud}, which provider='any' does not "
                f"consider ({self.left_out.get(cloud, 'not in instance_type')})"
            )
        theirs = self.sub(cloud).launch(
            dataclasses.replace(spec, region=inner, instance_type=self.mapping[cloud])
        )
        return self._wrap(cloud, theirs)

    def _wrap(self, cloud: str, theirs: Instance) -> Instance:
        ours = Instance(
            id=theirs.id,
            provider=self.name,
            region=f"{cloud}/{theirs.region}" if theirs.region else cloud,
            instance_type=theirs.instance_type,
            launched_at=theirs.launched_at,
            info={**theirs.info, "cloud": cloud},
        )
        self._inner[ours.id] = (cloud, theirs)
        return ours

    def _unwrap(self, instance: Instance) -> tuple[Provider, Instance]:
        known = self._inner.get(instance.id)
        if known is not None:
            cloud, theirs = known
        else:  # from an event (a controller restart): rebuilt from the record
            cloud = str(instance.info.get("cloud") or split_zone(instance.region)[0] or "")
            if cloud not in ANY_CLOUDS:
                raise ValueError(f"instance {instance.id}: no cloud in its record")
            info = {k: v for k, v in instance.info.items() if k != "cloud"}
            _, inner = split_zone(instance.region)
            theirs = dataclasses.replace(instance, provider=cloud, region=inner, info=info)
        return self.sub(cloud), theirs

    def _describe(self, instance: Instance) -> InstanceStatus:
        sub, theirs = self._unwrap(instance)
        return sub.describe(theirs)

    def _terminate(self, instance: Instance) -> None:
        sub, theirs = self._unwrap(instance)
        sub.terminate(theirs)

    def allocation_refusal(self, instance: Instance) -> Exception | None:
        sub, theirs = self._unwrap(instance)
        return sub.allocation_refusal(theirs)

    def reclaim(self, record: dict[str, Any]) -> Instance | None:
        info = dict(record.get("info") or {})
        cloud = str(info.pop("cloud", "") or split_zone(record.get("region"))[0] or "")
        if cloud not in ANY_CLOUDS:
            return None
        theirs = self.sub(cloud).reclaim(
            {**record, "region": split_zone(record.get("region"))[1], "info": info}
        )
        return self._wrap(cloud, theirs) if theirs is not None else None

    def close(self) -> None:
        for sub in list(self._subs.values()):
            try:
                sub.close()
            except Exception:  # noqa: BLE001 - close every cloud even if one fails
                log.warning("closing %s failed", sub.name, exc_info=True)


def _sane(price: Any) -> bool:
    """A Price with finite, non-negative numbers (a garbage answer is not ranked)."""
    try:
        spot, od = float(price.spot), float(price.on_demand)
    except (TypeError, ValueError, AttributeError):
        return False
    return math.isfinite(spot) and math.isfinite(od) and spot >= 0 and od >= 0
