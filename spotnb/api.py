"""The notebook-side entry points: `train`, `attach`, `jobs`."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from spotnb.control.fleet import make_controller
from spotnb.control.jobdb import JobDB
from spotnb.control.supervise import (
    ensure_controller,
    job_vanished,
    mark_lost,
    start_controller,
)
from spotnb.core import protocol as ev
from spotnb.core.events import EventReader, EventWriter
from spotnb.core.files import FilesError, collect, upload
from spotnb.core.protocol import JobStatus
from spotnb.core.signing import key_path, load_key, seal
from spotnb.core.spec import (
    ShippedFile,
    SpecError,
    load_spec,
    write_spec,
)
from spotnb.core.store import Store
from spotnb.errors import ConfigError, SpotnbError
from spotnb.job import Job
from spotnb.providers.base import LaunchSpec
from spotnb.settings.config import Config
from spotnb.settings.registry import get_provider_class, registry
from spotnb.submit import (
    LIVE_JOBS,
    LIVE_LOCK,
    check_inputs,
    drive_job,
    job_spec,
    merge_config,
    pickle_payload,
    public_config,
    refuse,
    spotnb_version,
    submit_job,
)
from spotnb.views.plan_view import Plan

__all__ = [
    "train",
    "attach",
    "resume",
    "jobs",
    "dry_run_plan",
    "start_controller",
    "ensure_controller",
    "job_vanished",
    "mark_lost",
    "run_controller",
    "EXIT_LEASE_HELD",
]


def _check_fn(fn: Any) -> None:
    if not callable(fn):
        raise ConfigError(f"fn: expected a function taking ctx, got {type(fn).__name__}")
    try:
        inspect.signature(fn).bind(object())
    except TypeError:
        raise ConfigError(
            f"fn: {getattr(fn, '__name__', fn)!r} must accept exactly one positional "
            "argument, the context: def fit(ctx): ..."
        ) from None
    except ValueError:
        pass  # builtins without a signature: let the call decide


def _prepare(fn: Any, config: Config) -> tuple[Any, bytes, list[dict[str, Any]]]:
    """Everything that can fail on bad input, before anything is written or launched:
    the provider's checks, the function's pickle and the files to ship (hashed, size-limited)."""
    _check_fn(fn)
    check_inputs(config)
    provider = get_provider_class(config.provider)(config)
    provider.validate()
    payload = pickle_payload(fn, config)
    try:
        files = collect(config.files, os.getcwd())
    except FilesError as exc:
        raise ConfigError(str(exc)) from None
    return provider, payload, files


def dry_run_plan(fn: Any, config: Config) -> Plan:
    """The provider's exact requests for the first incarnation, sending nothing. The job key
    does not exist yet: the plan shows where it would go, never a key."""
    provider, _, _ = _prepare(fn, config)
    regions = config.candidate_regions()
    region = None if regions == "cheapest" or not regions else regions[0]
    spec = LaunchSpec(
        job_id="<job-id>",
        incarnation=1,
        store_url=config.store_url(),
        instance_type=config.instance_type_name(),
        region=region,
        command=[
            "python",
            "-m",
            "spotnb.runtime.agent",
            "--store",
            config.store_url(),
            "--job",
            "<job-id>",
            "--incarnation",
            "1",
        ],
        requirements=list(config.requirements),
        spotnb_version=spotnb_version(),
    )
    plan = provider.plan_launch(spec)
    if isinstance(plan, dict) and (regions == "cheapest" or len(regions) > 1):
        plan["placement"] = _placement_rows(provider, config, regions)
        plan["migrate"] = _MIGRATE_TEXT[config.migrate].format(every=_every(provider.price_interval))
    if isinstance(plan, dict):  # what this provider cannot do, and which others there are
        plan.setdefault("provider", config.provider)
        plan["unsupported"] = {
            f.value: why for f, why in provider.unsupported.items() if not provider.supports(f)
        }
        plan["providers"] = sorted(registry())
        if config.controller == "cloud":  # where the job is driven from: not this notebook
            plan["controller"] = (
                "hosted by the local market (a process of its own session, not this kernel's)"
                if config.provider == "local"
                else f"on the job's on-demand coordinator, as {config.controller_identity!r}; "
                "this notebook only follows the store"
            )
        plan.setdefault("instance_type", config.instance_type_name())
        return Plan(plan)
    return plan


#: what each Config.migrate does, for the dry run
_MIGRATE_TEXT = {
    "never": "never: a preempted job relaunches in the zone it ran in (others only without capacity)",
    "on-interrupt": "on-interrupt: a preempted job relaunches in the zone best at that moment",
    "best-price": "best-price: relaunch in the best zone, and look at the prices every {every} to "
    "move a running job when another zone's expected saving pays for the move",
    "billing-aware": "billing-aware: best-price's moves, timed so that the old instance leaves just "
    "before the end of its billing increment (at once on a per-second market)",
}


def _every(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def _placement_rows(provider: Any, config: Config, regions: list[str] | str) -> list[dict[str, Any]]:
    """The candidate zones ranked as the controller would rank them at the first launch
    (`spotnb.market.placement`: expected cost of an hour of training there, from this machine's job
    DB and the prices now, moving the checkpoint between the store and the zone included);
    with a list of regions the list's order is what is tried, and the ranking is shown for
    information."""
    from spotnb.market.placement import rank_zones
    from spotnb.market.transfer import NOMINAL_CHECKPOINT_BYTES, store_cloud, transfer_to

    try:
        prices = provider.prices(
            config.instance_type_name(), None if regions == "cheapest" else list(regions)
        )
    except Exception as exc:  # noqa: BLE001 - a dry run shows what it could not learn
        return [{"zone": "?", "text": f"prices unavailable: {exc}"}]
    if not prices and regions == "cheapest":
        return [
            {
                "zone": "?",
                "text": f"no zone prices {config.instance_type_name()}: a launch would have no zone to "
                "go to. Check the instance type's name, or list zones in Config.regions",
            }
        ]
    db = JobDB()
    markets = {}
    for zone in prices:
        name, key, itype, priors = provider.market_key(zone)
        stats = db.market(name, key, itype, **priors)
        markets[zone] = (stats.mttp, stats.restart)
    try:
        store = provider.store_location()
    except Exception:  # noqa: BLE001 - unknown: priced as another region
        store = (store_cloud(config.store_url()), None)
    transfer, clouds = {}, {}
    regional = None
    if config.regional_stores:  # the saves stay in a zone's region when it has a store
        from spotnb.core.store import Store
        from spotnb.market.regional import Regional

        regional = Regional(config, provider, Store(config.store_url()), "dry-run")
    for zone in prices:  # no checkpoint yet: the first start restores nothing
        where = provider.zone_location(zone)
        if regional is not None:
            transfer[zone] = regional.transfer(zone, None, NOMINAL_CHECKPOINT_BYTES, False)
        else:
            transfer[zone] = transfer_to(store, where, NOMINAL_CHECKPOINT_BYTES, False)
        clouds[zone] = where[0] or provider.name
    ranked = rank_zones({z: p.spot for z, p in prices.items()}, markets, transfer=transfer, clouds=clouds)
    return [
        {
            "zone": z.zone,
            "cloud": z.cloud,
            "cost": z.cost,
            "hours": z.hours,
            "transfer": z.transfer_cost,
            # before it runs the job's length is unknown: each zone is priced for one hour of
            # training (placement.NOMINAL_WORK), and says so
            "text": z.describe(nominal=True),
        }
        for z in ranked
    ]


def train(
    fn: Callable[[Any], Any],
    config: Config | None = None,
    *,
    dry_run: bool = False,
    detach: bool = True,
    **overrides: Any,
) -> Job:
    """Run `fn(ctx)` on a spot instance; returns a Job at once (the job runs in the background).

    Bad input raises ConfigError before anything is launched. With `dry_run=True` the
    provider's exact requests are printed and returned and nothing is launched.

    `detach=True` (the default) drives the job from its own controller process, started in a
    new session: restarting or killing the kernel, closing the browser or a sleeping laptop's
    dead notebook do not stop a job that may run for days, and `spot.attach(id)` picks it up
    from anywhere. `detach=False` drives it from a thread of this process instead.
    """
    config = merge_config(config, overrides)
    if dry_run:
        # A Plan shows itself as a readable summary (HTML in a notebook, text in a terminal);
        # printing the whole JSON here made the notebook show every request twice.
        return dry_run_plan(fn, config)  # type: ignore[return-value]
    provider, payload, files = _prepare(fn, config)
    job = submit_job(payload, config, files, detach)
    drive_job(job, config, provider, detach)
    return job


def run_controller(job_id: str, store_url: str | None = None) -> int:
    """The body of `spotnb controller JOB_ID`: drive the job until it ends (or another
    controller holds it). The job's settings come from its JSON spec, verified with the job's
    key on this machine; nothing from the store is unpickled here."""

    db = JobDB()
    row = db.job(job_id)
    url = store_url or (row or {}).get("store")
    if not url:
        raise SpotnbError(f"no job {job_id!r} in {db.path}; pass --store")
    store = Store(url)
    try:
        spec = load_spec(store, job_id, load_key(job_id))
        config = spec.to_config()
    except (SpecError, ConfigError) as exc:
        # end it visibly: a controller that raised here would be restarted, and fail, forever
        refuse(Job(job_id, store, db), f"the job spec cannot be used: {exc}", "bad spec")
        return 1
    job = Job(job_id, store, db, {"name": config.name})
    if spec.legacy:
        refuse(
            job,
            "this job was submitted by an older spotnb and is not signed; an instance "
            "runs only signed jobs: submit it again",
            "unsigned job",
        )
        return 0
    provider = get_provider_class(config.provider)(config)
    controller = make_controller(job, config, provider, store, db)
    controller.run()
    # a live lease held by another (or a just-killed) controller is not the job's end: the
    # coordinator's boot script powers off on 0, so it must retry until the lease runs out
    return 0 if controller.generation else EXIT_LEASE_HELD


RESUMABLE = frozenset({JobStatus.FAILED, JobStatus.STOPPED})
#: `spotnb controller`'s exit code when another controller holds the job's lease (nothing was
#: driven; EX_TEMPFAIL): a loop that restarts a crashed controller tries again later.
EXIT_LEASE_HELD = 75


def resume(
    job_id: str,
    fn: Callable[[Any], Any] | None = None,
    config: Config | None = None,
    *,
    detach: bool = True,
    **overrides: Any,
) -> Job:
    """Continue a stopped or failed job from its latest verified checkpoint.

    For the job that failed on a bug at step 9,000 of 10,000: fix the function and pass it as
    `fn` (it must track the same state, so the checkpoint restores into it), and/or change
    Config fields (`config=` and keyword overrides, merged over the job's own). The job keeps
    its id, its history and its checkpoints: the feed shows the resume and the breakdown goes
    on adding up. Moving a job to another provider or store is refused (its checkpoints live
    in its store and its instances on its provider): submit a new job for that.

    Everything is checked before anything is written; with `detach=False` the job is driven
    from a thread of this process, as with `train`.
    """

    db = JobDB()
    row = db.job(job_id)
    if row is None:
        raise SpotnbError(f"no job {job_id!r} in {db.path}")
    full_id = row["id"]
    store = Store(row["store"])
    key = load_key(full_id)
    if key is None:
        raise SpotnbError(
            f"job {full_id}: its key is not on this machine ({key_path(full_id)}); resume "
            "it from the machine that submitted it"
        )
    try:
        spec = load_spec(store, full_id, key)
    except SpecError as exc:
        raise SpotnbError(f"job {full_id}: cannot resume it: {exc}") from None
    job = Job(full_id, store, db, {"name": spec.name})
    job._ingest(EventReader(store, full_id).poll())
    if job.status not in RESUMABLE:
        hint = "nothing to resume" if job.status == JobStatus.SUCCEEDED else "stop it first (spotnb stop)"
        raise SpotnbError(
            f"job {full_id} is {job.status}: only a failed or stopped job can be resumed; {hint}"
        )
    old = spec.to_config()
    if config is not None and not isinstance(config, Config):
        raise ConfigError(f"config must be a spot.Config, got {type(config).__name__}")
    given = {k: getattr(config, k) for k in config.model_fields_set} if config is not None else {}
    changes = {**given, **overrides}
    if changes.get("provider", old.provider) != old.provider:
        raise ConfigError(
            f"Config.provider: job {full_id} ran on {old.provider!r} and cannot move to "
            f"{changes['provider']!r} (its instances and checkpoints belong there); "
            "submit a new job with spot.train instead"
        )
    new = merge_config(old, changes)
    if new.store_url().rstrip("/") != store.url:
        raise ConfigError(
            f"Config.store: job {full_id} keeps its checkpoints in {store.url!r}; it cannot "
            f"resume from {new.store_url()!r}"
        )
    if fn is None and not isinstance(new.checkpoint, str) and "checkpoint" in changes:
        raise ConfigError("Config.checkpoint: a Policy object travels with the function; pass fn= too")
    if fn is not None:
        if spec.script is not None:
            raise ConfigError(
                f"fn: job {full_id} runs the script {spec.script.path!r}; resume it without fn "
                "(to run a changed script, submit it again with spot.run)"
            )
        _check_fn(fn)
    check_inputs(new)
    provider = get_provider_class(new.provider)(new)
    provider.validate()
    payload = pickle_payload(fn, new) if fn is not None else None
    files = spec.files
    if "files" in changes:
        try:
            collected = collect(new.files, os.getcwd())
        except FilesError as exc:
            raise ConfigError(str(exc)) from None
        upload(store, collected)
        files = [ShippedFile(**{k: v for k, v in f.items() if k != "source"}) for f in collected]
        if spec.script is not None:  # the script itself is shipped whatever Config.files says
            files += [f for f in spec.files if f.path == spec.script.path and f not in files]
    # -- all checked: claim the job (of two resumes at once, one goes on), then write ----------
    if not db.claim_job(full_id, row.get("status"), status=JobStatus.PENDING.value):
        raise SpotnbError(
            f"job {full_id} is being resumed by another call (its row changed since this one "
            f"looked): follow that one with spot.attach({full_id!r})"
        )
    if payload is not None:
        store.write_bytes(store.job(full_id, "fn.pkl"), seal(key, full_id, "fn.pkl", payload))
    fresh = job_spec(full_id, new, [], created=spec.created)
    write_spec(store, fresh.model_copy(update={"cwd": spec.cwd, "files": files, "script": spec.script}), key)
    store.rm(store.job(full_id, "STOP"))
    changed = sorted(k for k in changes if getattr(old, k, None) != getattr(new, k))
    writer = EventWriter(store, full_id, 0, "api")
    writer.emit(
        ev.JobResumed(
            from_status=job.status, new_fn=fn is not None, changed=changed, config=public_config(new)
        )
    )
    writer.emit(ev.Status(status=JobStatus.PENDING))
    writer.flush()
    # where its controller now runs: a "cloud" row is never driven from this machine
    db.update_job(
        full_id, status=JobStatus.PENDING.value, controller="cloud" if new.controller == "cloud" else None
    )
    fresh_job = Job(full_id, store, db, {"name": new.name})
    with LIVE_LOCK:
        LIVE_JOBS.pop(full_id, None)
    drive_job(fresh_job, new, provider, detach)
    return fresh_job


def attach(job_id: str, store: str | None = None) -> Job:
    """A Job for an existing job, from any process: full history, then live while it runs."""

    db = JobDB()
    row = db.job(job_id)
    if row is not None:
        ensure_controller(row)
    with LIVE_LOCK:
        live = LIVE_JOBS.get(row["id"] if row else job_id)
    if row is not None and row.get("status") == JobStatus.LOST:  # its store is gone: the DB says so
        job = live or Job(row["id"], None, db, {"name": row.get("name")})  # type: ignore[arg-type]
        job._mark_lost(row.get("status_reason") or "its store vanished")
        return job
    if live is not None and not (live.done and _went_on_elsewhere(live, db)):
        return live
    if row is None and store is None:
        raise SpotnbError(f"no job {job_id!r} in {db.path}; pass store= to attach from a store directly")
    url = store or row["store"]  # type: ignore[index]
    full_id = row["id"] if row else job_id
    st = Store(url)
    if not st.exists(st.job(full_id, "spec.json")):
        raise SpotnbError(f"job {full_id!r} has no spec in store {url!r}")
    name = row.get("name") if row else None
    if name is None:  # only viewing: the spec's name as JSON (nothing here runs or steers code)
        try:
            name = load_spec(st, full_id, None, verify=False).name
        except (SpecError, OSError):
            name = None
    job = Job(full_id, st, db, {"name": name})
    job.follow()
    return job


def _went_on_elsewhere(live: Job, db: JobDB) -> bool:
    """A job this process saw end has more events in its store: it was resumed from another
    process (`spotnb resume` in a shell). The finished Job this process holds is stale then:
    forget it, so that `attach` follows the job again."""
    if live.store is None:
        return False
    newer = EventReader(live.store, live.id).poll()
    if len(newer) <= len(live.events):
        return False
    with LIVE_LOCK:
        if LIVE_JOBS.get(live.id) is live:
            del LIVE_JOBS[live.id]
    return True


def jobs() -> list[dict[str, Any]]:
    """Every job in the job DB, newest first (restarting any dead controller it notices)."""
    rows = JobDB().jobs()
    for row in rows:
        ensure_controller(row)
    return rows
