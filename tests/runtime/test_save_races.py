"""Regression tests for races and crash windows found in review: each test fails on the code
before its fix. They drive the runtime's real Context and Checkpointer in this process, on a
real file store; a notice "arriving during a save" is delivered from inside the save itself,
which is the interleaving the watcher thread can produce."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

import spotnb as spot
from spotnb.control.controller import Controller
from spotnb.core import protocol as ev
from spotnb.core.events import EventWriter
from spotnb.core.store import Store
from spotnb.job import Job
from spotnb.policy import resolve_policy
from spotnb.policy.base import SaveKind
from spotnb.providers.local.injector import Injector
from spotnb.runtime.beacon import Beacon
from spotnb.runtime.checkpoint.checkpointer import Checkpointer
from spotnb.runtime.context import Context, Evacuate
from spotnb.runtime.notice import Notice
from spotnb.settings.registry import get_provider_class
from tests.support.jobs import running_job_in_store


class Events(list):
    def __call__(self, event) -> None:
        self.append((event.kind, event.to_json()))

    def kinds(self) -> list[str]:
        return [k for k, _ in self]


def make_context(store_url: str, policy: str, grace: float = 120.0):
    events = Events()
    ckpt = Checkpointer(Store(store_url), "job", 1, events, Beacon(None), keep_last=2)
    ctx = Context(
        job_id="job",
        incarnation=1,
        checkpointer=ckpt,
        policy=resolve_policy(policy),
        emit=events,
        flush=lambda: None,
        beacon=Beacon(None),
        market={"mttp": 3600.0, "restart": 60.0, "grace": grace},
    )
    return ctx, ckpt, events


def _notice() -> Notice:
    return Notice(deadline=time.time() + 120, source="aws", action="terminate")


def test_snapshots_never_share_buffers_with_a_save_in_progress(store_url) -> None:
    """Each committed checkpoint holds the tensors of its own step, however fast saves come."""
    events = Events()
    ckpt = Checkpointer(Store(store_url), "job", 1, events, keep_last=1000, upload_bps=200e6)
    w = torch.zeros(2_000_000)
    for step in range(1, 80):
        w.fill_(float(step))
        ckpt.submit(ckpt.snapshot({"step": step, "w": w}, step, "periodic"))
        time.sleep(0.005)  # paces the producer like training steps; not a synchronisation
    assert ckpt.wait(60)
    manifests = ckpt.list_manifests()
    # 79 snapshots came faster than the writer commits them, so snapshots were taken while a
    # save was in progress; how many commit (a newer snapshot supersedes a waiting one) depends
    # on the machine's load: a clean-clone run under two test workers committed 4
    assert len(manifests) >= 2
    for m in manifests:
        state = torch.load(f"{ckpt.root}/{m.seq:08d}/state.pt", weights_only=False)
        assert torch.unique(state["w"]).tolist() == [float(m.step)], m.seq
    ckpt.close()


def test_a_notice_arriving_during_a_save_is_handled_at_the_next_boundary(store_url) -> None:
    ctx, ckpt, events = make_context(store_url, "static:5")

    class NoticeDuringSave(torch.nn.Linear):
        def state_dict(self, *a, **k):  # called inside the save, as a watcher thread could
            if ctx.step_index == 5 and ctx.notice is None:
                ctx._receive_notice(_notice())
            return super().state_dict(*a, **k)

    ctx.track(model=NoticeDuringSave(4, 4))
    with pytest.raises(Evacuate):
        for _ in ctx.steps(100):
            pass
    assert ctx.step_index == 6  # the very next boundary, not the next planned save at 10
    assert "emergency" in [f.get("save_kind") for k, f in events if k == "checkpoint"]
    ckpt.close()


def test_a_rebalance_save_does_not_swallow_a_notice(store_url) -> None:
    ctx, ckpt, events = make_context(store_url, "hedged")  # emergency saves fit: no plan at all

    class NoticeDuringSave(torch.nn.Linear):
        def state_dict(self, *a, **k):
            if ctx.step_index >= 50 and ctx.notice is None:
                ctx._receive_notice(_notice())
            return super().state_dict(*a, **k)

    ctx.track(model=NoticeDuringSave(4, 4))
    with pytest.raises(Evacuate):
        for step in ctx.steps(300):
            if step == 50:
                ctx._request_save(SaveKind.INSURANCE)
    assert ctx.step_index == 52
    ckpt.close()


def test_low_level_emergency_is_not_downgraded_by_a_planned_save(store_url, tmp_path) -> None:
    ctx, ckpt, events = make_context(store_url, "static:5")
    path = tmp_path / "mine.txt"
    asked = []
    with pytest.raises(Evacuate):
        for i in range(20):
            with ctx.step():
                if i == 4:  # the notice lands in the step that ends at the planned save
                    ctx._receive_notice(_notice())
            if ctx.should_save():
                asked.append(ctx._saves.save_due.value)
                path.write_text(str(i))
                ctx.backup(str(path))
    assert asked == ["emergency"]
    assert "evacuated" in events.kinds()
    ckpt.close()


def test_a_new_incarnation_never_reuses_a_checkpoint_number(store_url) -> None:
    store = Store(store_url)
    new = Checkpointer(store, "job", 2, Events())  # made while the old one still saves
    old = Checkpointer(store, "job", 1, Events())
    emergency = old.save_now(old.snapshot({"w": torch.ones(3)}, 130, "emergency"))
    mine = new.save_now(new.snapshot({"w": torch.zeros(3)}, 131, "periodic"))
    assert mine.seq > emergency.seq
    assert {m.seq for m in new.list_manifests()} >= {emergency.seq, mine.seq}
    old.close()
    new.close()


def test_a_transient_read_error_never_prunes_a_committed_checkpoint(store_url) -> None:
    store = Store(store_url)
    ckpt = Checkpointer(store, "job", 1, Events(), keep_last=2)
    for step in (10, 20, 30):
        ckpt.save_now(ckpt.snapshot({"w": torch.ones(3) * step}, step, "periodic"))
    real = store.read_bytes

    def flaky(path: str, start: int | None = None) -> bytes:  # one 503 from the object store
        if path.endswith("00000003/MANIFEST.json"):
            raise OSError("503 SlowDown")
        return real(path, start)

    store.read_bytes = flaky  # type: ignore[method-assign]
    ckpt.save_now(ckpt.snapshot({"w": torch.ones(3) * 40}, 40, "periodic"))
    store.read_bytes = real  # type: ignore[method-assign]
    assert 3 in {m.seq for m in ckpt.list_manifests()}
    ckpt.close()


def test_moving_the_kill_earlier_still_sends_the_notice(tmp_path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    notified = []
    injector = Injector(proc, str(tmp_path / "beacon"), grace=0.3, notify=notified.append)
    injector.kill_at = time.time() + 0.5  # what LocalProvider.inject does
    proc.wait(timeout=30)
    assert notified and injector.kill is not None and injector.kill.noticed


@pytest.mark.parametrize(
    "reason, status", [("done", "succeeded"), ("stopped", "stopped"), ("user_error", "failed")]
)
def test_a_restarted_controller_ends_a_job_its_predecessor_had_finished(reason, status) -> None:
    """The controller died after recording how the last instance ended, before the job's
    status: its successor must finish the job, not launch it again."""
    config = spot.Config()
    job_id = f"job-{reason}"
    store, db, api = running_job_in_store(job_id)
    ctl = EventWriter(store, job_id, 1, "ctl")
    ctl.emit(ev.Allocating(region="local", attempt=1))
    ctl.emit(
        ev.Allocated(
            instance_id="local-gone",
            region="local",
            instance_type="g4dn.xlarge",
            alloc_s=0.1,
            info={"pid": 0},
            spot_price=0.2,
            on_demand_price=0.5,
        )
    )
    ctl.emit(ev.Exited(instance_id="local-gone", reason=ev.Outcome(reason), code=0))
    ctl.flush()
    if reason == "done":
        from spotnb.core.signing import new_key, save_key, seal

        key = new_key()
        save_key(job_id, key)
        store.write_bytes(
            store.job(job_id, "result.pkl"),
            seal(key, job_id, "result.pkl", __import__("cloudpickle").dumps(7)),
        )
    job = Job(job_id, store, db)
    Controller(job, config, get_provider_class("local")(config), store, db).run()
    assert job.status == status
    assert not [e for e in job.events if e["kind"] == "allocating" and e["incarnation"] == 2]
    if reason == "done":
        assert job.result() == 7
