"""Submitting a job: what `spot.train` (`spotnb.api`) and `spot.run` (`spotnb.script_job`) share.

A job is submitted in four steps, each a public function here so that both entry points (and
a third, if one comes) compose them instead of reaching into each other's private helpers:
`merge_config` (the Config and the keyword overrides), `check_inputs` (what the Config alone
cannot check), `pickle_payload` (the signed function and policy the instance unpickles), then
`submit_job` (key, payload, spec, shipped files, `submitted` event: written, nothing started)
and `drive_job` (what drives it: a controller here or detached, or the job's coordinator).
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
import time
import weakref
from collections.abc import Callable
from importlib import import_module
from typing import Any

from spotnb.control.fleet import make_controller
from spotnb.control.jobdb import JobDB
from spotnb.control.supervise import hosting_error, start_controller
from spotnb.core import protocol as ev
from spotnb.core.events import EventReader, EventWriter
from spotnb.core.files import upload
from spotnb.core.protocol import TERMINAL, JobStatus
from spotnb.core.signing import load_key, new_key, save_key, seal
from spotnb.core.spec import JobSpec, RuntimeSettings, ScriptSpec, ShippedFile, config_json, write_spec
from spotnb.core.store import Store
from spotnb.errors import ConfigError
from spotnb.job import Job
from spotnb.providers.shipping import ship
from spotnb.settings.config import Config
from spotnb.settings.registry import get_provider_class

__all__ = [
    "merge_config",
    "check_inputs",
    "pickle_payload",
    "submit_job",
    "drive_job",
    "job_spec",
    "public_config",
    "open_store",
    "refuse",
    "spotnb_version",
    "LIVE_JOBS",
    "LIVE_LOCK",
]

#: The jobs this process submitted, attached or resumed, by id (weakly: a job nobody holds is
#: forgotten), so that `spot.attach` in the same kernel returns the very Job that is driven here.
LIVE_JOBS: weakref.WeakValueDictionary[str, Job] = weakref.WeakValueDictionary()
#: Guards `LIVE_JOBS` (a controller thread and the notebook's thread both touch it).
LIVE_LOCK = threading.Lock()


def spotnb_version() -> str:
    """The version of spotnb this notebook runs (written into the spec and the `submitted` event)."""
    from spotnb import __version__

    return __version__


def merge_config(config: Config | None, overrides: dict[str, Any]) -> Config:
    """`config` (or a default Config) with `overrides` applied, validated again as a whole;
    a `config` that is not a Config is a ConfigError."""
    if config is None:
        return Config(**overrides)
    if not isinstance(config, Config):
        raise ConfigError(f"config must be a spot.Config, got {type(config).__name__}")
    base = {k: getattr(config, k) for k in config.model_fields_set}
    return Config(**{**base, **overrides})


def pickle_payload(fn: Callable[..., Any] | None, config: Config) -> bytes:
    """The signed payload the instance unpickles: the function (None for a script job) and a
    Policy object given as Config.checkpoint."""
    import cloudpickle

    for name in config.ship_modules:
        try:
            module = import_module(name)
        except ImportError as exc:
            raise ConfigError(
                f"Config.ship_modules: cannot import {name!r} here ({exc}); list "
                "modules importable in this kernel"
            ) from None
        cloudpickle.register_pickle_by_value(module)
    policy = config.checkpoint if not isinstance(config.checkpoint, str) else None
    try:
        return cloudpickle.dumps({"fn": fn, "policy": policy})
    except Exception as exc:  # noqa: BLE001 - cloudpickle raises many kinds
        raise ConfigError(
            f"fn: {getattr(fn, '__name__', 'the function')!r} cannot be pickled to ship "
            f"to the instance: {type(exc).__name__}: {exc}. It (or something it uses "
            "from the notebook) holds an object that cannot be pickled, such as an "
            "open file, lock, socket or CUDA stream; create it inside the function."
        ) from None
    finally:
        for name in config.ship_modules:
            cloudpickle.unregister_pickle_by_value(sys.modules[name])


def check_inputs(config: Config) -> None:
    """Refuse, before anything is written, what `Config` alone cannot check: files that are
    missing here, more local processes than this machine runs, requirements pip would not parse."""
    for i, path in enumerate(config.files):
        if os.path.islink(path) and not os.path.exists(path):
            raise ConfigError(
                f"Config.files[{i}]: {path!r} is a symbolic link to {os.readlink(path)!r}, which "
                "does not exist (or leads back to itself); point it at a file, or remove it from "
                "Config.files"
            )
        if not os.path.exists(path):
            raise ConfigError(
                f"Config.files[{i}]: {path!r} does not exist (relative paths are taken from {os.getcwd()!r})"
            )
    _check_local_procs(config)
    from packaging.requirements import InvalidRequirement, Requirement

    for i, spec in enumerate(config.requirements):
        try:
            Requirement(spec)
        except InvalidRequirement as exc:
            raise ConfigError(f"Config.requirements[{i}]: {spec!r} is not a pip requirement: {exc}") from None


def _check_local_procs(config: Config) -> None:
    """On the local market every process of an instance runs on this machine: refuse more of
    them than it can run (its GPUs with CUDA, else its cores). Checked at submit, not when the
    Config is made: a saved spec read back on another machine stays valid."""
    procs = config.procs_per_instance
    if config.provider != "local" or procs is None or procs <= 1:
        return
    from spotnb.market.gpus import local_capacity

    most, what = local_capacity()
    if procs > most:
        raise ConfigError(
            f"Config.procs_per_instance: {procs} processes per instance on the local market is "
            f"more than {what} (each local-market instance runs on it); give at most "
            f"procs_per_instance={most}, or leave it None (the GPU count, 1 on CPU)"
        )


def _new_job_id() -> str:
    """Sortable by submission time, unique across processes and machines sharing a store."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def job_spec(
    job_id: str,
    config: Config,
    files: list[dict[str, Any]],
    created: float | None = None,
    script: ScriptSpec | None = None,
) -> JobSpec:
    """The job's JSON spec: the whole Config (a Policy object stays in the fn payload), what
    the instance needs in typed form, and the shipped files."""
    return JobSpec(
        job_id=job_id,
        name=config.name,
        created=created or time.time(),
        spotnb_version=spotnb_version(),
        cwd=os.getcwd(),
        config=config_json(config),
        runtime=RuntimeSettings(
            policy=config.checkpoint if isinstance(config.checkpoint, str) else None,
            save_every=config.save_every,
            keep_last=config.keep_last,
            snapshot_memory=config.snapshot_memory,
            notice_poll=config.notice_poll,
            flush_interval=0.5,
            heartbeat_interval=max(0.5, min(5.0, config.heartbeat_timeout / 4)),
            instances=config.instances,
            min_instances=config.min_instances,
            sync=config.sync,
            procs_per_instance=config.procs_per_instance,
        ),
        files=[ShippedFile(**{k: v for k, v in f.items() if k != "source"}) for f in files],
        script=script,
    )


def public_config(config: Config) -> dict[str, Any]:
    """The Config as the `submitted` event shows it: JSON, a Policy object as its repr."""
    data = config.model_dump(mode="json", exclude={"checkpoint"})
    data["checkpoint"] = config.checkpoint if isinstance(config.checkpoint, str) else repr(config.checkpoint)
    return data


def open_store(url: str) -> Any:
    """The job's store, or a ConfigError naming `Config.store` when it cannot be opened."""
    try:
        return Store(url)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"Config.store: cannot open {url!r}: {exc}") from None


def submit_job(
    fn_payload: bytes,
    config: Config,
    files: list[dict[str, Any]],
    detach: bool,
    script: ScriptSpec | None = None,
) -> Job:
    """Write a new job to the store and the job DB (key, signed fn and spec, shipped files,
    `submitted` event); start nothing."""

    store = open_store(config.store_url())
    db = JobDB()
    job_id = _new_job_id()
    key = new_key()
    save_key(job_id, key)
    upload(store, files)
    store.write_bytes(store.job(job_id, "fn.pkl"), seal(key, job_id, "fn.pkl", fn_payload))
    ship(store, job_id, key, config, get_provider_class(config.provider).ships_code)  # the VMs' spotnb
    write_spec(store, job_spec(job_id, config, files, script=script), key)
    db.add_job(
        job_id,
        name=config.name,
        provider=config.provider,
        region=config.region,
        instance_type=config.instance_type_name(),
        store=store.url,
    )
    if config.controller == "cloud":
        db.update_job(job_id, controller="cloud")  # never driven from this machine
    submitted = EventWriter(store, job_id, 0, "api")
    submitted.emit(
        ev.Submitted(
            name=config.name,
            provider=config.provider,
            instance_type=config.instance_type_name(),
            config=public_config(config),
            spotnb_version=spotnb_version(),
            detached=detach,
            files=[{"path": f["path"], "size": f["size"]} for f in files],
        )
    )
    submitted.emit(ev.Status(status=JobStatus.PENDING))
    submitted.flush()
    return Job(job_id, store, db, {"name": config.name})


def drive_job(job: Job, config: Config, provider: Any, detach: bool) -> None:
    """Start what drives a submitted job: its cloud coordinator (`controller="cloud"`), a
    detached controller process (`detach=True`, which this notebook then follows), or a
    controller thread of this process. The job is remembered in `LIVE_JOBS` either way."""
    with LIVE_LOCK:
        LIVE_JOBS[job.id] = job
    if config.controller == "cloud":
        _host(job, provider)
    elif detach:
        provider.close()
        start_controller(job.id, job.store.url)
        job.follow()
    else:
        controller = make_controller(job, config, provider, job.store, job.db or JobDB())
        job.driver = controller  # kept alive with the job
        controller.start()


def _host(job: Job, provider: Any) -> None:
    """`Config.controller="cloud"`: the job's coordinator drives it; this notebook follows."""
    key = load_key(job.id)
    assert key is not None  # submit_job saved it
    try:
        provider.host_controller(job.id, job.store.url, key.hex())
    except Exception as exc:
        safe = hosting_error(exc, key.hex())  # a refusal quoting the boot script: no key
        refuse(job, f"the job's controller could not be started on its coordinator: {safe}", "no controller")
        raise safe from None
    finally:
        provider.close()
    job.follow()


def refuse(job: Job, message: str, reason: str) -> None:
    """End a job no instance could run (an unsigned job of an older spotnb, a spec that does
    not verify) with an error, instead of launching one for nothing."""
    job._ingest(EventReader(job.store, job.id).poll())
    if job.status in TERMINAL:
        return
    writer = EventWriter(job.store, job.id, 0, "ctl")
    writer.emit(ev.Error(exc_type="UnrunnableJob", traceback="", message=message))
    writer.emit(ev.Status(status=JobStatus.FAILED, reason=reason))
    writer.flush()
    if job.db is not None:
        job.db.update_job(job.id, status=JobStatus.FAILED.value)
