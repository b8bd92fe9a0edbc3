"""Settings of the local spot market (real processes on this machine, really killed).

Fields carry the `local_` prefix; `spot.Config` inherits them (see `spotnb.settings.base`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator

from spotnb.core.billing import CONTINUOUS, Billing, parse_billing
from spotnb.core.durations import (
    DAY,
    Duration,
    Range,
    bounded,
    duration_range,
    is_int,
    lifetime,
    parse_duration,
)
from spotnb.settings.base import NOTICE_GRACE, ProviderSettings, no_bool

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = ["LocalSettings", "MAX_ZONES"]

#: zones the local market emulates at most (each has its own price and preemption draw)
MAX_ZONES = 16
_ZONE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def _price_schedule(zone: str, price: Any) -> list[tuple[float, float]] | None:
    """A zone's price as [(seconds since submission, $/h)], from a number or pairs."""
    if price is None:
        return None
    if isinstance(price, (int, float)) and not isinstance(price, bool):
        price = [[0, price]]
    if not isinstance(price, (list, tuple)) or not price:
        raise ValueError(f"zone {zone!r}: price is $/h (a number) or [[time, $/h], ...]")
    out: list[tuple[float, float]] = []
    for pair in price:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(f"zone {zone!r}: each price entry is [time since submission, $/h], got {pair!r}")
        at, p = parse_duration(pair[0]), pair[1]
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1000:
            raise ValueError(f"zone {zone!r}: a price of {p!r}; give $/h from 0 to 1000")
        if out and at <= out[-1][0]:
            raise ValueError(f"zone {zone!r}: price times must increase ({pair[0]!r} after {out[-1][0]:g} s)")
        out.append((at, float(p)))
    if out[0][0] != 0:
        raise ValueError(f"zone {zone!r}: the first price must be at time 0 (the price at submission)")
    return out


class LocalSettings(ProviderSettings):
    """The local market: preemptions (random, scheduled or replayed from a trace), notices in a
    chosen cloud's format, allocation delays and failures, upload bandwidth."""

    prefix: ClassVar[str] = "local_"

    local_mttp: Duration | None = Field(
        None, description="Mean time to preemption (exponential); None = no random preemptions."
    )
    local_grace: Duration | None = Field(
        None, description="Notice lead time before the kill (default: 120 s aws, 30 s azure/gcp)."
    )
    local_alloc_delay: Range = Field((0.3, 0.8), description="Allocation delay, seconds or [low, high).")
    local_capacity_failure: float = Field(
        0.0, ge=0, lt=1, description="Chance an allocation fails for lack of capacity."
    )
    local_schedule: list[Any] | None = Field(
        None,
        description="Deterministic preemptions, one per "
        "instance: lifetimes in seconds, or {'step': N, 'phase': "
        "'step'|'save'|'upload'|'commit'|'restore', 'notice': bool} (a kill when the "
        "instance reaches that step and phase; with notice, the "
        "notice then and the kill local_grace later); 'instance': k applies an entry to "
        "the next launch of the job's k-th instance (jobs on several instances).",
    )
    local_trace: str | None = Field(
        None, description="Replay a trace file (bamboo / parcae format) or a bundled trace name."
    )
    local_trace_speed: float = Field(
        1.0,
        gt=0,
        description="Trace seconds per second of the market when replaying local_trace (e.g. 600: "
        "ten minutes of the trace each second). A job on several instances replays the trace's "
        "node counts as its capacity.",
    )
    local_notice_format: Literal["aws", "azure", "gcp"] = Field(
        "aws", description="Which cloud's metadata protocol the emulator speaks."
    )
    local_upload_bps: float | None = Field(None, gt=0, description="Emulated upload bandwidth, bytes/s.")
    local_link_delay: dict[int, Duration] | None = Field(
        None,
        description="Emulated slow links of a job on several instances: {k: seconds} adds that "
        "latency to every all-reduce of the k-th instance (e.g. a replacement in another region).",
    )
    local_seed: int | None = Field(None, description="Seed of the local market's random draws.")
    local_regions: dict[str, dict[str, Any]] | None = Field(
        None,
        description="Emulated zones, each with its own spot price and preemptions: {name: "
        "{'price': $/h or [[time since submission, $/h], ...], 'mttp': duration, 'egress': $/GB "
        "between the zone and elsewhere (Config.regional_stores weighs it)}}, e.g. "
        "{'zone-a': {'price': 0.10}, 'zone-b': {'price': [[0, 0.30], ['15s', 0.02]], 'mttp': '10m'}}. "
        "'billing': how the zone bills an instance's time, '1h' (per hour, at least one) or "
        "{'increment': '30s', 'minimum': '1m'}; default continuously. "
        "The zone is the instance's region; Config.region / regions (or 'cheapest') choose "
        "among them. Without a price a zone uses the price table's; without an mttp, local_mttp.",
    )

    @field_validator("local_seed", mode="before")
    @classmethod
    def _local_no_bool(cls, v: Any) -> Any:
        return no_bool(v)

    @field_validator("local_link_delay", mode="before")
    @classmethod
    def _local_links(cls, v: Any) -> Any:
        if v is None:
            return None
        if not isinstance(v, dict):
            raise ValueError("give {instance index: seconds}, e.g. {1: '300ms'}")
        out = {}
        for k, d in v.items():
            if isinstance(k, str) and k.isdigit():  # JSON (the job spec) keeps keys as strings
                k = int(k)
            if isinstance(k, bool) or not isinstance(k, int) or k < 0:
                raise ValueError(f"instance {k!r}: give a whole number >= 0 (the instance's index)")
            sec = parse_duration(d)
            if not 0 <= sec <= 60:
                raise ValueError(f"instance {k}: a delay of {d!r}; give 0 to 60 seconds")
            out[k] = sec
        return out

    @field_validator("local_mttp", "local_grace", mode="before")
    @classmethod
    def _local_opt_duration(cls, v: Any) -> float | None:
        return None if v is None else parse_duration(v)

    @field_validator("local_mttp")
    @classmethod
    def _local_mttp(cls, v: float | None) -> float | None:
        if v is None:
            return v
        if v <= 0:
            raise ValueError("local_mttp must be positive (or None for no random preemptions)")
        return bounded(v, 0.0, 30 * DAY, "use None for no random preemptions")

    @field_validator("local_grace")
    @classmethod
    def _local_grace(cls, v: float | None) -> float | None:
        return None if v is None else bounded(v, 0.0, 3600.0, "clouds give 30 s to 2 min of notice")

    @field_validator("local_alloc_delay", mode="before")
    @classmethod
    def _local_alloc(cls, v: Any) -> Range:
        lo, hi = duration_range(v)
        bounded(hi, 0.0, 3600.0, "every launch of the local market would wait that long")
        return lo, hi

    @field_validator("local_schedule", mode="before")
    @classmethod
    def _local_schedule(cls, v: Any) -> list[Any] | None:
        if v is None:
            return None
        if not isinstance(v, (list, tuple)):
            raise ValueError("give a list: lifetimes in seconds ('2m') or {'step': N, 'phase': ...}")
        out: list[Any] = []
        for item in v:
            if isinstance(item, dict):
                bad = set(item) - {"step", "phase", "after", "notice", "instance"}
                if bad:
                    raise ValueError(
                        f"schedule entry keys are step, phase, notice, after, instance; got {sorted(bad)}"
                    )
                slot = item.get("instance")
                if slot is not None and (not is_int(slot) or slot < 0):
                    raise ValueError(f"schedule 'instance' must be a non-negative int, got {slot!r}")
                if "step" in item:
                    if not is_int(item["step"]) or item["step"] < 0:
                        raise ValueError(f"schedule 'step' must be a non-negative int, got {item['step']!r}")
                    phase = item.get("phase", "step")
                    if phase not in ("step", "save", "upload", "commit", "restore"):
                        raise ValueError(
                            f"schedule 'phase' is one of step, save, upload, commit, restore; got {phase!r}"
                        )
                    entry = {"step": item["step"], "phase": phase, "notice": bool(item.get("notice", False))}
                elif "after" in item:
                    entry = {"after": lifetime(item["after"])}
                else:
                    raise ValueError("a schedule entry needs 'step' or 'after'")
                if slot is not None:
                    entry["instance"] = slot
                out.append(entry)
            else:
                out.append({"after": lifetime(item)})
        return out

    @field_validator("local_regions", mode="before")
    @classmethod
    def _local_regions(cls, v: Any) -> dict[str, dict[str, Any]] | None:
        if v is None:
            return None
        if not isinstance(v, dict) or not v:
            raise ValueError("give {zone name: {'price': ..., 'mttp': ...}}, e.g. {'zone-a': {'price': 0.1}}")
        if len(v) > MAX_ZONES:
            raise ValueError(f"{len(v)} zones; the local market emulates up to {MAX_ZONES}")
        out: dict[str, dict[str, Any]] = {}
        for name, zone in v.items():
            if not isinstance(name, str) or not _ZONE_NAME.fullmatch(name):
                raise ValueError(f"zone {name!r}: a name of letters, digits, '-', '_' or '.' (up to 63)")
            if not isinstance(zone, dict):
                raise ValueError(f"zone {name!r}: give {{'price': ..., 'mttp': ...}}, got {zone!r}")
            bad = set(zone) - {"price", "mttp", "billing", "egress"}
            if bad:
                raise ValueError(
                    f"zone {name!r}: the keys are price, mttp, billing and egress; got {sorted(bad)}"
                )
            egress = zone.get("egress")
            if egress is not None and (
                isinstance(egress, bool) or not isinstance(egress, (int, float)) or not 0 <= egress <= 10
            ):
                raise ValueError(
                    f"zone {name!r}: egress is $/GB between it and elsewhere, 0 to 10; got {egress!r}"
                )
            mttp = zone.get("mttp")
            if mttp is not None:
                mttp = parse_duration(mttp)
                if mttp <= 0:
                    raise ValueError(f"zone {name!r}: mttp must be positive (or left out)")
                bounded(mttp, 0.0, 30 * DAY, "leave mttp out for no random preemptions")
            out[name] = {"price": _price_schedule(name, zone.get("price")), "mttp": mttp}
            if zone.get("billing") is not None:  # kept as given: the spec is JSON (re-validated)
                parse_billing(f"local_regions zone {name!r}: billing", zone["billing"])
                out[name]["billing"] = zone["billing"]
            if egress is not None:
                out[name]["egress"] = float(egress)
        unpriced = [name for name, zone in out.items() if zone["price"] is None]
        if unpriced and len(unpriced) < len(out):
            priced = next(name for name, zone in out.items() if zone["price"] is not None)
            raise ValueError(
                f"zone {unpriced[0]!r} has no price while zone {priced!r} has one: it would cost the "
                "price table's figure for the instance type, a price from elsewhere, in every "
                f"comparison between zones; give every zone a price (e.g. {unpriced[0]!r}: "
                "{'price': 0.1}), or none"
            )
        return out

    def local_zone_billing(self, zone: str | None) -> Billing:
        """How `zone` bills its instances (`spotnb.core.billing`): its `billing`, else continuously."""
        given = (self.local_regions or {}).get(zone or "", {}).get("billing")
        return CONTINUOUS if given is None else parse_billing(f"zone {zone!r}: billing", given)

    def local_zone_price(self, zone: str, t: float) -> float | None:
        """The spot price ($/h) of `zone` at `t` seconds of the market (None: the table's)."""
        schedule = (self.local_regions or {}).get(zone, {}).get("price")
        if not schedule:
            return None
        price = schedule[0][1]
        for at, p in schedule:
            if at > t:
                break
            price = p
        return float(price)

    def local_notice_grace(self) -> float:
        """Notice lead time of the local market: `local_grace`, else that of the cloud whose
        notice format it speaks."""
        if self.local_grace is not None:
            return self.local_grace
        return NOTICE_GRACE[self.local_notice_format]

    @classmethod
    def check_config(cls, config: Config) -> None:
        links = config.local_link_delay or {}
        if links and (config.instances <= 1 or max(links) >= config.instances):
            raise ValueError(
                f"local_link_delay names instance {max(links)}, but the job has "
                f"instances={config.instances} (numbered 0 to {config.instances - 1}; slow links "
                "need several instances)"
            )
        zones = config.local_regions or {}
        if zones and config.price_spot is not None:
            raise ValueError(
                "price_spot and local_regions both set a spot price: give the zones' prices in "
                "local_regions, or remove local_regions"
            )
        named = [config.region] if config.region else config.regions
        if zones and isinstance(named, list):
            unknown = [r for r in named if r not in zones]
            if unknown:
                raise ValueError(
                    f"region(s) {unknown} are not zones of local_regions; the local market's zones "
                    f"are {sorted(zones)}"
                )
        elif not zones and isinstance(named, list) and set(named) - {"local"}:
            raise ValueError(
                f"region {named!r}: the local market has one region, 'local', unless local_regions "
                "defines zones (e.g. local_regions={'zone-a': {'price': 0.1}, 'zone-b': {'price': 0.05}})"
            )
        if config.price_spot is None or config.price_on_demand is None:
            from spotnb.market.prices import lookup_price

            # a mapping per cloud is refused for provider='local' before this check runs
            if lookup_price(config.instance_type_name()) is None:
                raise ValueError(
                    f"instance_type {config.instance_type!r} is not in the price table, so "
                    "the local market cannot price it: pick a listed type (e.g. "
                    "'g4dn.xlarge') or give price_spot and price_on_demand"
                )

    @classmethod
    def market_priors(cls, config: Config, zone: str | None = None) -> dict[str, float]:
        """The market is configured, not measured: its own mean lifetime and allocation delay
        (plus ~2 s of process start) are the priors."""
        lo, hi = config.local_alloc_delay
        priors = {"prior_restart": (lo + hi) / 2 + 2.0}
        known = (config.local_regions or {}).get(zone or config.region or "", {})
        if known.get("mttp"):  # an emulated zone's own lifetime
            priors["prior_mttp"] = known["mttp"]
        elif config.local_mttp:
            priors["prior_mttp"] = config.local_mttp
        return priors
