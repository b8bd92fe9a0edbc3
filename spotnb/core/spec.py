"""`JobSpec`: what to run, as one versioned, signed JSON document (`jobs/<id>/spec.json`).

Why JSON and not a pickle: the controller and the instance must read the job's settings from
a store that others may be able to write; a pickled `Config` (the old `config.pkl`) ran code
when loaded. The spec holds the whole validated `Config` as JSON (`config`), the few values
the instance needs in typed form (`runtime`), and the manifest of shipped files (`files`).
A `Policy` object given as `checkpoint=` is code, so it travels in the signed function
payload (`fn.pkl`) and `config["checkpoint"]` is None.

Versioning: `spec_version` is bumped on any change a reader of the previous version would
misread; readers refuse versions they do not know (an instance older than the notebook says
so instead of guessing). A spec written before versioning (spec.json + config.pkl) is read by
`legacy_spec` from spec.json and the public config of the `submitted` event, never from
config.pkl.

The spec is signed (`signing.sign_doc`) over every field; `load_spec` verifies it when it has
the key. Shared by the notebook side and the runtime: imports neither (`to_config` imports
`spotnb.settings.config` when called, on the notebook side only).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from spotnb.core.signing import BadSignature, sign_doc, verify_doc
from spotnb.core.store import Store

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = [
    "SPEC_VERSION",
    "SPEC_NAME",
    "JobSpec",
    "RuntimeSettings",
    "ShippedFile",
    "ScriptSpec",
    "SpecError",
    "load_spec",
    "write_spec",
    "legacy_spec",
    "config_json",
]

SPEC_VERSION = 1
SPEC_NAME = "spec.json"


class SpecError(ValueError):
    """A spec that cannot be used: unknown version, bad shape, or a bad signature."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RuntimeSettings(_Model):
    """What the agent on the instance needs, derived from the Config at submit."""

    policy: str | None = Field(None, description="Policy name, or None: the Policy object is in fn.pkl.")
    save_every: int | None = None
    keep_last: int = 2
    snapshot_memory: int | None = None  # bytes; None: what the instance has free
    notice_poll: float = 1.0
    flush_interval: float = 0.5
    heartbeat_interval: float = 5.0
    instances: int = 1
    min_instances: int = 1
    sync: str = "ddp"
    procs_per_instance: int | None = None  # None: the instance's GPU count, 1 on CPU


class ShippedFile(_Model):
    """One file of `Config.files`: where it goes, relative to the job's working directory on
    the instance, and its content (stored once at `files/<sha256>` in the store)."""

    path: str
    sha256: str
    size: int
    mode: int = 0o644


class ScriptSpec(_Model):
    """A job that runs a script (`spot.run`) instead of a function: the script's path relative
    to the job's working directory on the instance (it is one of the shipped `files`) and its
    command-line arguments, `sys.argv[1:]`."""

    path: str
    args: list[str] = []


class JobSpec(_Model):
    """Everything the controller and the instance read about a job, as data."""

    spec_version: int = SPEC_VERSION
    job_id: str
    name: str | None = None
    created: float
    spotnb_version: str
    cwd: str = Field(description="The notebook's working directory at submit.")
    config: dict[str, Any] = Field(description="The validated Config's fields as set (JSON).")
    runtime: RuntimeSettings = RuntimeSettings()
    files: list[ShippedFile] = []
    script: ScriptSpec | None = Field(None, description="Set for `spot.run` jobs: the script to run.")
    legacy: bool = Field(False, description="Rebuilt from a pre-versioning spec.json: unsigned.")

    @property
    def provider(self) -> str:
        return str(self.config.get("provider", "local"))

    def to_config(self) -> Config:
        """The job's Config (notebook side), validated again. Other providers' fields (all at
        their defaults, since a Config refuses them when set) are left out so that validation
        passes; a field this spotnb does not know is refused with the usual clear error. A
        Policy object that was given is not here (it is code, in fn.pkl): the controller then
        uses the default policy for its own decisions (pre-allocation)."""
        from spotnb.settings.config import RENAMED, Config, provider_prefixes

        own: tuple[str, ...] = (f"{self.provider}_",)
        if self.provider == "any":  # it launches on the clouds: their fields are its own
            from spotnb.settings.any import ANY_CLOUDS

            own += tuple(f"{cloud}_" for cloud in ANY_CLOUDS)
        # a spec written before a rename holds the old names: the job goes on, without a warning
        # about a name its user may never have written (the old spec dumps every field)
        renamed = {RENAMED.get(k, k): v for k, v in self.config.items()}
        fields = {
            k: v
            for k, v in renamed.items()
            if not (k.startswith(provider_prefixes()) and not k.startswith(own))
            and not (k == "checkpoint" and v is None)
        }
        return Config(**fields)

    def to_doc(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def config_json(config: Config) -> dict[str, Any]:
    """The whole validated Config as JSON. A Policy object for `checkpoint` is code: it stays in
    the signed function payload and `checkpoint` is None here."""
    data = config.model_dump(mode="json", exclude={"checkpoint"})
    data["checkpoint"] = config.checkpoint if isinstance(config.checkpoint, str) else None
    return data


def write_spec(store: Store, spec: JobSpec, key: bytes) -> None:
    doc = sign_doc(key, spec.job_id, SPEC_NAME, spec.to_doc())
    store.write_bytes(store.job(spec.job_id, SPEC_NAME), json.dumps(doc, indent=1).encode())


def load_spec(store: Store, job_id: str, key: bytes | None, *, verify: bool = True) -> JobSpec:
    """The job's spec. With `verify` (the default) a signed spec must verify with `key`, and
    an unsigned one is refused unless it is a pre-versioning spec (then rebuilt by
    `legacy_spec`, flagged `legacy`: only JSON is read, nothing is unpickled)."""
    try:
        doc = json.loads(store.read_bytes(store.job(job_id, SPEC_NAME)))
    except ValueError as exc:
        raise SpecError(f"job {job_id}: {SPEC_NAME} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise SpecError(f"job {job_id}: {SPEC_NAME} is not a JSON object")
    if "spec_version" not in doc:
        if verify and key is not None:  # this machine signed it: an unsigned one is a forgery
            raise SpecError(
                f"job {job_id}: {SPEC_NAME} is not signed, but this job has a key: it "
                "was replaced in the store"
            )
        return legacy_spec(store, job_id, doc)
    if verify:
        try:
            doc = verify_doc(key, job_id, SPEC_NAME, doc)
        except BadSignature as exc:
            raise SpecError(str(exc)) from None
    else:
        doc = {k: v for k, v in doc.items() if k != "signature"}
    version = doc.get("spec_version")
    if version != SPEC_VERSION:
        raise SpecError(
            f"job {job_id}: spec_version {version!r} is not one this spotnb reads "
            f"({SPEC_VERSION}); use the spotnb version that submitted the job"
        )
    try:
        return JobSpec.model_validate(doc)
    except ValueError as exc:
        raise SpecError(f"job {job_id}: {SPEC_NAME} is malformed: {exc}") from None


def legacy_spec(store: Store, job_id: str, old: dict[str, Any]) -> JobSpec:
    """A JobSpec for a job submitted before specs were versioned (spec.json read with
    defaults, plus config.pkl). The Config comes from the `submitted` event's public config
    (JSON, the whole Config as the spec holds it now), never from config.pkl. A Policy object
    (shown there by its repr) becomes the default policy."""
    from spotnb.core.events import read_all

    submitted = next((e for e in read_all(store, job_id) if e.kind == "submitted"), None)
    config = dict((submitted.get("config") if submitted is not None else None) or {})
    if config.get("checkpoint") != old.get("policy"):
        config["checkpoint"] = None  # the repr of a Policy object, not a name
    for name in ("provider", "instance_type", "name"):
        if old.get(name) is not None:
            config.setdefault(name, old[name])
    return JobSpec(
        job_id=job_id,
        name=old.get("name"),
        created=float(old.get("created") or 0.0),
        spotnb_version=str(old.get("spotnb_version") or ""),
        cwd=str(old.get("cwd") or ""),
        config=config,
        legacy=True,
        runtime=RuntimeSettings(
            policy=old.get("policy"),
            save_every=old.get("save_every"),
            keep_last=int(old.get("keep_last") or 2),
            notice_poll=float(old.get("notice_poll") or 1.0),
            flush_interval=float(old.get("flush_interval") or 0.5),
            heartbeat_interval=float(old.get("heartbeat_interval") or 5.0),
        ),
    )
