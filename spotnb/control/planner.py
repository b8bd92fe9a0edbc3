"""The zone planner: where an incarnation runs and where its checkpoint is.

A `Controller` holds one `ZonePlanner` (composition: the controller keeps the loop, the lease
and recovery; the planner decides zones). It answers:

- `regions(n)`: the zones to ask, in order (`Config.regions`; "cheapest" ranks them by the
  expected cost of the remaining work, `rank`);
- `rank(prices)`: the zones by expected cost (`spotnb.market.placement`), each with the cost
  of moving the checkpoint there (`spotnb.market.transfer`, or the regional stores');
- `allocate(n, …)`: ask for incarnation `n`'s instance until one runs, region after region,
  with backoff after a round of refusals, giving up on a region for the account's quota
  (`quota_failed` then lists the quotas), or at `Config.max_wait`;
- `place_checkpoint(n, instance)`: where the incarnation restores from and writes
  (`spotnb.market.regional`, `Config.regional_stores`);
- `observation(n)`: incarnation `n` in the checkpoint policy's terms (its step, its saves'
  times, the market of its allocation), which placement weighs and the controller's policy
  reads on a notice;
- `note_prices(…)`: the zones' prices written for the widget.

What it needs of the controller is `PlannerHost`: writing events (fenced by the lease), the
stop, and the policy's view of the market.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from spotnb.control.jobdb import JobDB
from spotnb.control.moves import move_poll
from spotnb.core import protocol as ev
from spotnb.core.protocol import Event
from spotnb.core.store import Store
from spotnb.errors import CapacityError, QuotaError
from spotnb.market.migration import MOVING_POLICIES
from spotnb.market.placement import Transfer, ZoneEstimate, rank_zones
from spotnb.market.regional import CKPT_DOC, Regional, expected_saves
from spotnb.market.transfer import checkpoint_bytes, store_cloud, transfer_to
from spotnb.policy import Observation, Policy
from spotnb.providers.base import Instance, InstanceState, LaunchSpec, Provider

if TYPE_CHECKING:
    from spotnb.job import Job
    from spotnb.settings.config import Config

__all__ = ["BACKOFF", "PlannerHost", "ZonePlanner", "backoff"]

# seconds between rounds of refused launches (no capacity, an allocation that failed after the
# request, Azure throttling): exponential, capped, each drawn at 50-100 % (jitter, `backoff`)
BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


def backoff(attempt: int) -> float:
    """Seconds to wait before the next round of launches after `attempt` refusals: BACKOFF's
    step for it (exponential, capped at 30 s), drawn at 50-100 % so that controllers refused
    together (an Azure allocation failure, a zone's stockout) do not ask again in lock step."""
    return BACKOFF[min(attempt, len(BACKOFF) - 1)] * random.uniform(0.5, 1.0)


def _said(reason: str, limit: int = 160) -> str:
    """A refusal's first line, short enough to list one per region."""
    line = reason.strip().splitlines()[0] if reason.strip() else "no reason given"
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _version() -> str:
    from spotnb import __version__

    return __version__


class PlannerHost(Protocol):
    """What the zone planner asks of the controller that holds it."""

    stop_reason: str  # why the job stops (the planner says so at max_wait)

    def emit(self, event: Event, incarnation: int = 0) -> None:
        """Write one event, fenced by the controller's lease."""

    def fence(self) -> None:
        """Raise unless the controller still holds the job's lease."""

    def pump(self) -> list[Event]:
        """Read the job's new events."""

    def stop_requested(self) -> bool:
        """Whether the job is being stopped (a STOP marker, `request_stop`)."""

    def market(self) -> dict[str, float]:
        """What the policy assumes of the market (MTTP, restart, grace)."""


class ZonePlanner:
    """Regions, placement, transfers and allocation retry for one job; see the module docstring."""

    def __init__(
        self,
        host: PlannerHost,
        job: Job,
        config: Config,
        provider: Provider,
        store: Store,
        db: JobDB,
        policy: Policy,
        stop: threading.Event,
        log: logging.LoggerAdapter,
    ) -> None:
        self.host, self.job, self.config, self.provider = host, job, config, provider
        self.store, self.db, self.policy, self.stop, self.log = store, db, policy, stop, log
        # the quotas that refused every candidate region (`allocate`): the job fails with them
        self.quota_failed: list[QuotaError] | None = None
        self.market_now: dict[str, float] = {}  # the market of the last allocation
        self._prices_said: dict[str, float] = {}  # the zone prices last written (`prices` event)
        self._store_location: tuple[str | None, str | None] | None = None  # (cloud, region)
        self._regional: Regional | None = None  # Config.regional_stores

    # -- allocation ----------------------------------------------------------------------------
    def allocate(
        self,
        n: int,
        cancel: threading.Event | None = None,
        extra: dict[str, Any] | None = None,
        slot: int = 0,
        only: str | None = None,
    ) -> Instance | None:
        """Ask for incarnation `n`'s instance until one runs (None: stopped or max_wait).
        `extra` goes into its incarnation document (a fleet's slot, coordinator, join).
        `only`: a move's zone, asked once (None when it has no capacity: the job stays)."""
        market = self.market_now = self.host.market()
        inc_doc = {
            "incarnation": n,
            "market": market,
            "notice": self.provider.notice_settings(),
            **(extra or {}),
        }
        if self.config.migrate in MOVING_POLICIES or self.config.instances > 1:
            # the agent looks for a request to move, or (several instances) to save now
            inc_doc["move_poll"] = move_poll(self.store)
        if getattr(self.config, "regional_stores", None):  # it waits for `place_checkpoint`
            inc_doc["ckpt_doc"] = True
        inc_path = self.store.job(self.job.id, "incarnations", f"{n:04d}.json")
        self.store.write_bytes(inc_path, json.dumps(inc_doc).encode())
        regions: list[str | None] = [only] if only else self.regions(n)
        spec_base: dict[str, Any] = dict(
            job_id=self.job.id,
            incarnation=n,
            store_url=self.store.url,
            instance_type=self.config.instance_type_name(),
            command=[
                "python",
                "-m",
                "spotnb.runtime.agent",
                "--store",
                self.store.url,
                "--job",
                self.job.id,
                "--incarnation",
                str(n),
            ],
            requirements=list(self.config.requirements),
            spotnb_version=_version(),
            slot=slot,
        )
        attempt = 0
        requested = time.time()
        tried: list[str] = []
        said: dict[str, str] = {}  # what each region tried last said
        quotas: list[QuotaError] = []  # the quotas that took regions out of `regions`
        self.db.record_incarnation(
            self.job.id,
            n,
            requested=requested,
            provider=self.provider.name,
            instance_type=self.config.instance_type_name(),
        )
        while not self.host.stop_requested() and not (cancel is not None and cancel.is_set()):
            waited = time.time() - requested
            if self.config.max_wait is not None and attempt and waited >= self.config.max_wait:
                answers = "; ".join(f"{r} ({said[r]})" if r in said else r for r in tried)
                self.host.stop_reason = (
                    f"max_wait={self.config.max_wait:g}s reached: no spot capacity for "
                    f"{self.config.instance_type_name()} in {waited:.0f} s and {attempt} attempt(s), "
                    f"regions tried: {answers}. Add regions (Config.regions), choose "
                    "another instance_type, or raise max_wait"
                )
                return None
            if not regions:  # a quota refused every candidate: no retry can help
                self.quota_failed = quotas
                return None
            region = regions[attempt % len(regions)]
            if (region or self.provider.name) not in tried:
                tried.append(region or self.provider.name)
            notice = self.provider.notice_settings(region)
            if notice != inc_doc["notice"]:  # provider='any': this zone's cloud's notices
                inc_doc["notice"] = notice
                inc_doc["market"] = {**market, "grace": notice["grace"]}
                self.store.write_bytes(inc_path, json.dumps(inc_doc).encode())
            self.host.emit(ev.Allocating(region=region, attempt=attempt + 1, slot=slot), n)
            label = region or self.provider.name
            try:
                instance = self.provider.launch(LaunchSpec(region=region, **spec_base))
            except QuotaError as exc:
                # the account's quota, not a shortage: this region (or, with a project-wide
                # quota, every region of its cloud) is asked no more for this incarnation
                said[label] = _said(str(exc))
                self.host.emit(ev.AllocFailed(region=region, reason=str(exc), retry_in=0.0), n)
                if only:
                    return None
                quotas.append(exc)
                regions = [r for r in regions if not exc.covers(r)]
                attempt += 1
                continue
            except CapacityError as exc:
                said[label] = _said(str(exc))
                if only:
                    self.host.emit(ev.AllocFailed(region=region, reason=str(exc), retry_in=0.0), n)
                    return None
                wait = backoff(attempt) if (attempt + 1) % len(regions) == 0 else 0.0
                self.host.emit(ev.AllocFailed(region=region, reason=str(exc), retry_in=wait), n)
                attempt += 1
                if self.config.max_wait is not None:  # never sleep past the limit
                    wait = max(0.0, min(wait, requested + self.config.max_wait - time.time()))
                if self.stop.wait(wait) or (cancel is not None and cancel.is_set()):
                    break
                continue
            # recorded before waiting, so a controller that dies now can still find it
            self.host.emit(
                ev.Launched(
                    instance_id=instance.id,
                    region=instance.region,
                    instance_type=instance.instance_type,
                    launched_at=instance.launched_at,
                    info=instance.info,
                ),
                n,
            )
            status = self.provider.wait_allocated(instance, timeout=900, stop=self.stop)
            if status.state != InstanceState.RUNNING:
                # it failed after the request (Azure's asynchronous AllocationFailed, a quota):
                # deleted, then asked again only after a backoff, never in a tight
                # create/delete loop against the cloud's API
                refusal = self.provider.allocation_refusal(instance)
                reason = str(refusal) if refusal is not None else f"instance {status.state.value}"
                said[label] = _said(reason)
                self.provider.terminate(instance)
                if only or self.stop.is_set():
                    self.host.emit(ev.AllocFailed(region=region, reason=reason, retry_in=0.0), n)
                    if only:
                        return None
                    continue
                if isinstance(refusal, QuotaError):
                    self.host.emit(ev.AllocFailed(region=region, reason=reason, retry_in=0.0), n)
                    quotas.append(refusal)
                    regions = [r for r in regions if not refusal.covers(r)]
                    attempt += 1
                    continue
                wait = backoff(attempt) if (attempt + 1) % len(regions) == 0 else 0.0
                self.host.emit(ev.AllocFailed(region=region, reason=reason, retry_in=wait), n)
                attempt += 1
                if self.config.max_wait is not None:
                    wait = max(0.0, min(wait, requested + self.config.max_wait - time.time()))
                if self.stop.wait(wait) or (cancel is not None and cancel.is_set()):
                    break
                continue
            self._allocated(n, instance, region, requested)
            return instance
        return None

    def allocate_async(
        self, n: int, name: str, extra: dict[str, Any] | None = None, slot: int = 0, only: str | None = None
    ) -> Future:
        """`allocate` in a thread called `name`: a replacement asked for on a notice, a move's
        new instance, a fleet's slot. The future's `cancel_event` makes it give up."""
        fut: Future = Future()
        fut.cancel_event = cancel = threading.Event()  # type: ignore[attr-defined]

        def run() -> None:
            try:
                fut.set_result(self.allocate(n, cancel, extra=extra, slot=slot, only=only))
            except BaseException as exc:  # noqa: BLE001 - seen by whoever waits for it
                fut.set_exception(exc)

        threading.Thread(target=run, name=name, daemon=True).start()
        return fut

    def quota_message(self) -> str:
        """Why no region would run the instance (`quota_failed`): each quota, and how to raise
        it; after a checkpoint, how to go on from it once raised."""
        texts: list[str] = []
        for q in self.quota_failed or []:
            if str(q) not in texts:
                texts.append(str(q))
        message = (
            texts[0]
            if len(texts) == 1
            else "every candidate region refused the instance for a quota: " + " | ".join(texts)
        )
        saved = self.job.state.checkpoints
        if saved:
            message += (
                f". The job's checkpoint of step {saved[-1].step} is kept: once the quota is "
                f"raised, spot.resume({self.job.id!r}) goes on from it"
            )
        return message

    def _allocated(self, n: int, instance: Instance, region: str | None, requested: float) -> None:
        """Record incarnation `n`'s running instance: its prices and billing in its info, the
        `allocated` event, the job DB's incarnation under the zone's own market."""
        price = self.provider.prices(self.config.instance_type_name(), [region] if region else None)
        p = price.get(instance.region or "") or next(iter(price.values()), None)
        spot = self.config.price_spot if self.config.price_spot is not None else (p.spot if p else 0.0)
        od = (
            self.config.price_on_demand
            if self.config.price_on_demand is not None
            else (p.on_demand if p else 0.0)
        )
        instance.info["incarnation"] = n
        # how its market bills it, for the ledger (`spotnb.core.billing`); a Config price is fixed
        instance.info["billing"] = self.provider.billing(instance.region).as_info()
        if self.config.price_spot is not None:
            instance.info["price_fixed"] = True
        now = time.time()
        self.host.emit(
            ev.Allocated(
                instance_id=instance.id,
                region=instance.region,
                instance_type=instance.instance_type,
                alloc_s=now - requested,
                launched_at=instance.launched_at,
                info=instance.info,
                spot_price=spot,
                on_demand_price=od,
                price_source=p.source if p else "config",
            ),
            n,
        )
        # under the zone's own cloud and type (provider='any'): its market's history
        cloud, zone, itype, _ = self.provider.market_key(instance.region)
        self.db.record_incarnation(
            self.job.id,
            n,
            instance_id=instance.id,
            region=zone,
            allocated=now,
            provider=cloud,
            instance_type=itype,
        )

    # -- zones ---------------------------------------------------------------------------------
    def regions(self, n: int = 0) -> list[str | None]:
        """The zones to ask for incarnation `n`, in order."""
        regions = self.config.candidate_regions()
        if regions == "cheapest":
            prices = self.provider.prices(self.config.instance_type_name(), None)
            if not prices:
                return [None]
            self.note_prices(prices, n, always=True)
            ranked = self.rank({r: p.spot for r, p in prices.items()})
            self.log.debug(
                "job %s: zones by expected cost: %s",
                self.job.id,
                "; ".join(f"{z.zone}: {z.describe()}" for z in ranked),
            )
            order: list[str | None] = [z.zone for z in ranked]
        else:
            order = list(regions) or [None]
            if len(set(regions)) > 1:  # the widget draws every multi-zone job's prices
                self._follow_prices(list(regions), n)
        if self.config.migrate == "never":  # back where it ran, the others only as a fallback
            last = max(
                (inc for inc in self.job.state.incs.values() if inc.region and inc.allocated),
                key=lambda inc: inc.n,
                default=None,
            )
            if last is not None and last.region in order:
                order.remove(last.region)
                order.insert(0, last.region)
        return order

    def rank(self, prices: dict[str, float]) -> list[ZoneEstimate]:
        """The zones by the expected cost of the job's remaining work there (`spotnb.market.placement`):
        each zone's market from the job DB, this job's recent trouble there as a penalty."""
        markets = {}
        for zone in prices:
            name, key, itype, priors = self.provider.market_key(zone)
            stats = self.db.market(name, key, itype, **priors)
            markets[zone] = (stats.mttp, stats.restart)
        st = self.job.state
        work = None
        if st.total and st.step_time:
            work = max(0, int(st.total) - max(0, int(st.step))) * st.step_time
        trouble: dict[str, list[float]] = {}
        for inc in st.incs.values():
            if inc.preempted and inc.region and inc.end is not None:
                trouble.setdefault(inc.region, []).append(inc.end)
        for zone, t in st.alloc_failures:  # folded by the state: no scan of every event
            trouble.setdefault(zone, []).append(t)
        transfer, clouds = self._transfers(prices)
        return rank_zones(
            prices, markets, work_s=work, trouble=trouble, now=time.time(), transfer=transfer, clouds=clouds
        )

    def _transfers(self, zones: Any) -> tuple[dict[str, Transfer], dict[str, str]]:
        """Moving the checkpoint to each zone (`spotnb.market.transfer`): the latest checkpoint's
        bytes (an estimate before the first save) between the store and the zone; and each
        zone's cloud. The store's place is asked once per controller."""
        if self._store_location is None:
            try:
                self._store_location = self.provider.store_location()
            except Exception as exc:  # noqa: BLE001 - unknown: priced as another region
                self.log.debug("job %s: the store's region is unknown: %r", self.job.id, exc)
                self._store_location = (store_cloud(self.store.url), None)
        nbytes, saved = checkpoint_bytes(self.job.state)
        transfer, clouds = {}, {}
        regional = self._regional_stores()
        for zone in zones:
            where = self.provider.zone_location(zone)
            if regional is not None:  # copied into the zone's region, or read from where it is
                transfer[zone] = regional.transfer(zone, self.job.state.checkpoint_store, nbytes, saved)
            else:
                transfer[zone] = transfer_to(self._store_location, where, nbytes, saved)
            clouds[zone] = where[0] or self.provider.name
        return transfer, clouds

    def observation(self, n: int) -> Observation:
        """What the controller knows of incarnation `n`, in the policy's terms."""
        inc = self.job.state.incs.get(n)
        progress = inc.progress if inc is not None else None
        saves = self.job.state.checkpoints

        def mean_sd(key: str) -> tuple[float, float]:
            xs = [float(getattr(e, key)) for e in saves[-10:]]
            if not xs:
                return 0.0, 0.0
            m = sum(xs) / len(xs)
            return m, (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5

        (snap, snap_sd), (up, up_sd) = mean_sd("snapshot_s"), mean_sd("upload_s")
        market = self.market_now or self.host.market()
        return Observation(
            step=progress.step if progress else 0,
            step_time=(progress.step_time or 0.0) if progress else 0.0,
            snapshot_time=snap,
            upload_time=up,
            mttp=market["mttp"],
            restart_time=market["restart"],
            grace=market["grace"],
            save_every=self.config.save_every,
            total_steps=progress.total if progress else None,
            snapshot_sd=snap_sd,
            upload_sd=up_sd,
            state_bytes=saves[-1].nbytes if saves else 0,
            now=time.time(),
        )

    # -- the checkpoint's place ----------------------------------------------------------------
    def _regional_stores(self) -> Regional | None:
        """The job's stores when it has regional ones (`Config.regional_stores`), else None."""
        if self._regional is None and getattr(self.config, "regional_stores", None):
            self._regional = Regional(self.config, self.provider, self.store, self.job.id)
        return self._regional

    def place_checkpoint(self, n: int, instance: Instance) -> None:
        """Where incarnation `n` restores from and writes (`spotnb.market.regional`: copy the newest
        checkpoint into its zone's store, or read across, by cost), once: its agent waits for
        the document, which a successor controller writes if this one died before (mid-copy)."""
        if not getattr(self.config, "regional_stores", None):
            return
        path = self.store.job(self.job.id, "incarnations", CKPT_DOC.format(n=n))
        if self.store.exists(path):
            return
        regional = self._regional_stores()
        assert regional is not None
        self.host.pump()
        st, zone = self.job.state, instance.region

        def saves_after(step: int) -> float:
            name, key, itype, priors = self.provider.market_key(zone)
            stats = self.db.market(name, key, itype, **priors)
            obs = self.observation(max(1, n - 1))
            obs = obs.with_(
                mttp=stats.mttp, restart_time=stats.restart, step_time=st.step_time or obs.step_time
            )
            return expected_saves(self.policy, obs, step, st.total, stats.mttp)

        written = max((c.nbytes or 0 for c in st.checkpoints[-10:]), default=0)
        bps = self.config.local_upload_bps if self.provider.name == "local" else None
        doc, fields, warnings = regional.place(zone, saves_after, written, bps)
        for message in warnings:
            self.host.emit(ev.JobWarning(message=message), n)
        self.host.emit(ev.CheckpointPlaced(**fields), n)
        self.host.fence()
        self.store.write_bytes(path, json.dumps(doc).encode())

    # -- prices for the widget -----------------------------------------------------------------
    def _follow_prices(self, regions: list[str], n: int) -> None:
        """The listed zones' prices at an allocation of a job that does not rank them (a list
        of regions is tried in order): written for the widget's price lines. A price API that
        is down or answers garbage costs the job nothing but the lines."""
        try:
            prices = self.provider.prices(self.config.instance_type_name(), regions)
        except Exception as exc:  # noqa: BLE001 - prices are shown, not needed, here
            self.log.debug("job %s: no prices of %s to show: %r", self.job.id, regions, exc)
            return
        self.note_prices(prices, n, always=True)  # a lost lease must still stop the controller

    def note_prices(self, prices: dict[str, Any], n: int = 0, always: bool = False) -> None:
        """Write the zones' spot prices: at each allocation (`always`), and at each look for a
        move when they changed since the last written (the widget draws them over time; an
        unchanged look writes nothing). A price that is not a finite number is left out."""
        now = {}
        for zone, p in prices.items():
            try:
                spot = float(p.spot)
            except (TypeError, ValueError, AttributeError):
                continue
            if math.isfinite(spot) and spot >= 0:
                now[str(zone)] = round(spot, 6)
        if not now or (now == self._prices_said and not always):
            return
        self._prices_said = now
        sources = sorted({str(p.source) for p in prices.values()})
        self.host.emit(ev.Prices(zones=now, source="; ".join(sources)[:300]), n)
