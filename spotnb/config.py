"""`spot.Config`: everything a job needs to know, validated before any instance is launched.

Generic fields apply to every provider; fields prefixed with a provider name (`local_*`,
`aws_*`, `azure_*`, `gcp_*`) apply to that provider only (submitit's convention). An unknown
field, or a field of another provider, is a `ConfigError` that names it and lists the valid ones.
"""
from __future__ import annotations

import difflib
import math
import os
import re
import unicodedata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from spotnb.errors import ConfigError

__all__ = ["Config", "parse_duration", "spotnb_home", "PROVIDER_PREFIXES"]

PROVIDER_PREFIXES = ("local_", "aws_", "azure_", "gcp_")

#: Longest job name: it is shown in lists and widgets and becomes part of cloud resource tags.
MAX_NAME = 200
_DAY = 86400.0
#: fsspec protocols that can only read (a store is written by every instance and the controller).
_READ_ONLY = {"http", "https", "github", "git", "zip", "tar", "libarchive", "reference", "data"}

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|min|s|m|h|d)")


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string like "90s", "2m", "1h30m", "500ms" (a bare number is seconds)."""
    if isinstance(value, bool):
        raise ValueError("expected a duration, got a bool")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION_RE.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise ValueError(
                    f"invalid duration {value!r}: use seconds (90) or a string like '90s', '2m', '3h', '1h30m'"
                ) from None
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        raise ValueError(f"expected a duration (seconds or '2m'), got {type(value).__name__}")
    if not math.isfinite(seconds):
        raise ValueError(f"{value!r} is not a finite duration: give seconds or a string like '2m'"
                         " (None, where the field allows it, means 'no limit')")
    if seconds < 0:
        raise ValueError(f"duration must be non-negative, got {value!r}")
    return seconds


def _bounded(seconds: float, low: float, high: float, why: str) -> float:
    """`seconds` if within [low, high]; else a ValueError with the bounds and why they are there
    (an absurd duration is a typo, and a job that waits 1000 days for it is worse than an error)."""
    if not low <= seconds <= high:
        raise ValueError(f"{seconds:g} s is outside [{_human(low)}, {_human(high)}]: {why}")
    return seconds


def _human(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def spotnb_home() -> Path:
    """`$SPOTNB_HOME`, default `~/.spotnb`: job DB and the default `file://` store live here."""
    return Path(os.environ.get("SPOTNB_HOME", Path.home() / ".spotnb")).expanduser()


Duration = float
Range = tuple[float, float]


def _range(value: Any, name: str) -> Range:
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ValueError(f"takes a duration or a [low, high) pair, got {len(value)} items")
        lo, hi = (parse_duration(v) for v in value)
        if hi < lo:
            raise ValueError(f"high ({hi}) is below low ({lo})")
        return (lo, hi)
    d = parse_duration(value)
    return (d, d)


class Config(BaseModel):
    """What to run where. Durations take seconds or strings such as "90s", "2m", "3h"."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, validate_assignment=True,
                              frozen=False)

    # --- generic -----------------------------------------------------------------------
    name: str | None = Field(None, description="A label for the job (shown in lists and widgets).")
    provider: str = Field("local", description="Where instances run: local, aws, azure or gcp.")
    instance_type: str = Field("g4dn.xlarge", description="Cloud instance type; also prices the ledger.")
    region: str | None = Field(None, description="One region (or zone) to launch in.")
    regions: list[str] | Literal["cheapest"] | None = Field(
        None, description="Candidate regions in order, or 'cheapest' to order them by spot price.")
    store: str | None = Field(None, description="fsspec URL for specs, events and checkpoints "
                                                "(default file://$SPOTNB_HOME/store).")
    checkpoint: Any = Field("hedged", description="Checkpoint policy: a name (hedged, adaptive, "
                                                  "static:N, young, daly, daly2) or a Policy object.")
    save_every: int | None = Field(None, ge=1, description="User periodic save every N steps.")
    keep_last: int = Field(2, ge=1, description="Periodic checkpoints kept.")
    max_preemptions: int | None = Field(None, ge=0, description="Stop after this many preemptions.")
    max_retries: int = Field(0, ge=0, description="Relaunches after a user error (default 0).")
    max_cost: float | None = Field(None, gt=0, description="Stop when the spot spend reaches this ($).")
    max_wait: Duration | None = Field(None, gt=0, description="Stop when no spot capacity was found "
                                      "for this long (None: keep asking).")
    max_stalled_relaunches: int | None = Field(8, ge=1, description="Stop after this many instances "
                                               "in a row ended without committing a checkpoint "
                                               "(no net progress); None: never.")
    heartbeat_timeout: Duration = Field(60.0, description="Silence after which an instance counts as dead.")
    notice_poll: Duration = Field(1.0, description="Seconds between polls of the preemption notice.")
    requirements: list[str] = Field(default_factory=list, description="pip specs the function needs.")
    files: list[str] = Field(default_factory=list, description="Local files or folders to ship.")
    ship_modules: list[str] = Field(default_factory=list, description="Modules pickled by value.")
    price_spot: float | None = Field(None, ge=0, description="Override the spot $/h of the price table.")
    price_on_demand: float | None = Field(None, ge=0, description="Override the on-demand $/h.")

    # --- local spot market -------------------------------------------------------------
    local_mttp: Duration | None = Field(None, description="Mean time to preemption (exponential); "
                                                          "None = no random preemptions.")
    local_grace: Duration | None = Field(None, description="Notice lead time before the kill "
                                                           "(default: 120 s aws, 30 s azure/gcp).")
    local_alloc_delay: Range = Field((0.3, 0.8), description="Allocation delay, seconds or [low, high).")
    local_capacity_failure: float = Field(0.0, ge=0, lt=1, description="Chance an allocation fails "
                                                                       "for lack of capacity.")
    local_schedule: list[Any] | None = Field(None, description="Deterministic preemptions, one per "
                                             "instance: lifetimes in seconds, or {'step': N, 'phase': "
                                             "'step'|'save'|'upload'|'commit'|'restore', 'notice': bool} (a kill when the "
                                             "instance reaches that step and phase; with notice, the "
                                             "notice then and the kill local_grace later).")
    local_trace: str | None = Field(None, description="Replay a trace file (bamboo / parcae format) "
                                                      "or a bundled trace name.")
    local_notice_format: Literal["aws", "azure", "gcp"] = Field("aws", description="Which cloud's "
                                                                "metadata protocol the emulator speaks.")
    local_upload_bps: float | None = Field(None, gt=0, description="Emulated upload bandwidth, bytes/s.")
    local_seed: int | None = Field(None, description="Seed of the local market's random draws.")

    # --- clouds (used by their providers) -------------------------------------------------
    # `region` / `regions` name an AWS region or availability zone ("us-east-1", "us-east-1b"),
    # an Azure location ("eastus") or a GCP zone ("us-central1-a"). Credentials never go here:
    # each SDK's standard chain finds them (see notebooks/03-clouds.ipynb).
    aws_image_id: str | None = Field(None, description="AMI id or 'resolve:ssm:/path' (default: "
                                     "the latest Deep Learning OSS Nvidia Driver AMI, PyTorch).")
    aws_key_name: str | None = Field(None, description="EC2 key pair (none: no SSH key at all).")
    aws_instance_profile: str | None = Field(None, description="IAM instance profile the VM uses "
                                             "to reach the store (default: spotnb creates one "
                                             "limited to the store's bucket).")
    aws_subnet_id: str | None = Field(None, description="Subnet (default: the default VPC).")
    aws_max_price: float | None = Field(None, gt=0, description="Spot max $/h (default: on-demand).")
    aws_security_group_ids: list[str] | None = Field(None, description="Security groups (default: "
                                                     "spotnb-no-inbound, created with no inbound rule).")
    aws_disk_gb: int | None = Field(None, ge=8, description="Root volume size (default: the AMI's).")
    azure_subscription_id: str | None = Field(None, description="Default: $AZURE_SUBSCRIPTION_ID.")
    azure_resource_group: str | None = Field(None, description="Resource group for the VMs.")
    azure_image: str | None = Field(None, description="'publisher:offer:sku:version' or an image "
                                    "resource id (default: Microsoft's Ubuntu HPC image with GPU drivers).")
    azure_eviction_policy: Literal["Deallocate", "Delete"] = "Delete"
    azure_max_price: float = -1.0
    azure_subnet_id: str | None = Field(None, description="Subnet resource id for the VM's NIC.")
    azure_identity_id: str | None = Field(None, description="User-assigned managed identity the VM "
                                          "reaches the store with (Storage Blob Data Contributor).")
    azure_storage_account: str | None = Field(None, description="Storage account of an az:// store "
                                              "(default: $AZURE_STORAGE_ACCOUNT_NAME).")
    azure_ssh_public_key: str | None = Field(None, description="Admin SSH public key (default: a "
                                             "throwaway key whose private half is never kept).")
    azure_disk_gb: int | None = Field(None, ge=30, description="OS disk size (default: the image's).")
    gcp_project: str | None = Field(None, description="Default: the credentials' project.")
    gcp_image: str | None = Field(None, description="Image URL (default: the Deep Learning VM "
                                  "PyTorch image family with CUDA).")
    gcp_service_account: str | None = Field(None, description="Service account email the VM "
                                            "reaches the store with (default: the project's default).")
    gcp_network: str | None = Field(None, description="Network URL (default: global/networks/default).")
    gcp_subnetwork: str | None = Field(None, description="Subnetwork URL (default: the network's).")
    gcp_accelerator_type: str | None = Field(None, description="GPU type for N1 machine types, "
                                             "e.g. nvidia-tesla-t4 (A2/A3/G2 types include theirs).")
    gcp_accelerator_count: int = Field(1, ge=1, description="GPUs of gcp_accelerator_type.")
    gcp_disk_gb: int = Field(100, ge=10, description="Boot disk size.")

    def __init__(self, **data: Any) -> None:
        unknown = [k for k in data if k not in type(self).model_fields]
        if unknown:
            raise ConfigError(_unknown_message(unknown))
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(_validation_message(exc)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in type(self).model_fields:
            raise ConfigError(_unknown_message([name]))
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise ConfigError(_validation_message(exc)) from None

    @field_validator("heartbeat_timeout", "notice_poll", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float:
        return parse_duration(v)

    @field_validator("max_wait", mode="before")
    @classmethod
    def _optional_duration(cls, v: Any) -> float | None:
        if v is None:
            return None
        d = parse_duration(v)
        if not math.isfinite(d):
            raise ValueError("must be a finite duration such as '30m' (or None to keep asking)")
        return d

    @field_validator("heartbeat_timeout")
    @classmethod
    def _heartbeat(cls, v: float) -> float:
        if v < 2.0:
            raise ValueError(f"{v:g} s is too short: instances report every few seconds; use >= 2 s "
                             "(a minute is usual for clouds)")
        return _bounded(v, 2.0, _DAY, "a dead instance would be noticed only after that long, "
                        "and paid for meanwhile (a minute is usual for clouds)")

    @field_validator("notice_poll")
    @classmethod
    def _poll(cls, v: float) -> float:
        if v < 0.01:
            raise ValueError(f"{v:g} s would poll the metadata endpoint in a busy loop; use >= 0.01 s "
                             "(AWS suggests 5 s, Azure 1 s)")
        return _bounded(v, 0.01, 60.0, "a notice gives 30 s to 2 min of warning, and a poll this "
                        "rare would miss it (AWS suggests 5 s, Azure 1 s)")

    @field_validator("save_every", "keep_last", "max_preemptions", "max_retries",
                     "max_stalled_relaunches", "local_seed", "aws_disk_gb", "azure_disk_gb",
                     "gcp_accelerator_count", "gcp_disk_gb", mode="before")
    @classmethod
    def _no_bool(cls, v: Any) -> Any:
        """A bool where a count belongs is a slip (True would silently mean 1): refuse it."""
        if isinstance(v, bool):
            raise ValueError(f"got {v!r}; give a whole number")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if len(v) > MAX_NAME:
            raise ValueError(f"{len(v)} characters is too long a label; use at most {MAX_NAME}")
        # Cc: C0/C1 controls (U+009B is an 8-bit terminal escape), Cf: format characters
        # (bidi overrides reverse what a terminal shows), Zl/Zp: line/paragraph separators
        bad = sorted({repr(c) for c in v if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")})
        if bad:
            raise ValueError(f"contains control characters or format marks ({', '.join(bad)}), which "
                             "would garble or disguise lists, logs and cloud tags; use printable text")
        return v

    @field_validator("requirements")
    @classmethod
    def _requirements(cls, v: list[str]) -> list[str]:
        for i, spec in enumerate(v):
            if _has_userinfo(spec):
                raise ValueError(f"[{i}] carries credentials in its URL; they would be written to the "
                                 "job spec and the instance's boot script. Use a private index "
                                 "configured on the image, or a token from the instance's environment")
        return v

    @field_validator("local_mttp", "local_grace", mode="before")
    @classmethod
    def _opt_duration(cls, v: Any) -> float | None:
        return None if v is None else parse_duration(v)

    @field_validator("local_mttp")
    @classmethod
    def _mttp(cls, v: float | None) -> float | None:
        if v is None:
            return v
        if v <= 0:
            raise ValueError("local_mttp must be positive (or None for no random preemptions)")
        return _bounded(v, 0.0, 30 * _DAY, "use None for no random preemptions")

    @field_validator("local_grace")
    @classmethod
    def _local_grace(cls, v: float | None) -> float | None:
        return None if v is None else _bounded(v, 0.0, 3600.0, "clouds give 30 s to 2 min of notice")

    @field_validator("local_alloc_delay", mode="before")
    @classmethod
    def _alloc(cls, v: Any) -> Range:
        lo, hi = _range(v, "local_alloc_delay")
        _bounded(hi, 0.0, 3600.0, "every launch of the local market would wait that long")
        return lo, hi

    @field_validator("local_schedule", mode="before")
    @classmethod
    def _schedule(cls, v: Any) -> list[Any] | None:
        if v is None:
            return None
        if not isinstance(v, (list, tuple)):
            raise ValueError("give a list: lifetimes in seconds ('2m') or {'step': N, 'phase': ...}")
        out: list[Any] = []
        for item in v:
            if isinstance(item, dict):
                bad = set(item) - {"step", "phase", "after", "notice"}
                if bad:
                    raise ValueError(f"schedule entry keys are step, phase, notice, after; got {sorted(bad)}")
                if "step" in item:
                    if not _is_int(item["step"]) or item["step"] < 0:
                        raise ValueError(f"schedule 'step' must be a non-negative int, got {item['step']!r}")
                    phase = item.get("phase", "step")
                    if phase not in ("step", "save", "upload", "commit", "restore"):
                        raise ValueError("schedule 'phase' is one of step, save, upload, commit, "
                                         f"restore; got {phase!r}")
                    out.append({"step": item["step"], "phase": phase,
                                "notice": bool(item.get("notice", False))})
                elif "after" in item:
                    out.append({"after": _lifetime(item["after"])})
                else:
                    raise ValueError("a schedule entry needs 'step' or 'after'")
            else:
                out.append({"after": _lifetime(item)})
        return out

    @field_validator("provider")
    @classmethod
    def _provider(cls, v: str) -> str:
        from spotnb.providers import registry
        if v not in registry():
            raise ValueError(f"unknown provider {v!r}; choose one of {sorted(registry())}")
        return v

    @field_validator("store")
    @classmethod
    def _store(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("store URL is empty; give e.g. 'file:///data/spot' or 's3://bucket/prefix'")
        if v is not None and _has_userinfo(v):
            raise ValueError("the store URL carries credentials; they would travel in the job spec. "
                             "Give the bucket only and let the SDK's credential chain sign requests")
        if v is not None:
            _check_store(v.strip())
        return v

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint(cls, v: Any) -> Any:
        from spotnb.policy import resolve_policy
        resolve_policy(v)  # raises ValueError with the valid names
        return v

    @model_validator(mode="after")
    def _provider_fields(self) -> "Config":
        own = f"{self.provider}_"
        for prefix in PROVIDER_PREFIXES:
            if prefix == own:
                continue
            for name in self.model_fields_set:
                if name.startswith(prefix):
                    raise ValueError(f"{name} applies to provider={prefix[:-1]!r}, but provider is "
                                     f"{self.provider!r}: remove it or set provider={prefix[:-1]!r}")
        if self.region is not None and self.regions is not None:
            raise ValueError("give region (one) or regions (candidates), not both")
        if self.provider == "local" and (self.price_spot is None or self.price_on_demand is None):
            from spotnb.prices import lookup_price
            if lookup_price(self.instance_type) is None:
                raise ValueError(f"instance_type {self.instance_type!r} is not in the price table, so "
                                 "the local market cannot price it: pick a listed type (e.g. "
                                 "'g4dn.xlarge') or give price_spot and price_on_demand")
        return self

    # -- derived ---------------------------------------------------------------------------
    def store_url(self) -> str:
        return self.store or (spotnb_home() / "store").as_uri()

    def grace(self) -> float:
        """Notice lead time of the chosen market (the local market mimics its notice format)."""
        if self.provider == "local" and self.local_grace is not None:
            return self.local_grace
        fmt = self.local_notice_format if self.provider == "local" else self.provider
        return {"aws": 120.0, "azure": 30.0, "gcp": 30.0}[fmt]

    def candidate_regions(self) -> list[str] | Literal["cheapest"]:
        if self.regions is not None:
            return self.regions
        return [self.region] if self.region else []


def _lifetime(value: Any) -> float:
    return _bounded(parse_duration(value), 0.0, 30 * _DAY, "a scheduled lifetime is at most 30 days")


def _check_store(url: str) -> None:
    """Refuse a store spotnb could not write, or one whose place depends on the working
    directory (the controller, the instances and a later notebook would each find another)."""
    import fsspec
    from fsspec.core import split_protocol
    from fsspec.registry import known_implementations

    protocol, rest = split_protocol(url)
    if protocol is None:
        if not os.path.isabs(os.path.expanduser(url)):
            raise ValueError(f"{url!r} is a relative path; give an absolute one such as "
                             f"{os.path.abspath(url)!r} (or file://{os.path.abspath(url)})")
        return
    protocol = protocol.lower()
    if protocol in _READ_ONLY:
        raise ValueError(f"{protocol}:// stores can only be read, and every instance writes "
                         "its events and checkpoints there; use an object store (s3://, gs://, "
                         "az://) or a shared path (file:///...)")
    if protocol not in known_implementations and protocol not in fsspec.registry:
        raise ValueError(f"{protocol}:// is not a filesystem fsspec knows; use file:///..., "
                         "s3://bucket/prefix, gs://bucket/prefix or az://container/prefix")
    if protocol in ("file", "local") and not rest.startswith("/"):
        raise ValueError(f"{url!r} is relative (file://{rest.split('/')[0]} names a host, not a "
                         f"folder); write an absolute path with three slashes: "
                         f"file://{os.path.abspath(rest)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _has_userinfo(text: str) -> bool:
    """True for a URL with `user:secret@host` in it (anywhere in a pip spec)."""
    return bool(re.search(r"[a-z][a-z0-9+.-]*://[^/\s@]+@", text, re.I))


def _unknown_message(unknown: list[str]) -> str:
    valid = sorted(Config.model_fields)
    lines = []
    for name in unknown:
        close = difflib.get_close_matches(name, valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        lines.append(f"unknown Config field {name!r}{hint}")
    return "; ".join(lines) + ". Valid fields: " + ", ".join(valid)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        desc = Config.model_fields.get(str(err["loc"][0])).description if err["loc"] else None
        parts.append((f"Config.{loc}: " if loc else "Config: ") + msg + (f" ({desc})" if desc else ""))
    return "; ".join(parts)


