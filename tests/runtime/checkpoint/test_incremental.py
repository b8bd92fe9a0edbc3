"""Incremental checkpoints against a real file store: unchanged frozen tensors are referenced
(neither copied nor written again), restore verifies them, pruning keeps what is referenced,
and checkpoints of the format before still restore."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch

import spotnb as spot
from spotnb.core.store import Store
from spotnb.policy.base import Observation, emergency_feasible
from spotnb.runtime.checkpoint.checkpointer import Checkpointer
from spotnb.runtime.checkpoint.incremental import frozen_tensors
from tests.support import jobfns
from tests.support.jobs import Recorder, assert_matches_reference
from tests.support.paths import FIXTURES

pytestmark = pytest.mark.jobs

FIXTURE = FIXTURES / "ckpt_v1"
FIXTURE_V2 = FIXTURES / "ckpt_v2"


class Lora(torch.nn.Module):
    """A frozen base layer (256 KB) and a trainable low-rank adapter."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.base = torch.nn.Linear(256, 256).requires_grad_(False)
        self.down = torch.nn.Linear(256, 2, bias=False)
        self.up = torch.nn.Linear(2, 256, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.up(self.down(x))


def _train(model: Lora, opt: torch.optim.Optimizer, n: int = 1) -> None:
    for _ in range(n):
        loss = model(torch.randn(8, 256)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _state(step: int, model: Lora, opt: torch.optim.Optimizer) -> dict:
    return {
        "step": step,
        "rng": {},
        "user": {},
        "objects": {"model": model.state_dict(), "opt": opt.state_dict()},
    }


def _save(c: Checkpointer, step: int, model: Lora, opt: torch.optim.Optimizer, kind: str = "periodic"):
    snap = c.snapshot(_state(step, model, opt), step, kind, frozen=frozen_tensors([model, opt]))
    return snap, c.save_now(snap)


def _frozen_written(manifest) -> int:
    return sum(
        m["size"] for n, m in manifest.files.items() if n.startswith("tensors/") and not m.get("reused")
    )


def _setup() -> tuple[Lora, torch.optim.Optimizer]:
    model = Lora()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    _train(model, opt)
    return model, opt


@pytest.fixture(params=[None, 128 * 1024], ids=["whole", "chunked"])
def inc(request, store_url: str):
    """A checkpointer whose snapshots are copied whole, or streamed through 128 KB of buffers."""
    rec = Recorder()
    c = Checkpointer(Store(store_url), "job", 1, rec, keep_last=2, snapshot_memory=request.param)
    yield c, rec
    c.close()


def test_unchanged_frozen_tensors_are_referenced_not_rewritten(inc) -> None:
    c, rec = inc
    model, opt = _setup()
    base = model.base.weight.nelement() * 4
    snap1, first = _save(c, 1, model, opt)
    assert _frozen_written(first) >= base and first.nbytes >= base
    _train(model, opt, 3)
    snap2, second = _save(c, 4, model, opt)
    assert _frozen_written(second) == 0  # the frozen weight is listed, not written
    assert second.referenced >= base and second.nbytes < first.nbytes / 10
    assert snap2.nbytes < base  # ... and not even copied at the snapshot
    assert [e["referenced_bytes"] >= base for e in rec.kinds("checkpoint")] == [False, True]
    manifest, state = c.load_latest()
    assert manifest.seq == second.seq
    for name, value in model.state_dict().items():
        assert torch.equal(state["objects"]["model"][name], value), name
    assert torch.equal(
        state["objects"]["opt"]["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"]
    )


def test_a_frozen_tensor_changed_in_place_is_written_again(inc) -> None:
    """An in-place write bumps the version counter: the next save stores the new values."""
    c, _ = inc
    model, opt = _setup()
    _save(c, 1, model, opt)
    with torch.no_grad():
        model.base.weight.mul_(2)
    _, second = _save(c, 2, model, opt)
    assert _frozen_written(second) >= model.base.weight.nelement() * 4
    _, state = c.load_latest()
    assert torch.equal(state["objects"]["model"]["base.weight"], model.base.weight)


def test_a_frozen_tensor_rewritten_through_data_is_written_again(inc) -> None:
    """A write through `.data` (an EMA teacher's update in older code) leaves the version
    counter as it was; the probe of evenly spaced elements sees the change."""
    c, _ = inc
    model, opt = _setup()
    _save(c, 1, model, opt)
    version = model.base.weight._version
    model.base.weight.data.mul_(0.5).add_(1.0)
    assert model.base.weight._version == version
    _, second = _save(c, 2, model, opt)
    assert _frozen_written(second) >= model.base.weight.nelement() * 4
    _, state = c.load_latest()
    assert torch.equal(state["objects"]["model"]["base.weight"], model.base.weight)


def test_a_new_frozen_tensor_is_never_taken_for_the_old_one(inc) -> None:
    """A frozen weight replaced by another of the same shape (both never written in place, so
    both at version 0) is stored anew: the record holds the old one, whose address cannot be
    handed to the new one meanwhile."""
    c, _ = inc
    model, opt = _setup()
    _save(c, 1, model, opt)
    model.base.weight = torch.nn.Parameter(torch.full((256, 256), 3.0), requires_grad=False)
    _save(c, 2, model, opt)
    _, state = c.load_latest()
    assert torch.equal(state["objects"]["model"]["base.weight"], torch.full((256, 256), 3.0))


def test_trainable_parameters_and_optimizer_state_are_always_written(store_url: str) -> None:
    model, opt = _setup()
    frozen = frozen_tensors([model, opt])
    assert model.base.weight.data_ptr() in frozen and model.base.bias.data_ptr() in frozen
    assert model.down.weight.data_ptr() not in frozen and model.up.weight.data_ptr() not in frozen
    bn = torch.nn.BatchNorm1d(64)  # buffers: updated by forward passes, always written
    assert {b.data_ptr() for b in bn.buffers()}.isdisjoint(frozen_tensors([bn.requires_grad_(False)]))
    # a frozen parameter an optimizer nevertheless holds is trained: never referenced
    opt2 = torch.optim.SGD([model.base.weight], lr=0.1)
    assert model.base.weight.data_ptr() not in frozen_tensors([model, opt2])


def test_pruning_keeps_every_blob_a_kept_checkpoint_references(store_url: str) -> None:
    c = Checkpointer(Store(store_url), "job", 1, Recorder(), keep_last=1)
    try:
        model, opt = _setup()
        _, first = _save(c, 1, model, opt, "insurance")
        old_blobs = first.blobs()
        for step in range(2, 6):  # insurance saves: all but the newest two are pruned
            _train(model, opt)
            _save(c, step, model, opt, "insurance")
        kept = c.list_manifests()
        assert [m.step for m in kept] == [5, 4] and first.seq not in {m.seq for m in kept}
        on_disk = set(c.store.ls(f"{c.root}/blobs"))
        assert old_blobs and old_blobs <= on_disk  # listed by checkpoint 1 (gone) and the kept ones
        assert c.load_latest()[0].step == 5
        # once the frozen weight changes, the blob only pruned checkpoints listed goes with them
        with torch.no_grad():
            model.base.weight.add_(1)
        for step in (6, 7, 8):
            _save(c, step, model, opt, "insurance")
        on_disk = set(c.store.ls(f"{c.root}/blobs"))
        assert on_disk == set().union(*(m.blobs() for m in c.list_manifests()))
        assert old_blobs.isdisjoint(on_disk)
    finally:
        c.close()


def test_a_corrupt_referenced_blob_falls_back_to_an_older_checkpoint(inc) -> None:
    c, rec = inc
    model, opt = _setup()
    _save(c, 1, model, opt)
    with torch.no_grad():
        model.base.weight.add_(1)  # checkpoints 2 and 3 list a newer blob than checkpoint 1
    _save(c, 2, model, opt, "insurance")
    _, third = _save(c, 3, model, opt, "insurance")
    (sha,) = (m["sha256"] for n, m in third.files.items() if m["size"] == 256 * 256 * 4)
    path = f"{c.root}/blobs/{sha}"
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the hash can tell
    Path(path).write_bytes(bytes(data))
    manifest, state = c.load_latest()
    assert manifest.step == 1
    assert [e["seq"] for e in rec.kinds("checkpoint_invalid")] == [third.seq, third.seq - 1]
    assert torch.equal(state["objects"]["model"]["base.weight"] + 1, model.base.weight)


def test_a_referenced_blob_gone_from_the_store_fails_the_save_and_the_next_rewrites_it(inc) -> None:
    c, _ = inc
    model, opt = _setup()
    _, first = _save(c, 1, model, opt)
    for sha in first.blobs():
        c.store.rm(f"{c.root}/blobs/{sha}")
    with pytest.raises(RuntimeError, match="no longer in the store"):
        _save(c, 2, model, opt)
    _, third = _save(c, 3, model, opt)
    assert _frozen_written(third) >= 256 * 256 * 4
    assert c.load_latest()[0].step == 3


def test_checkpoints_of_the_format_before_still_restore(store_url: str, tmp_path: Path, monkeypatch) -> None:
    """tests/support/fixtures/ckpt_v1 was written by spotnb before incremental saves (a whole-state
    checkpoint with a backed-up file, and a chunked one); it is copied, never modified."""
    monkeypatch.chdir(tmp_path)
    rec = Recorder()
    c = Checkpointer(Store(store_url), "job", 1, rec)
    try:
        shutil.copytree(FIXTURE / "ckpt", c.root, dirs_exist_ok=True)
        manifest, state = c.load_latest()
        assert (manifest.seq, manifest.step, manifest.kind) == (2, 20, "insurance")
        want = torch.arange(65536, dtype=torch.float32).reshape(256, 256) / 3
        assert torch.equal(state["objects"]["w"], want) and state["user"] == {"lr": 0.1}
        c.store.rm(f"{c.root}/00000002", recursive=True)
        manifest, state = c.load_latest()
        assert manifest.step == 10 and (tmp_path / "notes.txt").read_text() == "backed up by ctx.backup\n"
        assert torch.equal(state["objects"]["w"], torch.arange(4096, dtype=torch.float32).reshape(64, 64) / 7)
        assert not rec.kinds("checkpoint_invalid")
    finally:
        c.close()


def test_checkpoints_with_blake3_digests_restore(store_url: str, tmp_path: Path, monkeypatch) -> None:
    """tests/support/fixtures/ckpt_v2 (signed): files written by value carry BLAKE3, blobs their sha256,
    a gated save's `tensors.bin` among them; both checkpoints restore bit for bit (the two
    optimizer steps are replayed here on whole numbers)."""
    monkeypatch.chdir(tmp_path)
    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Linear(128, 16))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((torch.arange(p.numel()) % 97).reshape(p.shape))
    opt = torch.optim.SGD(model[1].parameters(), lr=1.0, momentum=0.5)
    want = {}
    for step in (10, 20):
        for p in model[1].parameters():
            p.grad = torch.ones_like(p)
        opt.step()
        want[step] = {"model": _clone(model.state_dict()), "opt": _clone(opt.state_dict())}
    rec = Recorder()
    c = Checkpointer(Store(store_url), "job", 1, rec, key=b"ckpt_v2 fixture key, not secret!")
    try:
        shutil.copytree(FIXTURE_V2 / "ckpt", c.root, dirs_exist_ok=True)
        manifest, state = c.load_latest()
        assert (manifest.seq, manifest.step, manifest.kind) == (2, 20, "insurance")
        assert manifest.files["tensors.bin"].keys() == {"size", "blake3"}
        _assert_equal(state["objects"], want[20])
        c.store.rm(f"{c.root}/00000002", recursive=True)
        manifest, state = c.load_latest()
        assert manifest.step == 10 and (tmp_path / "notes.txt").read_text() == "backed up by ctx.backup\n"
        _assert_equal(state["objects"], want[10])
        assert not rec.kinds("checkpoint_invalid")
    finally:
        c.close()


def _clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    return obj


def _assert_equal(got, want) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(got, want)
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            _assert_equal(got[k], want[k])
    elif isinstance(want, list):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            _assert_equal(a, b)
    else:
        assert got == want


def test_an_emergency_save_is_sized_by_what_it_would_write() -> None:
    """β grows with size: a 100 MB state at a measured 10 MB/s does not fit a 5 s notice, the
    1 MB delta an incremental save would write does; the mean β of past saves decides neither."""
    obs = Observation(
        step=10,
        step_time=0.1,
        snapshot_time=0.2,
        upload_time=10.0,
        mttp=3600.0,
        restart_time=60.0,
        grace=30.0,
        state_bytes=100_000_000,
        upload_bps=10e6,
    )
    assert not emergency_feasible(obs.with_(save_bytes=100_000_000), 5.0)
    assert emergency_feasible(obs.with_(save_bytes=1_000_000), 5.0)
    assert not emergency_feasible(obs.with_(save_bytes=1_000_000), 0.5)


# -- a LoRA-style job on real local instances -------------------------------------------------

SHIP = ["tests.support.jobfns"]
#: the frozen base of `jobfns.lora_mlp` at width 512 stored as blobs: inp.weight + hidden.weight
FROZEN_BYTES = (64 * 512 + 512 * 512) * 4
LORA = functools.partial(jobfns.lora_mlp, steps=120, step_delay=0.02, settle_at=60)
#: the same job, held at step 80 until the notice scheduled there is seen
NOTICED = functools.partial(LORA, hold_at=80)


def _events(job: spot.Job, kind: str, incarnation: int) -> list[dict]:
    return [e for e in job.events if e["kind"] == kind and e["incarnation"] == incarnation]


def _manifests(job: spot.Job) -> list[dict]:
    store = Store(spot.Config().store_url())
    root = store.job(job.id, "ckpt")
    return [json.loads(store.read_bytes(f"{root}/{n}/MANIFEST.json")) for n in store.ls(root) if n.isdigit()]


@pytest.fixture(scope="module")
def calm(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[tuple[int, float]]]:
    """The LoRA job without a preemption."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SPOTNB_HOME", str(tmp_path_factory.mktemp("calm-home")))
    try:
        job = spot.train(LORA, spot.Config(checkpoint="static:30", ship_modules=SHIP))
        result = job.result(timeout=120)
        assert job.breakdown().preemptions == 0
        return result, job.metrics["loss"]
    finally:
        mp.undo()


def test_a_lora_job_saves_its_base_once_and_an_emergency_delta_fits_a_notice_the_full_state_does_not(
    calm,
) -> None:
    """At 0.4 MB/s the 1.2 MB state needs ~3 s, more than the 2 s notice; the delta (the
    adapters, Adam's moments, the RNG: ~70 kB) fits. It is saved, and the resume is exact."""
    config = spot.Config(
        checkpoint="static:30",
        local_upload_bps=0.4e6,
        local_grace=2.0,
        notice_poll=0.1,
        local_schedule=[{"step": 80, "notice": True}],
        ship_modules=SHIP,
    )
    job = spot.train(NOTICED, config)
    assert_matches_reference(job, calm, timeout=120)
    saves = _events(job, "checkpoint", 1)
    first, later = saves[0], saves[1:]
    assert first["bytes"] >= FROZEN_BYTES and first["upload_s"] > config.local_grace  # the full state
    assert later and all(s["bytes"] < first["bytes"] / 10 for s in later)
    assert all(s["referenced_bytes"] >= FROZEN_BYTES for s in later)
    emergencies = [s for s in saves if s["save_kind"] == "emergency"]
    assert len(emergencies) == 1, _events(job, "emergency_skipped", 1)
    emergency = emergencies[0]
    (notice,) = _events(job, "notice", 1)
    assert emergency["t"] < notice["deadline"]
    (resumed,) = _events(job, "resumed", 2)
    assert (resumed["save_kind"], resumed["from_step"]) == ("emergency", emergency["step"])
    # every manifest after the first lists the frozen base without writing it
    manifests = sorted(_manifests(job), key=lambda m: m["seq"])
    assert len(manifests) >= 2
    for doc in manifests:
        blobs = {n: m for n, m in doc["files"].items() if n.startswith("tensors/")}
        assert sum(m["size"] for m in blobs.values()) == FROZEN_BYTES
        if doc["seq"] > 1:
            assert all(m.get("reused") for m in blobs.values()), doc["seq"]


def test_a_notice_too_short_even_for_the_delta_starts_no_upload_and_says_why(calm) -> None:
    config = spot.Config(
        checkpoint="static:30",
        local_upload_bps=0.5e6,
        local_grace=0.4,
        notice_poll=0.05,
        local_schedule=[{"step": 80, "notice": True}],
        ship_modules=SHIP,
    )
    job = spot.train(NOTICED, config)
    assert_matches_reference(job, calm, timeout=120)
    (notice,) = _events(job, "notice", 1)
    (skipped,) = _events(job, "emergency_skipped", 1)
    assert skipped["needed"] > skipped["time_left"]
    assert 0 < skipped["bytes"] < FROZEN_BYTES / 10  # sized by the delta, not the whole state
    assert "no upload was started" in skipped["reason"] and "disk" in skipped["reason"]
    saves = [e for e in job.events if e["incarnation"] == 1 and e["kind"].startswith("checkpoint")]
    assert saves and not [e for e in saves if e["save_kind"] == "emergency"]  # none started
    (preempted,) = _events(job, "preempted", 1)
    assert preempted["how"] == "preempted"
    (resumed,) = _events(job, "resumed", 2)  # from the last committed (planned) save
    last = [e for e in saves if e["kind"] == "checkpoint"][-1]
    assert (resumed["save_kind"], resumed["from_step"]) == ("periodic", last["step"])


def test_a_resumed_instance_references_the_frozen_tensors_it_restored(store_url: str) -> None:
    """The first save of a new incarnation neither copies nor hashes the frozen part it loaded
    from the checkpoint; a frozen tensor the resumed code changes is written again."""
    first = Checkpointer(Store(store_url), "job", 1, Recorder())
    model, opt = _setup()
    try:
        _save(first, 1, model, opt)
    finally:
        first.close()
    c = Checkpointer(Store(store_url), "job", 2, Recorder())
    try:
        torch.manual_seed(1)
        fresh = Lora()  # other initial values: the restore must overwrite them
        fresh_opt = torch.optim.Adam([p for p in fresh.parameters() if p.requires_grad], lr=1e-2)
        _, state = c.load_latest()
        fresh.load_state_dict(state["objects"]["model"])
        fresh_opt.load_state_dict(state["objects"]["opt"])
        base = fresh.base.weight.nelement() * 4
        assert c.adopt(_state(1, fresh, fresh_opt), frozen_tensors([fresh, fresh_opt])) == base
        _train(fresh, fresh_opt)
        snap, second = _save(c, 2, fresh, fresh_opt)
        assert snap.nbytes < base and _frozen_written(second) == 0 and second.referenced >= base
        _, state = c.load_latest()
        assert torch.equal(state["objects"]["model"]["base.weight"], model.base.weight)
        with torch.no_grad():
            fresh.base.weight.add_(1)
        _, third = _save(c, 3, fresh, fresh_opt)
        assert _frozen_written(third) == base
    finally:
        c.close()


def test_insurance_saves_follow_what_a_save_would_write() -> None:
    """Adaptive takes no insurance saves when an emergency save is expected to fit the notice:
    a 10 MB delta at 10 MB/s fits a 30 s notice, a 1 GB full state does not (the mean β of past
    saves, 5 s, would say both fit)."""
    from spotnb.policy import Adaptive

    obs = Observation(
        step=10,
        step_time=0.1,
        snapshot_time=0.2,
        upload_time=5.0,
        mttp=3600.0,
        restart_time=60.0,
        grace=30.0,
        state_bytes=1_000_000_000,
        upload_bps=10e6,
    )
    assert Adaptive().next_save(obs.with_(save_bytes=10_000_000), 10) is None
    plan = Adaptive().next_save(obs.with_(save_bytes=1_000_000_000), 10)
    assert plan is not None and plan.kind == "insurance"
