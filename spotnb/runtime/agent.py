"""The process that runs on a spot instance: `python -m spotnb.runtime.agent --store URL --job ID
--incarnation N`.

It reads the job spec from the store, waits until the previous incarnation is over (so a
replacement can be allocated and prepared during the old one's grace period), runs the user's
function with a `Context`, streams events, and exits with a code the controller reads:
0 done, 1 the user's function raised, 3 evacuated after an emergency checkpoint, 5 another
process of its replica group died (`Config.procs_per_instance`, `local_group.EXIT_GROUP_LOST`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from spotnb.core import protocol as ev
from spotnb.core.signing import BadSignature, key_from_env, seal, unseal
from spotnb.core.spec import JobSpec, RuntimeSettings, SpecError, load_spec
from spotnb.runtime import logcap

_STARTED = time.time()
log = logging.getLogger("spotnb.agent")

EXIT_DONE, EXIT_USER_ERROR, EXIT_EVACUATED = 0, 1, 3
#: the replacement gave up waiting for the instance it replaces (`WAIT_FOR_PREVIOUS`): it ran
#: none of the job, so the controller does not take it for a user error or a crash
EXIT_GAVE_UP = 4
#: how long a replica other than 0 waits for replica 0's result before writing its own
RESULT_WAIT_S = float(os.environ.get("SPOTNB_RESULT_WAIT", "30"))
# seconds a replacement waits for the instance it replaces to end (tests: shorter)
WAIT_FOR_PREVIOUS = float(os.environ.get("SPOTNB_WAIT_FOR_PREVIOUS", "900"))
# a move (Config.migrate) has no market deadline; the save before it must end well before the
# new instance gives up waiting for this one (WAIT_FOR_PREVIOUS)
MOVE_DEADLINE = 600.0

__all__ = ["main", "Agent", "EXIT_DONE", "EXIT_USER_ERROR", "EXIT_EVACUATED", "EXIT_GAVE_UP"]


class Agent:
    def __init__(self, store_url: str, job_id: str, incarnation: int) -> None:
        from spotnb.core.events import EventWriter
        from spotnb.core.store import Store

        self.store = Store(store_url)
        self.job_id, self.incarnation = job_id, incarnation
        # the job key authenticates the spec, the function and each checkpoint; it leaves the
        # environment here, before any user code could see it or pass it to a child process
        self.key = key_from_env()
        self.job_spec: JobSpec | None = None
        self.spec: dict[str, Any] = RuntimeSettings().model_dump()  # until the signed spec is read
        self.inc = json.loads(
            self.store.read_bytes(self.store.job(job_id, "incarnations", f"{incarnation:04d}.json"))
        )
        instance = os.environ.get("SPOTNB_INSTANCE_ID", "").replace("-", "_")
        self.events = EventWriter(
            self.store, job_id, incarnation, f"agent_{instance}" if instance else "agent"
        )
        self.ctx: Any = None
        self._stop = threading.Event()
        self._last_progress: tuple | None = None
        self._last_beat = time.time()
        self._flush_lock = threading.RLock()
        self._bad_metrics: set[str] = set()
        self.local_group: Any = None  # Config.procs_per_instance > 1: the other ranks (local_group)

    # -- event plumbing --------------------------------------------------------------------
    _FLUSH_NOW = frozenset(
        {"checkpoint", "resumed", "ready", "evacuating", "checkpoint_failed", "emergency_skipped"}
    )

    def emit(self, event: ev.Event) -> None:
        self.events.emit(event)
        if event.kind in self._FLUSH_NOW:
            self.flush()

    def flush(self) -> None:
        """Move buffered metrics and progress into events and write them. Called from several
        threads (flusher, checkpoint worker, notice watcher, training), one at a time."""
        with self._flush_lock:
            self._flush()

    def flush_through(self, step: int) -> None:
        """Make every row and the progress logged so far durable, or raise (the checkpoint
        worker calls this before it commits the state of `step`; see Checkpointer)."""
        with self._flush_lock:
            self._flush(strict=True)

    def _flush(self, strict: bool = False) -> None:
        ctx = self.ctx
        if ctx is not None:
            rows = []
            while ctx.rows:
                rows.append(ctx.rows.popleft())
            if rows:
                for row in rows:
                    for key, value in row.items():
                        if type(value) is not float or not math.isfinite(value):
                            row[key] = self._scalar(key, value, row["step"])
                self.events.emit(ev.Metrics(rows=rows))
            progress = ctx.progress()
            key = (progress["step"], progress["save_s"])
            if key != self._last_progress:
                self._last_progress = key
                self.events.emit(ev.Progress(**progress))
                self._last_beat = time.time()
        if time.time() - self._last_beat >= self.spec.get("heartbeat_interval", 5.0):
            self.events.emit(ev.Heartbeat(step=ctx.step_index if ctx else None))
            self._last_beat = time.time()
        try:
            self.events.flush()
        except Exception as exc:  # noqa: BLE001 - kept pending, retried on the next tick
            if strict:
                raise
            log.warning("event flush failed, will retry: %r", exc)

    def _scalar(self, key: str, value: Any, step: int) -> Any:
        """A metric value the event log can carry: a finite float (tensors and numpy scalars
        converted), an int that fits a float exactly enough, a string, or None. NaN, an
        infinity or a number beyond float range becomes None (JSON cannot carry it and the lab
        panel's JSON.parse would reject it) with one warning per metric naming the first step:
        a diverged loss is news the user wants. Anything else is dropped, once said."""
        if value is None or isinstance(value, (str, bool)):
            return value
        if isinstance(value, int):
            if abs(value) <= 2**53:
                return value
            try:
                return float(value)
            except OverflowError:
                return self._bad(key, step, "an integer beyond float range")
        try:
            number = float(value)
        except OverflowError:
            return self._bad(key, step, "a number beyond float range")
        except (TypeError, ValueError, RuntimeError):
            return self._bad(key, step, f"a {type(value).__name__} that is not a single number")
        if math.isfinite(number):
            return number
        return self._bad(key, step, repr(number))

    def _bad(self, key: str, step: int, what: str) -> None:
        if key not in self._bad_metrics:
            self._bad_metrics.add(key)
            self.events.emit(
                ev.JobWarning(
                    metric=key,
                    step=step,
                    message=f"ctx.log({key}=...) got {what} at step {step}; it is shown as a gap "
                    "(later such values of this metric are not reported again)",
                )
            )
        return None

    def _flusher(self) -> None:
        interval = self.spec.get("flush_interval", 0.5)
        while not self._stop.wait(interval):
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 - the heartbeat must go on
                log.warning("flush failed: %r", exc)

    # -- run ---------------------------------------------------------------------------------
    def wait_for_previous(self) -> None:
        """The replacement may start while the preempted instance saves; it must not restore
        before that instance is gone (its end marker is written by the controller)."""
        # one-instance jobs: the one before; several instances: the controller lists what a
        # cold start must wait for (a replica joining live peers waits for nobody)
        previous = self.inc.get("wait_for", [self.incarnation - 1] if self.incarnation > 1 else [])
        for n in previous:
            marker = self.store.job(self.job_id, "incarnations", f"{int(n):04d}.end")
            deadline = time.time() + WAIT_FOR_PREVIOUS
            while not self.store.exists(marker):
                if time.time() > deadline:  # its controller is gone: do not idle on a paid instance
                    raise RuntimeError(
                        f"incarnation {n} never ended (no end marker "
                        f"after {WAIT_FOR_PREVIOUS:.0f} s); its controller may have died"
                    )
                time.sleep(0.05 if self.store.local else 1.0)
                self.store.invalidate()
            ended = json.loads(self.store.read_bytes(marker))
            self.inc["high_water"] = max(int(self.inc.get("high_water", 0)), int(ended.get("high_water", 0)))
            self.inc["checkpointed"] = bool(self.inc.get("checkpointed")) or bool(
                ended.get("checkpointed", True)
            )

    def _checkpoint_stores(self) -> tuple[Any, list[Any]]:
        """(the store this instance's saves go to, every store to restore from): the home store
        alone, unless the controller places the checkpoint (`Config.regional_stores`,
        `spotnb.market.regional`): then its document for this incarnation, written once the newest
        checkpoint was copied to this zone's store (or left where it is), says which."""
        from spotnb.core.store import Store

        if not self.inc.get("ckpt_doc"):
            return self.store, []
        path = self.store.job(self.job_id, "incarnations", f"{self.incarnation:04d}.ckpt.json")
        deadline = time.time() + WAIT_FOR_PREVIOUS
        while not self.store.exists(path):
            if time.time() > deadline:
                raise RuntimeError(
                    f"the controller never said where incarnation {self.incarnation}'s checkpoint "
                    f"is (no {path} after {WAIT_FOR_PREVIOUS:.0f} s); it may have died"
                )
            time.sleep(0.05 if self.store.local else 1.0)
            self.store.invalidate()
        try:
            doc = json.loads(self.store.read_bytes(path))
        except ValueError as exc:
            doc = exc
        if not (
            isinstance(doc, dict)
            and isinstance(doc.get("write"), str)
            and isinstance(doc.get("read", []), list)
        ):  # a string for "read" would make a store of each character
            raise RuntimeError(
                f"{path} is damaged ({doc!r:.120}): this instance gives up, the next one gets a new "
                "document from the controller"
            )
        opened = {self.store.url: self.store}
        for url in [doc["write"], *doc.get("read", [])]:
            if isinstance(url, str) and url and url.rstrip("/") not in opened:
                try:
                    opened[url.rstrip("/")] = Store(url)
                except Exception as exc:  # noqa: BLE001 - a region's store out of reach now
                    self.emit(ev.JobWarning(message=f"checkpoint store {url} cannot be opened: {exc!r}"))
        if self.local_group is not None:
            # a group's other ranks restore from the home store alone (runtime/group/local_rank.py):
            # rank 0 must restore what they restore, so the whole group stays at home (Config
            # refuses regional_stores with procs_per_instance > 1; a VM with more GPUs than its
            # type was known to have may still start a group)
            self.emit(ev.JobWarning(message="regional_stores: a group of processes uses the home store only"))
            return self.store, []
        write = opened.get(str(doc.get("write", "")).rstrip("/"))
        if write is None:  # its store is gone: save at home rather than not at all
            write = self.store
            self.emit(ev.JobWarning(message=f"saving in the home store: {doc.get('write')} cannot be opened"))
        return write, [s for s in opened.values() if s is not write]

    def run(self) -> int:
        import cloudpickle

        from spotnb.policy import resolve_policy
        from spotnb.runtime.beacon import Beacon
        from spotnb.runtime.checkpoint.checkpointer import Checkpointer
        from spotnb.runtime.context import Context, Evacuate, GroupFinished, set_current
        from spotnb.runtime.group.torchrun import group_from
        from spotnb.runtime.notice import make_watcher
        from spotnb.runtime.script.runner import ScriptFailed, ScriptRunner

        self.emit(
            ev.Started(
                pid=os.getpid(),
                host=os.uname().nodename,
                python=sys.version.split()[0],
                boot_s=time.time() - _STARTED,
            )
        )
        threading.Thread(target=self._flusher, name="spotnb-flusher", daemon=True).start()
        refused = self._load_spec()
        if refused:
            return self._fail(refused)
        try:
            self._enter_workdir()
        except (OSError, ValueError) as exc:
            return self._fail(str(exc), exc)
        try:
            blob = self.store.read_bytes(self.store.job(self.job_id, "fn.pkl"))
            code = unseal(self.key, self.job_id, "fn.pkl", blob)  # verified before it is unpickled
        except BadSignature as exc:
            return self._fail(
                f"refusing to load the function: {exc}; resubmit the job (or resume it with a new fn)", exc
            )
        except OSError as exc:
            return self._fail(f"could not read the function from the store: {exc}", exc)
        try:
            payload = cloudpickle.loads(code)
        except Exception:  # noqa: BLE001
            return self._fail("could not load the function on the instance")
        policy = resolve_policy(payload.get("policy") or self.spec.get("policy") or "hedged")
        self._start_local_group()  # they load the job meanwhile
        beacon = Beacon(os.environ.get("SPOTNB_BEACON"))
        upload_bps = float(os.environ["SPOTNB_UPLOAD_BPS"]) if os.environ.get("SPOTNB_UPLOAD_BPS") else None
        try:
            self.wait_for_previous()
        except RuntimeError as exc:
            self.emit(ev.JobWarning(message=str(exc)))
            return self._finish(EXIT_GAVE_UP)
        group = self.local_group.join() if self.local_group is not None else None
        try:
            write_store, read_stores = self._checkpoint_stores()
        except RuntimeError as exc:
            self.emit(ev.JobWarning(message=str(exc)))
            return self._finish(EXIT_GAVE_UP)
        checkpointer = Checkpointer(
            write_store,
            self.job_id,
            self.incarnation,
            self.emit,
            beacon,
            keep_last=self.spec.get("keep_last", 2),
            upload_bps=upload_bps,
            before_commit=self.flush_through,
            key=self.key,
            snapshot_memory=self.spec.get("snapshot_memory"),  # Config.snapshot_memory
            read_stores=read_stores,
        )
        market = self.inc.get("market", {})
        notice_cfg = self.inc.get("notice", {})
        watcher = None
        self.ctx = ctx = Context(
            job_id=self.job_id,
            incarnation=self.incarnation,
            checkpointer=checkpointer,
            policy=policy,
            emit=self.emit,
            flush=self.flush,
            beacon=beacon,
            market=market,
            save_every=self.spec.get("save_every"),
            high_water=int(self.inc.get("high_water", 0)),
            checkpointed=bool(self.inc.get("checkpointed", False)),
            elastic=self._elastic(),
            group=group,
        )
        if notice_cfg.get("format"):

            def on_notice(notice: Any) -> None:
                self.emit(
                    ev.Notice(
                        deadline=notice.deadline,
                        source=notice.source,
                        action=notice.action,
                        time_left=notice.deadline - time.time(),
                    )
                )
                ctx._receive_notice(notice)
                self.flush()

            def on_hint(hint: dict[str, Any]) -> None:
                fields = dict(hint)
                self.emit(
                    ev.Hint(
                        source=str(fields.pop("source", "")), hint=str(fields.pop("hint", "")), extra=fields
                    )
                )
                ctx._request_save()  # elevated risk: checkpoint now, while it is cheap to

            watcher = make_watcher(
                notice_cfg["format"],
                base_url=os.environ.get("SPOTNB_METADATA_URL") or notice_cfg.get("base_url"),
                poll=float(self.spec.get("notice_poll", 1.0)),
                grace=float(market.get("grace", 30.0)),
                on_notice=on_notice,
                on_hint=on_hint,
            )
            ctx._saves.acknowledge = watcher.acknowledge
            watcher.start()
        if self.inc.get("move_poll"):
            threading.Thread(
                target=self._watch_for_move,
                args=(ctx, float(self.inc["move_poll"])),
                name="spotnb-move",
                daemon=True,
            ).start()
        signal.signal(signal.SIGTERM, lambda *_: self._sigterm(ctx, market))
        set_current(ctx)  # spotnb.ctx() from anywhere in the function
        if self.job_spec is None or self.job_spec.script is None:
            from spotnb.integrations.autohf import install as hf_autoinstall

            hf_autoinstall(ctx)  # a Trainer's plain train() runs under spotnb (nothing imported)
        script = self.job_spec.script if self.job_spec is not None else None
        try:
            if script is not None:
                result = ScriptRunner(
                    ctx,
                    script,
                    self.emit,
                    job_id=self.job_id,
                    incarnation=self.incarnation,
                    group=group_from(self.spec, self.inc, self.job_id),  # torchrun (several instances)
                ).run()
            else:
                result = payload["fn"](ctx)
        except Evacuate:
            checkpointer.close()
            return self._finish(EXIT_EVACUATED)
        except GroupFinished:  # joined a group that had just finished: nothing to train
            checkpointer.close()
            # done only once the peers' result is in the store: a done ends the job
            if self._wait_for(self.store.job(self.job_id, "result.pkl"), 2 * RESULT_WAIT_S):
                self.emit(ev.Done(result="", step=ctx.step_index))
                return self._finish(EXIT_DONE)
            self.emit(
                ev.JobWarning(
                    message="this replica joined after the last step, and no replica's result "
                    "reached the store: it ends without one (the controller treats it as crashed)"
                )
            )
            return self._finish(EXIT_USER_ERROR)
        except BaseException as exc:  # noqa: BLE001 - report everything the user's code raised
            if self.local_group is not None:
                self.local_group.settle()  # another rank died under it: the group is lost
            checkpointer.wait(timeout=30)
            checkpointer.close()
            if isinstance(exc, ScriptFailed):  # the script's stderr, not the agent's traceback
                return self._fail(str(exc), exc, tb=exc.tail, exc_type=exc.exc_type)
            return self._fail(f"{type(exc).__name__}: {exc}", exc)
        ctx.wait_saves()  # a sharded job's save in the background
        checkpointer.wait()
        try:
            # a script's result arrives pickled (its classes may not even import here)
            pickled = result.pickled if script is not None else cloudpickle.dumps(result)
        except Exception as exc:  # noqa: BLE001 - cloudpickle raises many kinds
            kind = type(result)
            checkpointer.close()
            return self._fail(
                f"the function returned a {kind.__module__}.{kind.__qualname__} that "
                f"cannot be pickled to send back ({type(exc).__name__}: {exc}); return "
                "plain values, tensors or state_dicts instead",
                exc,
            )
        path = self.store.job(self.job_id, "result.pkl")
        # on several instances replica 0 returns the job's result; the others hold the same
        # state and write theirs only if replica 0's has not landed in time (it died after the
        # last commit), so a finished job never ends without a result
        primary = result.primary if script is not None else True  # torchrun: rank 0's instance
        writes = (ctx.replica == 0 and primary) or not self._wait_for(path, RESULT_WAIT_S)
        if writes:
            assert self.key is not None  # _load_spec refused the job otherwise
            self.store.write_bytes(path, seal(self.key, self.job_id, "result.pkl", pickled))
        self.emit(ev.Done(result="result.pkl" if writes else "", step=ctx.step_index))
        checkpointer.close()
        if watcher:
            watcher.stop()
        return self._finish(EXIT_DONE)

    def _wait_for(self, path: str, timeout: float) -> bool:
        """Whether `path` appears in the store within `timeout` seconds (polled: a store has
        no notifications)."""
        deadline = time.monotonic() + timeout
        while True:
            self.store.invalidate()
            if self.store.exists(path):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def _elastic(self) -> Any:
        """The job's group, when it trains on several instances (None: one instance)."""
        if int(self.spec.get("instances", 1)) <= 1:
            return None
        if self.job_spec is not None and self.job_spec.script is not None:
            return None  # a script on several instances runs under torchrun (torchrun_group)
        from spotnb.core.sync import parse_sync
        from spotnb.runtime.group.elastic import Elastic

        return Elastic(
            lighthouse=str(self.inc["lighthouse"]),
            slot=int(self.inc.get("slot", 0)),
            instances=int(self.spec["instances"]),
            min_instances=int(self.spec.get("min_instances", 1)),
            join=bool(self.inc.get("join", False)),
            sync=parse_sync(self.spec.get("sync", "ddp")),
        )

    def _start_local_group(self) -> None:
        """Start ranks 1.. of this instance's replica group (`Config.procs_per_instance`)."""
        from spotnb.runtime.group.local import LocalGroup, resolve_procs

        procs = resolve_procs(self.spec.get("procs_per_instance"))
        if procs <= 1 or (self.job_spec is not None and self.job_spec.script is not None):
            return
        assert self.key is not None  # _load_spec refused the job otherwise
        argv = ["--store", self.store.url, "--job", self.job_id, "--incarnation", str(self.incarnation)]
        self.local_group = LocalGroup(procs, argv, self.key, self._group_ended)
        self.local_group.start()

    def _group_ended(self, code: int, event: ev.Event) -> None:
        """Another rank ended the group (watcher thread): say why, and leave as one."""
        self.emit(event)
        os._exit(self._finish(code))

    def _load_spec(self) -> str | None:
        """Read and verify the job spec; the reason to refuse the job, or None."""
        if self.key is None:
            return (
                "no job key reached this instance (SPOTNB_JOB_KEY): it cannot verify what it "
                "would run; the controller hands the key over at launch"
            )
        try:
            spec = load_spec(self.store, self.job_id, self.key)
        except SpecError as exc:
            return f"refusing the job spec: {exc}"
        if spec.legacy:
            return (
                "this job was submitted by an older spotnb and is not signed; an instance runs "
                "only signed jobs: submit it again"
            )
        self.job_spec = spec
        self.spec = {**spec.runtime.model_dump(), "cwd": spec.cwd}
        return None

    def _enter_workdir(self) -> None:
        """Work where the job's files belong: `SPOTNB_WORKDIR` (a cloud VM's boot script sets
        it), else the notebook's own directory when it exists here (the local market); then lay
        the shipped files out there."""
        from spotnb.core.files import lay_out

        assert self.job_spec is not None
        workdir = os.environ.get("SPOTNB_WORKDIR") or (
            self.job_spec.cwd if self.job_spec.cwd and os.path.isdir(self.job_spec.cwd) else ""
        )
        if workdir:
            os.makedirs(workdir, exist_ok=True)
            os.chdir(workdir)
        sys.path.insert(0, os.getcwd())
        if self.job_spec.files:
            written = lay_out(self.store, self.job_spec.files, os.getcwd())
            self.emit(ev.Files(count=len(self.job_spec.files), written=len(written), workdir=os.getcwd()))

    def _watch_for_move(self, ctx: Any, poll: float) -> None:
        """The controller asks this instance to move (`Config.migrate="best-price"`) by writing
        `incarnations/<n>.move` once the new instance runs: then it saves at the next step
        boundary and leaves, like after a notice but with no market deadline (and no notice
        event: nothing preempts it). A replica of a job on several instances is asked once its
        successor has joined the group: it saves nothing and leaves the quorum at the boundary
        (`SaveScheduler._on_notice_at_boundary`), so its peers train on without a failed step."""
        from spotnb.runtime.notice import Notice

        path = self.store.job(self.job_id, "incarnations", f"{self.incarnation:04d}.move")
        save = self.store.job(self.job_id, "incarnations", f"{self.incarnation:04d}.save")
        saved = False
        while not self._stop.wait(poll):
            try:
                self.store.invalidate()
                asked = self.store.exists(path)
                # `.save`: a job on several instances is ending on another replica's failure:
                # checkpoint the step reached before this replica is ended (`FleetController`)
                if not saved and self.store.exists(save):
                    saved = True
                    ctx._request_save()
            except OSError:  # the store is briefly unreachable: look again
                continue
            if asked:
                if ctx.notice is None:  # a real notice first: that one decides
                    ctx._receive_notice(
                        Notice(deadline=time.time() + MOVE_DEADLINE, source="move", action="move")
                    )
                return

    def _sigterm(self, ctx: Any, market: dict[str, Any]) -> None:
        """A soft shutdown (GCP's ACPI soft-off, a local `terminate`) counts as a notice. The
        handler runs between two bytecodes of the training thread, so it only records the
        notice; the event is written from another thread."""
        from spotnb.runtime.notice import Notice

        if ctx.notice is None:
            grace = float(market.get("grace", 30.0))
            notice = Notice(deadline=time.time() + grace, source="sigterm", action="SIGTERM")
            ctx._receive_notice(notice)
            event = ev.Notice(deadline=notice.deadline, source="sigterm", action="SIGTERM", time_left=grace)
            threading.Thread(target=self.emit, args=(event,), daemon=True).start()

    def _fail(
        self,
        message: str,
        exc: BaseException | None = None,
        *,
        tb: str | None = None,
        exc_type: str | None = None,
    ) -> int:
        if tb is None:
            tb = "".join(traceback.format_exception(exc)) if exc else traceback.format_exc()
        kind = exc_type or (type(exc).__name__ if exc else "LoadError")
        self.emit(ev.Error(message=message, exc_type=kind, traceback=tb))
        return self._finish(EXIT_USER_ERROR)

    def _finish(self, code: int) -> int:
        """Stop the flusher and write the last events, retrying for a while: a lost `done` or
        `error` would make the controller misread how the incarnation ended."""
        self._stop.set()
        if self.local_group is not None:  # the others finish or leave at the same step
            self.local_group.end(timeout=30.0 if code in (EXIT_DONE, EXIT_EVACUATED) else 0.0)
        deadline = time.time() + 60
        while True:
            try:
                self.flush()
                if not self.events.pending:
                    break
            except Exception as exc:  # noqa: BLE001
                log.warning("final flush failed, retrying: %r", exc)
            if time.time() > deadline:
                break
            time.sleep(1.0)
        return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spotnb-agent", description=__doc__)
    parser.add_argument("--store", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--incarnation", type=int, required=True)
    args = parser.parse_args(argv)
    logcap.install()  # the market's instance log, capped (SPOTNB_INSTANCE_LOG)
    agent = Agent(args.store, args.job, args.incarnation)
    code = agent.run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # do not wait for daemon threads (watchers long-polling)


if __name__ == "__main__":
    main()
