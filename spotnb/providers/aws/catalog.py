"""What AWS offers and charges for an instance type (mixed into `AWSProvider`).

Spot prices per availability zone come from `describe_spot_price_history` (on-demand ones from
the built-in table), and with `Config.regions="cheapest"` the candidates are every region enabled
for the account that offers the type (`describe_regions`, then each region's
`describe_instance_type_offerings`): asked of the API, so new regions and types need no spotnb
release. Both are cached on disk (`spotnb.market.price_cache`), prices for `PRICE_TTL`, the
regions offering a type for `OFFERING_TTL`.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from spotnb.errors import ConfigError
from spotnb.market.prices import Price, lookup_price
from spotnb.providers.aws.requests import split_zone

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = ["AWSCatalog", "PRICE_TTL", "OFFERING_TTL"]

log = logging.getLogger("spotnb.providers.aws.provider")

#: how long fetched spot prices / the regions offering a type are reused (spotnb.market.price_cache)
PRICE_TTL = 600.0
OFFERING_TTL = 86400.0


class AWSCatalog:
    """`Provider._prices` and `offering_regions` on AWS (a mixin of `AWSProvider`, which gives
    `config`, `client` and `default_region`)."""

    config: Config

    if TYPE_CHECKING:  # what AWSProvider supplies; declared for mypy, never defined here

        def client(self, service: str, region: str | None = None) -> Any: ...
        def default_region(self) -> str: ...

    def _prices(self, instance_type: str, regions: list[str] | None) -> dict[str, Price]:
        """Latest spot price per availability zone (on-demand from the built-in table). With
        `regions="cheapest"` the candidates are every region enabled for the account that
        offers the type (`describe_regions`, then each region's `describe_instance_type_offerings`),
        not a list; prices are cached on disk for `PRICE_TTL` and say how old they are."""
        from spotnb.market.price_cache import cached, describe_age

        table = lookup_price(instance_type, "aws")
        on_demand = table.on_demand if table else 0.0
        if regions is None and self.config.regions == "cheapest" and not self.config.region:
            wanted = self.offering_regions(instance_type)
        else:
            wanted = [r for r in (regions or [self.default_region()]) if r]
        key = f"aws-spot-{instance_type}-{'+'.join(sorted(wanted))}"
        if len(key) > 100:  # every region: one key per type
            key = f"aws-spot-{instance_type}-all-{len(wanted)}"
        try:
            rows, age = cached(key, PRICE_TTL, lambda: self._fetch_spot(instance_type, wanted))
        except OSError:
            rows, age = {name: (None, "") for name in wanted}, 0.0
        out: dict[str, Price] = {}
        for name, (spot, stamp) in rows.items():
            if spot is None:
                if table:
                    out[name] = Price(table.spot, table.on_demand, table.source)
                continue
            out[name] = Price(
                float(spot),
                on_demand,
                f"EC2 spot price history {stamp} ({describe_age(age)}); on-demand: built-in table",
            )
        return out

    def _fetch_spot(self, instance_type: str, wanted: list[str]) -> dict[str, tuple[float | None, str]]:
        """{zone: (latest spot $/h, its time)} for each wanted region or zone, asked in
        parallel; a region that cannot be asked maps to (None, "") (the table then stands in)."""
        from concurrent.futures import ThreadPoolExecutor

        since = datetime.now(timezone.utc) - timedelta(hours=3)

        def one(name: str) -> dict[str, tuple[float | None, str]]:
            region, zone = split_zone(name)
            try:
                rows = self.client("ec2", region).describe_spot_price_history(
                    InstanceTypes=[instance_type],
                    ProductDescriptions=["Linux/UNIX"],
                    StartTime=since,
                    **({"AvailabilityZone": zone} if zone else {}),
                )["SpotPriceHistory"]
            except (ClientError, BotoCoreError) as exc:
                log.debug("spot prices of %s in %s: %r", instance_type, name, exc)
                return {name: (None, "")}
            latest: dict[str, dict[str, Any]] = {}
            for row in rows:
                az = row["AvailabilityZone"]
                if zone and az != zone:
                    continue
                if az not in latest or row["Timestamp"] > latest[az]["Timestamp"]:
                    latest[az] = row
            stamp = "%Y-%m-%d %H:%M"
            return {az: (float(r["SpotPrice"]), f"{r['Timestamp']:{stamp}}") for az, r in latest.items()}

        out: dict[str, tuple[float | None, str]] = {}
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(wanted)))) as pool:
            for part in pool.map(one, wanted):
                out.update(part)
        if not any(spot is not None for spot, _ in out.values()):
            raise OSError("no region answered")  # not cached: the next allocation asks again
        return out

    def offering_regions(self, instance_type: str) -> list[str]:
        """Every region enabled for this account that offers `instance_type`, from the API
        (cached for `OFFERING_TTL`): new regions and types appear without a spotnb release."""
        from concurrent.futures import ThreadPoolExecutor

        from spotnb.market.price_cache import cached

        def fetch() -> list[str]:
            names = [r["RegionName"] for r in self.client("ec2").describe_regions()["Regions"]]

            def offered(region: str) -> bool:
                try:
                    rows = self.client("ec2", region).describe_instance_type_offerings(
                        LocationType="region",
                        Filters=[{"Name": "instance-type", "Values": [instance_type]}],
                    )["InstanceTypeOfferings"]
                except (ClientError, BotoCoreError) as exc:
                    log.debug("offerings of %s in %s: %r", instance_type, region, exc)
                    return False
                return bool(rows)

            with ThreadPoolExecutor(max_workers=16) as pool:
                return [r for r, ok in zip(names, pool.map(offered, names), strict=True) if ok]

        regions, _ = cached(f"aws-offering-{instance_type}", OFFERING_TTL, fetch)
        if not regions:
            raise ConfigError(
                f"Config.instance_type: no AWS region enabled for this account offers "
                f"{instance_type!r}; check the name (e.g. 'g4dn.xlarge') or enable a region"
            )
        return list(regions)
