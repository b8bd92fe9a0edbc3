"""Settings of the local spot market (real processes on this machine, really killed).

Fields carry the `local_` prefix; `spot.Config` inherits them (see `spotnb.providers.info`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from spotnb.durations import DAY, Duration, Range, bounded, duration_range, is_int, lifetime, parse_duration
from spotnb.providers.info import NOTICE_GRACE, ProviderSettings, no_bool

__all__ = ["LocalSettings"]


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

    def local_notice_grace(self) -> float:
        """Notice lead time of the local market: `local_grace`, else that of the cloud whose
        notice format it speaks."""
        if self.local_grace is not None:
            return self.local_grace
        return NOTICE_GRACE[self.local_notice_format]

    @classmethod
    def check_config(cls, config: Any) -> None:
        links = config.local_link_delay or {}
        if links and (config.instances <= 1 or max(links) >= config.instances):
            raise ValueError(
                f"local_link_delay names instance {max(links)}, but the job has "
                f"instances={config.instances} (numbered 0 to {config.instances - 1}; slow links "
                "need several instances)"
            )
        if config.price_spot is None or config.price_on_demand is None:
            from spotnb.prices import lookup_price

            if lookup_price(config.instance_type) is None:
                raise ValueError(
                    f"instance_type {config.instance_type!r} is not in the price table, so "
                    "the local market cannot price it: pick a listed type (e.g. "
                    "'g4dn.xlarge') or give price_spot and price_on_demand"
                )

    @classmethod
    def market_priors(cls, config: Any) -> dict[str, float]:
        """The market is configured, not measured: its own mean lifetime and allocation delay
        (plus ~2 s of process start) are the priors."""
        lo, hi = config.local_alloc_delay
        priors = {"prior_restart": (lo + hi) / 2 + 2.0}
        if config.local_mttp:
            priors["prior_mttp"] = config.local_mttp
        return priors
