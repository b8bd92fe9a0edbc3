"""`spot.Config`: everything a job needs to know, validated before any instance is launched.

Generic fields apply to every provider; fields prefixed with a provider name (`local_*`,
`aws_*`, `azure_*`, `gcp_*`, or a third-party provider's) apply to that provider only
(submitit's convention). Each provider owns its fields: they are declared by its settings
model (`spotnb/settings/<name>.py`) and `Config` is composed from the settings of
every registered provider (`spotnb.settings.registry`), so adding a provider edits nothing
here. An unknown field, or a field of another provider, is a `ConfigError` that names it and
lists the valid ones.
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
import re
import unicodedata
import warnings
from typing import Any, Literal, cast, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from spotnb.core.durations import DAY, Duration, bounded, parse_duration
from spotnb.core.home import spotnb_home
from spotnb.core.sizes import parse_size
from spotnb.errors import ConfigError, ProviderUnavailable
from spotnb.settings.any import ANY_CLOUDS, AnySettings
from spotnb.settings.aws import AWSSettings
from spotnb.settings.azure import AzureSettings
from spotnb.settings.base import COORDINATOR_IDLE_MINUTES, LIGHTHOUSE_PORT
from spotnb.settings.gcp import GCPSettings
from spotnb.settings.local import LocalSettings
from spotnb.settings.registry import provider_info, registry

__all__ = ["Config", "parse_duration", "spotnb_home", "provider_prefixes"]

#: Longest job name: it is shown in lists and widgets and becomes part of cloud resource tags.
MAX_NAME = 200
#: Least `snapshot_memory` (bytes): below it the chunks are too small to be worth their pauses.
MIN_SNAPSHOT_MEMORY = 1_000_000
#: Most instances one job may train on (a typo such as 1000 would launch a fleet).
MAX_INSTANCES = 64
#: Most processes on one instance where its GPUs are unknown (a cloud type not in
#: `spotnb.market.gpus`); the local market's limit is the machine's (`spotnb.market.gpus.local_capacity`).
MAX_PROCS = 256
#: Largest count a field takes: past 2**53 a number is not exact in JSON (the job spec) for most
#: readers, and no job needs that many of anything.
MAX_COUNT = 2**53
#: The whole-number fields: strict (an int or a numpy integer; not True, 3.0 or "3").
COUNTS = (
    "save_every",
    "keep_last",
    "max_preemptions",
    "max_retries",
    "max_crashes",
    "max_stalled_relaunches",
    "instances",
    "min_instances",
    "procs_per_instance",
    "coordinator_port",
    "coordinator_idle_minutes",
)
#: Longest region or zone name taken (the clouds' are under 30 characters).
MAX_REGION = 100
#: Fields renamed when the coordinator came to every cloud (old name → new one): the old names
#: are still accepted, with a DeprecationWarning, so existing notebooks and saved specs go on.
RENAMED = {
    "aws_coordinator_instance_type": "coordinator_instance_type",
    "aws_coordinator_price": "coordinator_price",
    "aws_coordinator_port": "coordinator_port",
    "aws_coordinator_idle_minutes": "coordinator_idle_minutes",
}
#: fsspec protocols that can only read (a store is written by every instance and the controller).
_READ_ONLY = {"http", "https", "github", "git", "zip", "tar", "libarchive", "reference", "data"}


def provider_prefixes() -> tuple[str, ...]:
    """The field prefixes of every registered provider ("local_", "aws_", …)."""
    return tuple(f"{name}_" for name in registry())


#: `Config.instance_type` when none is given, by provider: one small GPU of that cloud
DEFAULT_INSTANCE_TYPES = {"gcp": "g2-standard-4", "azure": "Standard_NC4as_T4_v3"}


class _GenericConfig(BaseModel):
    """What to run where. Durations take seconds or strings such as "90s", "2m", "3h"."""

    model_config = ConfigDict(
        extra="forbid", arbitrary_types_allowed=True, validate_assignment=True, frozen=False
    )

    # --- generic -----------------------------------------------------------------------
    name: str | None = Field(None, description="A label for the job (shown in lists and widgets).")
    provider: str = Field(
        "local",
        description="Where instances run: local, aws, azure, gcp, or any (the cheapest zone of the "
        "clouds you have credentials for).",
    )
    instance_type: str | dict[str, str] = Field(
        "g4dn.xlarge",
        description="Cloud instance type; also prices the ledger. Default: one NVIDIA T4 or L4 on "
        "the provider's cloud (g4dn.xlarge; gcp: g2-standard-4; azure: Standard_NC4as_T4_v3). "
        "With provider='any', one per cloud: {'aws': 'g5.xlarge', 'azure': "
        "'Standard_NC4as_T4_v3', 'gcp': 'g2-standard-4'}.",
    )
    region: str | None = Field(None, description="One region (or zone) to launch in.")
    regions: list[str] | Literal["cheapest"] | None = Field(
        None,
        description="Candidate regions in order (at least one, each once, no spaces around a name), or "
        "'cheapest' to rank them by the expected cost of the remaining work.",
    )
    migrate: Literal["never", "on-interrupt", "best-price", "billing-aware"] = Field(
        "on-interrupt",
        description="Where a job goes next: 'on-interrupt' relaunches a preempted job in the zone "
        "that is best then; 'never' relaunches it where it ran; 'best-price' also moves a running "
        "job when another zone's expected saving over the remaining work exceeds the cost of the move; "
        "'billing-aware' makes best-price's moves so that the old instance leaves just before the end "
        "of its billing increment (the same as best-price on a per-second market).",
    )
    store: str | None = Field(
        None, description="fsspec URL for specs, events and checkpoints (default file://$SPOTNB_HOME/store)."
    )
    regional_stores: dict[str, str] | None = Field(
        None,
        description="Checkpoint stores near zones, {region or zone: fsspec URL} (s3://, gs://, "
        "az://, file://): a relaunch or move there copies the newest checkpoint into it, or "
        "reads it across, whichever is expected to cost less (spotnb.market.regional). The home store "
        "keeps events, spec and result. Same credentials as the home store.",
    )
    checkpoint: Any = Field(
        "hedged",
        description="Checkpoint policy: a name (hedged, adaptive, "
        "static:N, young, daly, daly2) or a Policy object.",
    )
    save_every: int | None = Field(None, ge=1, description="User periodic save every N steps.")
    keep_last: int = Field(
        2, ge=1, description="Periodic checkpoints kept (plus the newest two of any kind)."
    )
    snapshot_memory: int | None = Field(
        None,
        description="Most host RAM a checkpoint's snapshot may hold: bytes or '512MB', '2GiB' "
        "(None: what the instance has free at each save, minus 10 % of its RAM, at least 256 MB). "
        "A larger state is copied and written in chunks; the step waits until the last is copied.",
    )
    max_preemptions: int | None = Field(None, ge=0, description="Stop after this many preemptions.")
    max_retries: int = Field(0, ge=0, description="Relaunches after a user error (default 0).")
    max_crashes: int = Field(
        3,
        ge=0,
        description="Replicas of a job on several instances that may die without an error (the "
        "OOM killer, a segfault) before the job fails; each is replaced and heals from a peer.",
    )
    max_cost: float | None = Field(
        None,
        gt=0,
        description="Stop when the job's spend reaches this ($): its spot instances, plus the "
        "on-demand coordinator of a job on several instances on a cloud.",
    )
    max_wait: Duration | None = Field(
        3600.0,
        gt=0,
        description="Stop when no spot capacity was found for this long (default 1 h; the error names "
        "each region tried and what it said; None: keep asking). A quota is not waited out: the job "
        "fails at once, naming it.",
    )
    max_stalled_relaunches: int | None = Field(
        8,
        ge=1,
        description="Stop after this many instances "
        "in a row ended without committing a checkpoint "
        "(no net progress); None: never.",
    )
    heartbeat_timeout: Duration = Field(60.0, description="Silence after which an instance counts as dead.")
    notice_poll: Duration = Field(1.0, description="Seconds between polls of the preemption notice.")
    requirements: list[str] = Field(default_factory=list, description="pip specs the function needs.")
    spotnb_source: str = Field(
        "store",
        description="Where a cloud VM gets spotnb: 'store' (this notebook's own spotnb, shipped as "
        "a wheel through the store), 'index' (the release of this version on the package index) "
        "or a pip spec of spotnb, e.g. 'spotnb @ git+https://github.com/you/spotnb@main'.",
    )
    files: list[str] = Field(
        default_factory=list,
        description="Local files or folders to ship through the store (at most 1 GiB and 10,000 "
        "files in all), laid out relative to the job's working directory; links are followed.",
    )
    ship_modules: list[str] = Field(default_factory=list, description="Modules pickled by value.")
    price_spot: float | None = Field(
        None,
        ge=0,
        description="Override the spot $/h of the price table; the ledger bills it on every provider, "
        "and on the local market it is also the market's price.",
    )
    price_on_demand: float | None = Field(
        None, ge=0, description="Override the on-demand $/h of the price table (the baseline of the savings)."
    )
    # --- several instances (elastic data parallel on torchft; docs/dev/fleet.md "Several instances")
    instances: int = Field(
        1, ge=1, le=MAX_INSTANCES, description="Instances training together (data parallel)."
    )
    min_instances: int = Field(
        1, ge=1, description="Below this many live instances the survivors wait for a replacement."
    )
    procs_per_instance: int | None = Field(
        None,
        ge=1,
        description="Processes per instance (one replica group); default: its GPU count, 1 on CPU.",
    )
    # the on-demand coordinator of a job on several instances on a cloud (torchft's lighthouse)
    coordinator_instance_type: str | None = Field(
        None,
        min_length=1,
        description="On-demand instance/VM type of the coordinator of a job on several instances "
        "on a cloud (it only counts replicas); default: the cloud's small type (AWS t3.small, "
        "Azure Standard_B1ms, GCP e2-small).",
    )
    coordinator_price: float | None = Field(
        None,
        gt=0,
        description="On-demand $/h of the coordinator for the cost ledger (default: spotnb's "
        "figure for its type).",
    )
    coordinator_port: int = Field(
        LIGHTHOUSE_PORT,
        ge=1024,
        le=65535,
        description="Port of the coordinator's lighthouse (open to the job's instances only).",
    )
    coordinator_idle_minutes: int = Field(
        COORDINATOR_IDLE_MINUTES,
        ge=10,
        le=7 * 24 * 60,
        description="The coordinator powers itself off after this long without any replica "
        "connected (a guard against a leak if no controller is left to end it; 10 minutes to a "
        "week).",
    )
    controller: Literal["notebook", "cloud"] = Field(
        "notebook",
        description="Where the job's controller runs: 'notebook' (a process on this machine; the "
        "next notebook restarts it if it died) or 'cloud' (on the job's on-demand coordinator, so "
        "relaunches go on while this machine sleeps; the notebook only follows the store).",
    )
    controller_identity: str | None = Field(
        None,
        min_length=1,
        description="The identity a cloud controller runs as (AWS instance profile name, Azure "
        "user-assigned identity resource id, GCP service account email): it launches and ends the "
        "job's spot instances and reads and writes the store; no credential leaves this machine.",
    )
    sync: str = Field(
        "ddp",
        description="How replicas agree: 'ddp' (average gradients every step), 'local_sgd:K' "
        "(average weights every K steps), 'diloco:K' (outer Nesterov step every K steps) or "
        "'auto' (ddp while the all-reduce is cheap next to the step, local SGD when it is not).",
    )

    def __init__(self, **data: Any) -> None:
        data = _renamed(data)
        unknown = [k for k in data if k not in type(self).model_fields]
        if unknown:
            raise ConfigError(_unknown_message(unknown))
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(_validation_message(exc)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name in RENAMED:
            name = next(iter(_renamed({name: value})))
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

    @field_validator("snapshot_memory", mode="before")
    @classmethod
    def _snapshot_memory(cls, v: Any) -> int | None:
        if v is None:
            return None
        size = parse_size(v)
        if size < MIN_SNAPSHOT_MEMORY:
            raise ValueError(
                f"{v!r} is less than 1MB: a snapshot that small would copy the state in slivers, "
                "pausing the step far longer; give e.g. '512MB' (or None for what is free)"
            )
        return size

    @field_validator("heartbeat_timeout")
    @classmethod
    def _heartbeat(cls, v: float) -> float:
        if v < 2.0:
            raise ValueError(
                f"{v:g} s is too short: instances report every few seconds; use >= 2 s "
                "(a minute is usual for clouds)"
            )
        return bounded(
            v,
            2.0,
            DAY,
            "a dead instance would be noticed only after that long, "
            "and paid for meanwhile (a minute is usual for clouds)",
        )

    @field_validator("notice_poll")
    @classmethod
    def _poll(cls, v: float) -> float:
        if v < 0.01:
            raise ValueError(
                f"{v:g} s would poll the metadata endpoint in a busy loop; use >= 0.01 s "
                "(AWS suggests 5 s, Azure 1 s)"
            )
        return bounded(
            v,
            0.01,
            60.0,
            "a notice gives 30 s to 2 min of warning, and a poll this "
            "rare would miss it (AWS suggests 5 s, Azure 1 s)",
        )

    @field_validator("price_spot", "price_on_demand", "coordinator_price", mode="before")
    @classmethod
    def _price(cls, v: Any, info: ValidationInfo) -> Any:
        """A price is a finite $/h: inf (or "1e400", which is inf) would bill every second of a
        job at it and NaN make every cost NaN; a bool is a slip (True would mean $1/h)."""
        if v is None:
            return v
        least = "> 0" if info.field_name == "coordinator_price" else ">= 0"
        fix = f"give $/h, a finite number {least} (or None for spotnb's price)"
        if isinstance(v, bool):
            raise ValueError(f"got {v!r}; {fix}")
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"got {v!r}; {fix}") from None
        if not math.isfinite(x) or x < 0 or (x == 0 and least == "> 0"):
            raise ValueError(f"got {v!r}; {fix}")
        return x + 0.0  # -0.0 is 0: a price shown as "$-0.00/h" is a puzzle

    @field_validator(*COUNTS, mode="before")
    @classmethod
    def _whole(cls, v: Any, info: ValidationInfo) -> Any:
        """A count is a whole number, strictly (pydantic's lax mode took "3" and 3.0): True
        would silently mean 1, and a float or a string where a count belongs is a slip whose
        fix is one keystroke away, so the error writes it. numpy's integers are counts too."""
        name = str(info.field_name)
        if v is None:
            field = cls.model_fields[name]
            if type(None) in get_args(field.annotation):
                return v
            raise ValueError(f"got None; give a whole number (the default is {name}={field.default})")
        if isinstance(v, bool):
            raise ValueError(f"got {v!r}; give a whole number, e.g. {name}=2")
        if isinstance(v, numbers.Integral):
            v = int(v)
            if abs(v) > MAX_COUNT:
                raise ValueError(
                    f"got a number of {v.bit_length()} bits, past 2**53, which the job spec (JSON) "
                    "cannot carry exactly and no job needs; give a smaller whole number"
                )
            return v
        if isinstance(v, float) and v.is_integer() and abs(v) <= MAX_COUNT:
            raise ValueError(f"got {v!r}, a float; give a whole number: {name}={int(v)}")
        if isinstance(v, str):
            try:
                n = int(v.strip())
            except ValueError:
                raise ValueError(f"got the text {v!r}; give a whole number, e.g. {name}=2") from None
            raise ValueError(f"got the text {v!r}; give the number itself: {name}={n}")
        raise ValueError(f"got {v!r} ({type(v).__name__}); give a whole number, e.g. {name}=2")

    @field_validator("procs_per_instance")
    @classmethod
    def _procs(cls, v: int | None) -> int | None:
        if v is not None and v > MAX_PROCS:
            raise ValueError(
                f"{v} is more than {MAX_PROCS}, more processes than any instance runs (one per "
                "GPU, or per core on CPU); give its GPU count, or leave it None (the GPU count, "
                "1 on CPU)"
            )
        return v

    @field_validator("sync")
    @classmethod
    def _sync(cls, v: str) -> str:
        """One spelling per strategy, spotnb's own: the value is compared and shown as given,
        so " ddp" or "DDP" would be a strategy that is not ddp everywhere else."""
        from spotnb.core.sync import parse_sync

        try:
            canonical = str(parse_sync(v))
        except ValueError:
            try:
                canonical = str(parse_sync(v.strip().lower()))
            except ValueError:
                pass  # no spelling of a strategy: parse_sync's own words
            else:
                raise ValueError(f"got {v!r}; write it sync={canonical!r}") from None
            raise
        if v != canonical:
            raise ValueError(f"got {v!r}; write it sync={canonical!r}")
        return v

    @field_validator("region")
    @classmethod
    def _region(cls, v: str | None) -> str | None:
        problem = None if v is None else _region_problem(v)
        if problem:
            raise ValueError(f"{problem}, or None for the provider's default")
        return v

    @field_validator("regions", mode="before")
    @classmethod
    def _regions(cls, v: Any) -> Any:
        """A list of names, each once, or 'cheapest'; an empty list names nowhere to run."""
        if v is None or v == "cheapest":
            return v
        if isinstance(v, str):
            if v.strip().lower() == "cheapest":
                raise ValueError(f"got {v!r}; write it regions='cheapest'")
            raise ValueError(
                f"got the text {v!r}; give a list, regions=[{v!r}] (or one region as region={v!r}), "
                "or 'cheapest'"
            )
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"got {v!r}; give a list of regions, e.g. regions=['us-east-1', 'us-west-2']")
        if not v:
            raise ValueError(
                "the list is empty, so the job would have nowhere to run; give at least one region "
                "(e.g. regions=['us-east-1']), 'cheapest', or None for the provider's default"
            )
        for i, name in enumerate(v):
            problem = _region_problem(name)
            if problem:
                raise ValueError(f"[{i}]: {problem}")
        twice = next((r for i, r in enumerate(v) if r in v[:i]), None)
        if twice is not None:
            raise ValueError(f"names {twice!r} twice; give each region once, in the order to try them")
        return list(v)

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
            raise ValueError(
                f"contains control characters or format marks ({', '.join(bad)}), which "
                "would garble or disguise lists, logs and cloud tags; use printable text"
            )
        return v

    @field_validator("requirements")
    @classmethod
    def _requirements(cls, v: list[str]) -> list[str]:
        for i, spec in enumerate(v):
            if _has_userinfo(spec):
                raise ValueError(
                    f"[{i}] carries credentials in its URL; they would be written to the "
                    "job spec and the instance's boot script. Use a private index "
                    "configured on the image, or a token from the instance's environment"
                )
        return v

    @field_validator("spotnb_source")
    @classmethod
    def _spotnb_source(cls, v: str) -> str:
        problem = _source_problem(v)
        if problem:
            raise ValueError(f"{v!r} {problem}")
        v = v.strip()
        return v.lower() if v.lower() in ("store", "index") else v

    @field_validator("provider")
    @classmethod
    def _provider(cls, v: str) -> str:
        try:
            provider_info(v)
        except ProviderUnavailable as exc:
            raise ValueError(str(exc)) from None
        return v

    @field_validator("store")
    @classmethod
    def _store(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("store URL is empty; give e.g. 'file:///data/spot' or 's3://bucket/prefix'")
        if v is not None and _has_userinfo(v):
            raise ValueError(
                "the store URL carries credentials; they would travel in the job spec. "
                "Give the bucket only and let the SDK's credential chain sign requests"
            )
        if v is not None and "?" in v:
            raise ValueError(
                "the store URL carries a query (a SAS token?); it would travel in the job spec and "
                "events. Give the bucket only and let the SDK's credential chain sign requests"
            )
        if v is not None:
            _check_store(v.strip())
        return v

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint(cls, v: Any) -> Any:
        from spotnb.policy import resolve_policy

        resolve_policy(v)  # raises ValueError with the valid names
        return v

    @field_validator("instance_type")
    @classmethod
    def _instance_type(cls, v: str | dict[str, str]) -> str | dict[str, str]:
        if isinstance(v, dict):
            if not v:
                raise ValueError("the mapping is empty; give one type per cloud, e.g. {'aws': 'g5.xlarge'}")
            bad = [k for k, t in v.items() if not str(t).strip()]
            if bad:
                raise ValueError(f"no instance type given for {bad}; give e.g. {{'aws': 'g5.xlarge'}}")
        elif not v.strip():
            raise ValueError("empty; give a cloud instance type such as 'g4dn.xlarge'")
        return v

    @model_validator(mode="after")
    def _provider_fields(self) -> Any:
        if "instance_type" not in self.model_fields_set and self.provider in DEFAULT_INSTANCE_TYPES:
            # each cloud's own one-GPU type: AWS's name would pass validate() on GCP and Azure and
            # fail only at the first insert, in every zone. Set in place (validate_assignment
            # would run this validator again) and still not in model_fields_set: a default
            self.__dict__["instance_type"] = DEFAULT_INSTANCE_TYPES[self.provider]
        own = f"{self.provider}_"
        if isinstance(self.instance_type, dict) and self.provider != "any":
            raise ValueError(
                f"instance_type: a mapping per cloud applies to provider='any', but provider is "
                f"{self.provider!r}; give one type (e.g. instance_type="
                f"{next(iter(self.instance_type.values()))!r}) or set provider='any'"
            )
        for prefix in provider_prefixes():
            if prefix == own or (self.provider == "any" and prefix[:-1] in ANY_CLOUDS):
                continue  # provider='any' launches on the clouds: their fields apply
            for name in self.model_fields_set:
                if name.startswith(prefix):
                    raise ValueError(
                        f"{name} applies to provider={prefix[:-1]!r}, but provider is "
                        f"{self.provider!r}: remove it or set provider={prefix[:-1]!r}"
                    )
        self._check_instances()
        if self.region is not None and self.regions is not None:
            raise ValueError("give region (one) or regions (candidates), not both")
        self._check_migrate()
        self._check_controller()
        if self.regional_stores is not None:
            from spotnb.market.regional import check_config

            check_config(cast("Config", self), lambda url: self._store(url))
        # the validator runs on a Config (the only model built from _GenericConfig)
        registry()[self.provider].settings.check_config(cast("Config", self))
        return self

    def _check_instances(self) -> None:
        if self.min_instances > self.instances:
            raise ValueError(
                f"min_instances={self.min_instances} is more than instances={self.instances}: "
                f"the job could never train; lower min_instances or raise instances"
            )
        self._check_procs()
        if self.instances == 1:
            if self.sync != "ddp":
                raise ValueError(
                    "sync applies to jobs on several instances; set instances=N (N > 1) or remove sync"
                )
            return
        from importlib.util import find_spec

        if find_spec("torchft") is None:
            raise ValueError(
                f"instances={self.instances} trains with torchft, which is not installed here: "
                "pip install 'spotnb[elastic]' (or instances=1)"
            )

    def _check_procs(self) -> None:
        """`procs_per_instance`: one replica group of that many processes per instance (DDP
        inside it; `spotnb.runtime.group.local`)."""
        procs = self.procs_per_instance
        if procs is None or procs == 1:
            return
        if self.sync != "ddp":
            raise ValueError(
                f"procs_per_instance={procs} trains with sync='ddp' only (every process of the "
                f"group steps together); sync={self.sync!r} is for one process per instance: "
                "set sync='ddp' or procs_per_instance=1"
            )
        if self.provider == "local":
            return  # CPU processes (or this machine's GPUs): checked against it at submit
        from spotnb.market.gpus import gpu_count

        types = self.instance_type.values() if isinstance(self.instance_type, dict) else [self.instance_type]
        for kind in types:
            gpus = gpu_count(str(kind))
            if gpus and procs > gpus:
                raise ValueError(
                    f"procs_per_instance={procs} is more than the {gpus} GPU"
                    f"{'s' if gpus > 1 else ''} of instance_type={kind!r}: one process drives one "
                    f"GPU; set procs_per_instance={gpus} (or leave it None: the GPU count)"
                )

    def _check_controller(self) -> None:
        if self.controller != "cloud" or self.provider == "local":
            return  # the local market hosts a cloud controller itself: nothing to name
        if self.provider == "any":
            raise ValueError(
                "controller='cloud' runs the controller on the job's coordinator, which lives on "
                "one cloud; with provider='any' keep controller='notebook', or pick the cloud"
            )
        if not self.controller_identity:
            example = {
                "aws": "an instance profile name, e.g. 'spotnb-controller'",
                "azure": "a user-assigned identity's resource id",
                "gcp": "a service account email",
            }.get(self.provider, "the identity the controller runs as")
            raise ValueError(
                "controller='cloud' runs the controller on the job's coordinator, which needs its "
                "own cloud identity to launch instances and reach the store (spotnb never ships "
                f"credentials): set controller_identity to {example}, or controller='notebook'"
            )
        bad = _identity_shape(self.provider, self.controller_identity)
        if bad:
            raise ValueError(f"controller_identity: {self.controller_identity!r} {bad}")

    def _check_migrate(self) -> None:
        if self.migrate not in ("best-price", "billing-aware"):
            return
        if not (
            self.regions == "cheapest" or (isinstance(self.regions, list) and len(set(self.regions)) > 1)
        ):
            raise ValueError(
                f"migrate={self.migrate!r} moves a running job to a cheaper zone, but there is only one "
                "zone to run in: set regions='cheapest' or regions=[...] with several zones, or "
                "migrate='on-interrupt'"
            )
        zones = getattr(self, "local_regions", None) or {"local": None}
        if self.provider == "local" and self.regions == "cheapest" and len(zones) < 2:
            raise ValueError(
                f"migrate={self.migrate!r} moves a running job to a cheaper zone, but the local market "
                f"has only one zone ({', '.join(zones)}): define several with local_regions (e.g. "
                "local_regions={'zone-a': {'price': 0.10}, 'zone-b': {'price': 0.05}}), or use "
                "migrate='on-interrupt'"
            )

    @property
    def elastic(self) -> bool:
        """Whether the job trains on several instances at once."""
        return self.instances > 1

    # -- derived ---------------------------------------------------------------------------
    def instance_type_name(self) -> str:
        """The instance type as text (lists, events, the job DB): a mapping per cloud of
        provider='any' reads "aws:g5.xlarge, gcp:g2-standard-4"."""
        if isinstance(self.instance_type, dict):
            return ", ".join(f"{cloud}:{t}" for cloud, t in self.instance_type.items())
        return self.instance_type

    def store_url(self) -> str:
        """The store's URL; an az:// store carries azure_storage_account in it (adlfs reads the
        account from `az://container@account.blob.core.windows.net/…`), so every process that
        opens it by URL alone (the notebook's own store, a detached controller, the VM) finds
        the account."""
        from spotnb.core.store import with_azure_account

        url = self.store or (spotnb_home() / "store").as_uri()
        return with_azure_account(url, getattr(self, "azure_storage_account", None))

    def candidate_regions(self) -> list[str] | Literal["cheapest"]:
        if self.regions is not None:
            return self.regions
        return [self.region] if self.region else []


def _region_problem(name: Any) -> str | None:
    """Why `name` cannot be a region's or zone's name, with the fix (None: it can)."""
    if not isinstance(name, str):
        return f"got {name!r}; give a region's name such as 'us-east-1'"
    if not name.strip():
        return f"got {name!r}, an empty name; give a region's name such as 'us-east-1'"
    if name != name.strip():
        return f"got {name!r}, with spaces around it; write {name.strip()!r}"
    if len(name) > MAX_REGION or any(c.isspace() or not c.isprintable() for c in name):
        shown = f"{name[:40]!r}…" if len(name) > 40 else repr(name)
        return (
            f"got {shown}, which is no region's name (letters, digits, '-', '_' or '.', up to {MAX_REGION})"
        )
    return None


def _check_store(url: str) -> None:
    """Refuse a store spotnb could not write, or one whose place depends on the working
    directory (the controller, the instances and a later notebook would each find another)."""
    import fsspec
    from fsspec.core import split_protocol
    from fsspec.registry import known_implementations

    protocol, rest = split_protocol(url)
    if protocol is None:
        if not os.path.isabs(os.path.expanduser(url)):
            raise ValueError(
                f"{url!r} is a relative path; give an absolute one such as "
                f"{os.path.abspath(url)!r} (or file://{os.path.abspath(url)})"
            )
        return
    protocol = protocol.lower()
    if protocol in _READ_ONLY:
        raise ValueError(
            f"{protocol}:// stores can only be read, and every instance writes "
            "its events and checkpoints there; use an object store (s3://, gs://, "
            "az://) or a shared path (file:///...)"
        )
    if protocol not in known_implementations and protocol not in fsspec.registry:
        raise ValueError(
            f"{protocol}:// is not a filesystem fsspec knows; use file:///..., "
            "s3://bucket/prefix, gs://bucket/prefix or az://container/prefix"
        )
    if protocol in ("file", "local") and not rest.startswith("/"):
        raise ValueError(
            f"{url!r} is relative (file://{rest.split('/')[0]} names a host, not a "
            f"folder); write an absolute path with three slashes: "
            f"file://{os.path.abspath(rest)}"
        )


def _source_problem(value: str) -> str | None:
    """Why `value` is no Config.spotnb_source ("store", "index" or a pip spec naming spotnb), or None."""
    text = value.strip()
    if text.lower() in ("store", "index"):
        return None
    fix = (
        "give 'store' (this notebook's spotnb, through the store), 'index' (the published "
        "release) or a pip spec of spotnb such as 'spotnb==0.1.0' or "
        "'spotnb @ git+https://github.com/you/spotnb@main'"
    )
    if not text or "\n" in text or "\r" in text:
        return f"is not a single pip requirement; {fix}"
    if _has_userinfo(text):
        return (
            "carries credentials in its URL; they would be written to the job spec and every boot "
            "script. Use spotnb_source='store', or a public URL"
        )
    if text.startswith(("/", "./", "../", "~", "file:")) or re.match(r"^[A-Za-z]:\\", text):
        return f"is a path on this machine, which a cloud VM cannot see; {fix}"
    if re.match(r"^[a-z][a-z0-9+.-]*://", text, re.I):  # a URL of a wheel or an archive
        name = text.split("?", 1)[0].split("#", 1)[0].rsplit("/", 1)[-1]
        if re.match(r"^spotnb-[^/]+\.(whl|tar\.gz|zip)$", name):
            return None
        if text.lower().startswith(("git+", "hg+", "svn+", "bzr+")):
            return f"is a bare VCS URL; name the package: 'spotnb @ {text}'"
        return f"is a URL, but not of a spotnb wheel or archive (spotnb-<version>….whl); {fix}"
    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:  # no packaging here: the name is all that can be checked
        ok = re.match(r"^spotnb(\[[\w,\s-]*\])?\s*(@|[<>=!~]|$)", text)
        return None if ok else f"is not a pip requirement of spotnb; {fix}"
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        return f"is not a pip requirement ({str(exc).splitlines()[0]}); {fix}"
    if req.name.lower() != "spotnb":
        return f"names {req.name!r}, not spotnb; {fix} (the job's own packages go in requirements)"
    if req.marker is not None:
        return f"has an environment marker, which would leave some VMs without spotnb; {fix}"
    return None


def _has_userinfo(text: str) -> bool:
    """True for a URL with `user:secret@host` in it (anywhere in a pip spec)."""
    return bool(re.search(r"[a-z][a-z0-9+.-]*://[^/\s@]+@", text, re.I))


# What each cloud's launch API takes as the identity a hosted controller runs as.
_IDENTITY_SHAPES = {
    "aws": (r"[\w+=,.@-]{1,128}", "is not an instance profile name (letters, digits and +=,.@_-)"),
    "azure": (
        r"/subscriptions/[^/\s]+/resourceGroups/[^/\s]+/providers/Microsoft\.ManagedIdentity/"
        r"userAssignedIdentities/[^/\s]+",
        "is not a user-assigned identity's resource id (/subscriptions/…/resourceGroups/…/providers/"
        "Microsoft.ManagedIdentity/userAssignedIdentities/NAME)",
    ),
    "gcp": (
        r"[a-z0-9][\w.+-]*@([a-z0-9.-]+\.iam|developer|appspot)\.gserviceaccount\.com",
        "is not a service account email (NAME@PROJECT.iam.gserviceaccount.com)",
    ),
}


def _identity_shape(provider: str, identity: str | None) -> str | None:
    """Why `identity` cannot be `provider`'s controller identity (None: it can, or unchecked):
    caught here rather than as an opaque API error after the job was submitted."""
    shape = _IDENTITY_SHAPES.get(provider)
    if shape is None or identity is None or re.fullmatch(shape[0], identity, re.IGNORECASE):
        return None
    arn = re.fullmatch(r"arn:aws[\w-]*:iam::\d+:instance-profile/(?:.*/)?([^/]+)", identity)
    if provider == "aws" and arn:
        return f"is an ARN; give the instance profile's name {arn.group(1)!r}"
    return shape[1]


class Config(_GenericConfig, LocalSettings, AWSSettings, AzureSettings, GCPSettings, AnySettings):
    """What to run where. Durations take seconds or strings such as "90s", "2m", "3h".

    The generic fields, then each provider's (`local_*`, `aws_*`, `azure_*`, `gcp_*`, and those
    of providers registered by other packages): see `Config.model_fields` or `help(spot.Config)`.
    """

    def __repr_args__(self) -> Any:
        """Only what was set or differs from its default: the other ~60 fields (every other
        cloud's, all None) say nothing about this job. `model_dump()` has them all."""
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if name in self.model_fields_set or value != field.get_default(call_default_factory=True):
                yield name, value

    def __str__(self) -> str:
        return repr(self)


def _compose(base: type[Config]) -> type[Config]:
    """`Config` with the settings of providers other packages registered (their fields and
    validators), under the same name. Built-in providers are part of the class itself, so
    type checkers see their fields."""
    plugins: tuple[type, ...] = tuple(info.settings for info in registry().values() if not info.builtin)
    if not plugins:
        return base
    composed: type[BaseModel] = create_model(
        "Config", __base__=(base, *plugins), __module__=__name__, __doc__=base.__doc__
    )
    return cast("type[Config]", composed)


Config = _compose(Config)  # type: ignore[misc]


def _renamed(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the old names of renamed fields (`RENAMED`) replaced by the new ones."""
    old = [k for k in data if k in RENAMED]
    if not old:
        return data
    out = dict(data)
    for name in old:
        new = RENAMED[name]
        value = out.pop(name)
        if new in out and out[new] != value:
            raise ConfigError(f"Config.{name} is the old name of {new}; give only {new}")
        out[new] = value
        warnings.warn(
            f"Config.{name} is now Config.{new} (the coordinator runs on every cloud); "
            f"the old name still works for now",
            DeprecationWarning,
            stacklevel=3,
        )
    return out


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
        field = Config.model_fields.get(str(err["loc"][0])) if err["loc"] else None
        desc = field.description if field is not None else None
        parts.append((f"Config.{loc}: " if loc else "Config: ") + msg + (f" ({desc})" if desc else ""))
    return "; ".join(parts)
