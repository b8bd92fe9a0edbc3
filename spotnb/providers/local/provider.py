"""The local spot market: a real backend whose instances are processes on this machine.

Each instance is `python -m spotnb.runtime.agent ...` in its own process group, forked warm
from the market's zygote (`zygote.py`) when it can serve it. A metadata emulator serves the
chosen cloud's notice protocol; an injector gives the notice and then SIGKILLs the group;
allocation takes a sampled delay and can fail for lack of capacity. It runs the quickstart,
the tutorials and CI, and prices runs from the built-in table.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, ClassVar

from spotnb.core.billing import Billing
from spotnb.core.files import remove_orphaned
from spotnb.core.home import spotnb_home
from spotnb.core.signing import KEY_ENV
from spotnb.core.store import private_dir
from spotnb.errors import CapacityError, ConfigError
from spotnb.market.preempt import Exponential, Never, PreemptionProcess
from spotnb.market.prices import lookup_price
from spotnb.providers.base import (
    Feature,
    Instance,
    InstanceState,
    InstanceStatus,
    LaunchSpec,
    Price,
    Provider,
)
from spotnb.providers.local.capacity import NodeCounts
from spotnb.providers.local.injector import Injector
from spotnb.providers.local.metadata import MetadataEmulator
from spotnb.providers.local.zygote import ZYGOTE_ENV, Forked, Zygote

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = ["LocalProvider"]


class LocalProvider(Provider):
    name = "local"
    describe_interval = 0.0  # a waitpid, free
    price_interval = 1.0  # a zone's price schedule is in seconds of the market
    boot_timeout = 120.0  # a process start and `import torch`
    unsupported: ClassVar[dict[Feature, str]] = {
        Feature.MEMORY_STORE: "local instances are separate processes and cannot see it",
        Feature.MULTI_REGION: "the local market has a single region ('local') unless "
        "Config.local_regions defines zones",
        Feature.CLEANUP: "local instances are processes of their controller and end with it",
    }

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.rng = random.Random(config.local_seed)
        self.emulator: MetadataEmulator | None = None
        self.notice_format = config.local_notice_format
        self.grace = config.local_notice_grace()
        self.schedule = list(config.local_schedule or [])
        self.nodes = self._node_counts()
        self.process = self._process()
        self.t0: float | None = None
        self._procs: dict[str, subprocess.Popen | Forked] = {}
        self._injectors: dict[str, Injector] = {}
        self._terminated: set[str] = set()
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._tmp: str | None = None
        self._lighthouse: subprocess.Popen | None = None
        self._lighthouse_addr: str | None = None
        self._watcher: threading.Thread | None = None
        self._zygote_proc: Zygote | None = None

    def supports(self, feature: Feature) -> bool:
        if feature == Feature.MULTI_REGION and self.config.local_regions:
            return True  # emulated zones, each with its own price and preemptions
        return super().supports(feature)

    def _zone(self, region: str | None) -> str:
        """The zone an instance asked for `region` runs in: the region itself when zones are
        defined (the first zone when none was asked for), else the one region, 'local'."""
        zones = self.config.local_regions
        if not zones:
            return "local"
        return region if region in zones else next(iter(zones))

    @property
    def tmp(self) -> str:
        """This market's scratch folder (instances' beacon files), made at the first launch:
        a provider made only to validate a config (every `train` makes one) leaves nothing.
        Removed by `close`; folders of markets whose process died are removed here."""
        with self._lock:
            if self._tmp is None:
                remove_orphaned(tempfile.gettempdir(), _TMP_PREFIX)
                self._tmp = tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}-")
            return self._tmp

    def _zygote(self, spec: LaunchSpec) -> Zygote | None:
        """The market's zygote (started at its first instance), when it can start this one: an
        agent whose environment, but for the instance's own variables, is the zygote's."""
        if list(spec.command[: len(_AGENT)]) != _AGENT or os.environ.get(ZYGOTE_ENV) == "0":
            return None
        base, folder = {**os.environ, **spec.env}, self.tmp
        with self._lock:
            if self._zygote_proc is None and not self._closing.is_set():
                self._zygote_proc = Zygote(base, spec.job_id, os.path.join(folder, "zygote.log"))
            zygote = self._zygote_proc
        return zygote if zygote is not None and zygote.env == base else None

    def _node_counts(self) -> NodeCounts | None:
        """A job on several instances replays a trace as node counts (`capacity.py`)."""
        cfg = self.config
        if not cfg.local_trace or cfg.instances <= 1:
            return None
        from spotnb.traces import load_trace

        return NodeCounts(load_trace(cfg.local_trace), cfg.instances, cfg.local_trace_speed)

    def _process(self) -> PreemptionProcess:
        cfg = self.config
        if self.nodes is not None:
            return Never()  # the node-count watcher kills, not a per-instance draw
        if cfg.local_trace:
            from spotnb.traces import load_trace  # the policy/simulator issue's loaders

            return load_trace(cfg.local_trace).scaled(cfg.local_trace_speed).process()
        if cfg.local_mttp:
            return Exponential(cfg.local_mttp)
        return Never()

    def _validate(self) -> None:
        cfg = self.config
        if cfg.local_trace:
            try:
                from spotnb.traces import load_trace

                load_trace(cfg.local_trace)
            except (ImportError, OSError, ValueError) as exc:
                raise ConfigError(
                    f"Config.local_trace: cannot load {cfg.local_trace!r}: {exc}. "
                    "Give a bundled trace name or a trace file path."
                ) from None
        if cfg.local_trace and (cfg.local_mttp or cfg.local_schedule):
            raise ConfigError("Config.local_trace: give one of local_trace, local_mttp, local_schedule")
        slots = [e["instance"] for e in cfg.local_schedule or [] if "instance" in e]
        if any(k >= cfg.instances for k in slots):
            raise ConfigError(
                f"Config.local_schedule: an entry names instance {max(slots)}, but the job has "
                f"instances={cfg.instances} (numbered 0 to {cfg.instances - 1})"
            )
        if cfg.local_mttp and cfg.local_schedule:
            raise ConfigError("Config.local_schedule: give local_schedule or local_mttp, not both")

    def notice_settings(self, zone: str | None = None) -> dict[str, Any]:
        return {"format": self.notice_format, "grace": self.grace}

    def egress_per_gb(self, src: tuple[str | None, str | None], dst: tuple[str | None, str | None]) -> float:
        """The emulated zones' link price (`local_regions={zone: {"egress": $/GB}}`): bytes
        between a zone and any other place (another zone, the home store: no zone) pay the
        dearer of the two ends' price; within a zone they are free."""
        if src[1] == dst[1]:
            return 0.0
        zones = self.config.local_regions or {}
        return max(float((zones.get(end[1] or "") or {}).get("egress") or 0.0) for end in (src, dst))

    def _launch(self, spec: LaunchSpec) -> Instance:
        lo, hi = self.config.local_alloc_delay
        delay = self.rng.uniform(lo, hi) if hi > lo else lo
        if self._closing.wait(delay):
            raise CapacityError("the job was stopped while waiting for an instance")
        if self.rng.random() < self.config.local_capacity_failure:
            raise CapacityError(
                f"InsufficientInstanceCapacity: the local market has no {spec.instance_type} right now"
            )
        if self.nodes is not None:
            self._check_capacity()
        with self._lock:  # several instances of one job launch at once: one emulator
            if self.emulator is None:
                self.emulator = MetadataEmulator()
        instance_id = f"local-{uuid.uuid4().hex[:10]}"
        beacon = os.path.join(self.tmp, f"{instance_id}.beacon")
        logdir = spotnb_home() / "logs" / spec.job_id
        private_dir(logdir)
        log_path = str(logdir / f"{spec.incarnation:04d}-{instance_id}.log")
        env = {
            **os.environ,
            **spec.env,
            "SPOTNB_METADATA_URL": self.emulator.base_url(instance_id),
            "SPOTNB_BEACON": beacon,
            "SPOTNB_INSTANCE_ID": instance_id,
            "SPOTNB_INSTANCE_LOG": log_path,  # the agent caps it (spotnb.runtime.logcap)
            "PYTHONUNBUFFERED": "1",
        }
        if spec.job_key:  # the key hand-off: only in the agent's environment (owner-readable)
            env[KEY_ENV] = spec.job_key
        if self.config.local_upload_bps:
            env["SPOTNB_UPLOAD_BPS"] = str(self.config.local_upload_bps)
        link = (self.config.local_link_delay or {}).get(spec.slot)
        if link:
            env["SPOTNB_LINK_DELAY"] = str(link)
        command = [sys.executable if c == "python" else c for c in spec.command]
        zygote = self._zygote(spec)
        if zygote is not None and not zygote.wait_ready():  # outside the lock: close() may run
            zygote = None
        with self._lock:  # close() must never miss an instance started while it runs
            if self._closing.is_set():
                raise CapacityError("the job was stopped while waiting for an instance")
            proc: subprocess.Popen | Forked | None = None
            if zygote is not None:  # the same process as below, forked warm (zygote.py)
                proc = zygote.spawn(spec.command[len(_AGENT) :], env, log_path, f"{beacon}.claim")
            if proc is None:
                with open(log_path, "ab") as log:
                    # umask: the agent's checkpoints and spool in a local store are owner-only
                    proc = subprocess.Popen(
                        command,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                        umask=0o077,
                    )
            self._procs[instance_id] = proc
        now = time.time()
        with self._lock:
            if self.t0 is None:
                self.t0 = now
            if self.nodes is not None and self._watcher is None:
                self._watcher = threading.Thread(target=self._watch_nodes, name="spotnb-nodes", daemon=True)
                self._watcher.start()
        zone = self._zone(spec.region)
        injector = self._schedule_kill(instance_id, proc, beacon, now, spec.slot, zone)
        self._injectors[instance_id] = injector
        return Instance(
            id=instance_id,
            provider="local",
            region=zone,
            instance_type=spec.instance_type,
            launched_at=now,
            info={
                "pid": proc.pid,
                "job_id": spec.job_id,
                "log": log_path,
                "beacon": beacon,
                "kill_at": injector.kill_at if math.isfinite(injector.kill_at) else None,
                "trigger": injector.trigger,
                **({"price_schedule": schedule} if (schedule := self.price_schedule(zone)) else {}),
            },
        )

    def _schedule_kill(
        self,
        instance_id: str,
        proc: subprocess.Popen | Forked,
        beacon: str,
        now: float,
        slot: int = 0,
        zone: str = "local",
    ) -> Injector:
        assert self.emulator is not None and self.t0 is not None
        trigger, kill_at = None, math.inf
        with self._lock:  # several instances of one job launch at once
            entry = next((e for e in self.schedule if e.get("instance", slot) == slot), None)
            if entry is not None:
                self.schedule.remove(entry)
        if entry is not None:
            entry = {k: v for k, v in entry.items() if k != "instance"}
            if "step" in entry:
                trigger = entry
            else:
                kill_at = now + entry["after"]
        elif not self.config.local_schedule:
            zone_mttp = (self.config.local_regions or {}).get(zone, {}).get("mttp")
            process = Exponential(zone_mttp) if zone_mttp else self.process
            kill_at = self.t0 + process.next_preemption(now - self.t0, self.rng)
        holder: dict[str, Injector] = {}
        self.emulator.register(instance_id, on_ack=lambda: holder["inj"].kill_now("acknowledged"))
        emulator = self.emulator

        def notify(deadline: float) -> None:
            emulator.notify(instance_id, deadline)

        injector = Injector(proc, beacon, kill_at=kill_at, grace=self.grace, trigger=trigger, notify=notify)
        holder["inj"] = injector
        return injector

    # -- a trace replayed as node counts (jobs on several instances) -------------------------
    def _market_time(self) -> float:
        return time.time() - (self.t0 if self.t0 is not None else time.time())

    def _live(self) -> list[str]:
        """The job's instances still running, oldest first."""
        return [
            i
            for i, p in self._procs.items()
            if p.poll() is None
            and i not in self._terminated
            and self._injectors.get(i) is not None
            and self._injectors[i].kill is None
        ]

    def _check_capacity(self) -> None:
        assert self.nodes is not None
        t = self._market_time()
        cap = self.nodes.capacity(t)
        with self._lock:
            live = len(self._live())
        if live >= cap:
            raise CapacityError(
                f"InsufficientInstanceCapacity: trace {self.nodes.trace.name!r} has room for {cap} "
                f"of the job's instances at trace time {self.nodes.trace_time(t):.0f} s ({live} live)"
            )

    def _watch_nodes(self) -> None:
        """Kill the newest instances while the job has more than the trace's count allows."""
        assert self.nodes is not None
        while not self._closing.wait(0.1):  # the market's clock: a trace is a function of time
            cap = self.nodes.capacity(self._market_time())
            with self._lock:
                live = self._live()
            for instance_id in live[cap:][::-1]:
                injector = self._injectors.get(instance_id)
                if injector is not None:
                    injector.kill_now("preempted")

    def host_controller(self, job_id: str, store_url: str, job_key: str) -> None:
        """The market is this machine: it hosts the controller as a process of its own session
        (it outlives the notebook's kernel), unless one holds the job's lease already. The key
        is where the controller reads it (this machine's spotnb home)."""
        from spotnb.control.jobdb import JobDB
        from spotnb.control.supervise import start_controller

        if not JobDB().controller_alive(job_id):
            start_controller(job_id, store_url)

    def coordinator(self, job_id: str, min_replicas: int) -> str:
        """torchft's lighthouse as a process of this market (like the metadata server), so it
        outlives every local instance; it ends with the market (`close`, or its stdin pipe
        closing when the controller's process dies). Its log: `logs/<job>/lighthouse.log`."""
        with self._lock:
            if self._lighthouse is not None and self._lighthouse.poll() is None:
                assert self._lighthouse_addr is not None
                return self._lighthouse_addr
            if self._lighthouse is not None:  # it died: a new one on the same port, which the
                for pipe in (self._lighthouse.stdin, self._lighthouse.stdout):  # replicas retry
                    if pipe is not None:
                        pipe.close()
            port = self._lighthouse_addr.rsplit(":", 1)[1] if self._lighthouse_addr else "0"
            logdir = spotnb_home() / "logs" / job_id
            private_dir(logdir)
            with open(logdir / "lighthouse.log", "ab") as log:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "spotnb.runtime.group.lighthouse",
                        "--min-replicas",
                        str(min_replicas),
                        "--bind",
                        f"[::]:{port}",
                        "--job",
                        job_id,
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    start_new_session=True,
                    env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
                )
            assert proc.stdout is not None
            line = proc.stdout.readline().decode(errors="replace").strip()
            if not line.startswith("LIGHTHOUSE "):
                proc.kill()
                proc.wait()
                raise RuntimeError(
                    f"the local market's lighthouse did not start (see {logdir / 'lighthouse.log'}); "
                    "is torchft installed? pip install 'spotnb[elastic]'"
                )
            self._lighthouse, self._lighthouse_addr = proc, line.split(" ", 1)[1]
            return self._lighthouse_addr

    def inject(self, instance: Instance, grace: float | None = None) -> None:
        """Preempt `instance` now (fault injection): notice, then the kill `grace` seconds later."""
        injector = self._injectors[instance.id]
        injector.kill_at = time.time() + (self.grace if grace is None else grace)

    def _describe(self, instance: Instance) -> InstanceStatus:
        proc = self._procs.get(instance.id)
        if proc is None:
            return InstanceStatus(InstanceState.UNKNOWN)
        code = proc.poll()
        if code is None:
            return InstanceStatus(InstanceState.RUNNING)
        injector = self._injectors.get(instance.id)
        k = injector.settled() if injector is not None else None
        if k is not None:
            return InstanceStatus(
                InstanceState.PREEMPTED,
                code,
                {"phase": k.phase, "step": k.step, "noticed": k.noticed, "at": k.at, "reason": k.reason},
            )
        if instance.id in self._terminated:
            return InstanceStatus(InstanceState.TERMINATED, code)
        return InstanceStatus(InstanceState.EXITED, code)

    def _terminate(self, instance: Instance) -> None:
        proc = self._procs.get(instance.id)
        injector = self._injectors.get(instance.id)
        if injector is not None:
            injector.cancel()
        if proc is not None and proc.poll() is None:
            self._terminated.add(instance.id)
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
            proc.wait()
        if self.emulator is not None:
            self.emulator.forget(instance.id)

    def resume_state(self, launched: int, first_launch: float) -> None:
        self.schedule = self.schedule[launched:]
        self.t0 = first_launch

    def reclaim(self, record: dict[str, Any]) -> Instance | None:
        """An orphan of a dead controller has no injector or metadata server any more (they
        lived in that controller): end it, and let the job resume from its checkpoint."""
        pid = int((record.get("info") or {}).get("pid", 0))
        if pid and _is_agent_of(pid, record):
            try:
                os.killpg(pid, 9)
            except ProcessLookupError:
                pass
            deadline = time.time() + 10
            while _is_agent_of(pid, record) and time.time() < deadline:
                time.sleep(0.05)
        return None

    def billing(self, zone: str | None) -> Billing:
        return self.config.local_zone_billing(zone)

    def price_schedule(self, zone: str | None) -> list[list[float]] | None:
        """`zone`'s price schedule in wall times (`[[t, $/h], ...]`), for the ledger to bill a
        price that changes under a running instance piecewise; None: a constant price."""
        schedule = (self.config.local_regions or {}).get(zone or "", {}).get("price")
        if not schedule or len(schedule) < 2 or self.t0 is None:
            return None
        return [[self.t0 + float(at), float(p)] for at, p in schedule]

    def _plan_launch(self, spec: LaunchSpec) -> dict[str, Any]:
        """The instance's command, and the Config's prices where given: the market bills them
        instead of the table's, and the dry run shows them (`spotnb.views.plan_view`)."""
        plan = super()._plan_launch(spec)
        fixed = {"spot": self.config.price_spot, "on_demand": self.config.price_on_demand}
        if any(v is not None for v in fixed.values()):
            plan["price_fixed"] = fixed
        return plan

    def _prices(self, instance_type: str, regions: list[str] | None) -> dict[str, Price]:
        """The table's price, or each zone's (`local_regions`) at this moment of the market
        (seconds since its first launch: a zone's price schedule runs from submission);
        `Config.price_spot` / `price_on_demand` replace the table's where given."""
        table = lookup_price(instance_type)
        fixed_spot, fixed_od = self.config.price_spot, self.config.price_on_demand
        od = fixed_od if fixed_od is not None else (table.on_demand if table is not None else None)
        zones = self.config.local_regions
        if not zones:
            spot = fixed_spot if fixed_spot is not None else (table.spot if table is not None else None)
            if spot is None or od is None:
                return {}
            return {"local": Price(spot, od, _source(table, fixed_spot, fixed_od) + ", local market")}
        t = self._market_time()
        out: dict[str, Price] = {}
        for zone in zones:  # Config.price_spot and zones are not given together (check_config)
            if regions and zone not in regions:
                continue
            spot = self.config.local_zone_price(zone, t)
            if spot is not None:
                said = f"local market zone {zone}, its price at {t:.0f} s"
                if fixed_od is not None:
                    said += "; on demand: Config.price_on_demand"
                out[zone] = Price(spot, od if od is not None else 0.0, said)
            elif table is not None and od is not None:
                source = _source(table, None, fixed_od)
                out[zone] = Price(table.spot, od, f"{source}, local market zone {zone}")
        return out

    def close(self) -> None:
        with self._lock:
            self._closing.set()
        for injector in self._injectors.values():  # first: the ends below are not theirs
            injector.cancel()
        for instance_id, proc in list(self._procs.items()):
            if proc.poll() is None:
                self._terminated.add(instance_id)
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
                proc.wait()
        with self._lock:
            zygote, self._zygote_proc = self._zygote_proc, None
        if zygote is not None:
            zygote.close()
        if self.emulator is not None:
            self.emulator.close()
            self.emulator = None
        with self._lock:
            lighthouse, self._lighthouse = self._lighthouse, None
        if lighthouse is not None:
            lighthouse.kill()
            lighthouse.wait()
            for pipe in (lighthouse.stdin, lighthouse.stdout):
                if pipe is not None:
                    pipe.close()
        with self._lock:
            tmp, self._tmp = self._tmp, None
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


_TMP_PREFIX = "spotnb-local-"
#: the command of an instance the zygote can fork (the controller's LaunchSpec.command)
_AGENT = ["python", "-m", "spotnb.runtime.agent"]


def _source(table: Price | None, fixed_spot: float | None, fixed_od: float | None) -> str:
    """Where a local price comes from: the Config's fields that set it, then the table."""
    said = [
        f"Config.{name}"
        for name, v in (("price_spot", fixed_spot), ("price_on_demand", fixed_od))
        if v is not None
    ]
    if table is not None and (fixed_spot is None or fixed_od is None):
        said.append(table.source)
    return "; ".join(said) if said else "unpriced"


def _is_agent_of(pid: int, record: dict[str, Any]) -> bool:
    """True if `pid` is still a live (not zombie) agent of this job (pids get reused)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().split(b"\0")
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    job = str((record.get("info") or {}).get("job_id") or "").encode()
    # an instance forked from the market's zygote has the zygote's command line
    started = b"spotnb.runtime.agent" in cmd or b"spotnb.runtime.zygote" in cmd
    return state != b"Z" and started and (not job or job in cmd)
