"""`Config.snapshot_memory`: a save never holds more host RAM in snapshot buffers than the
budget, a state several times the budget is saved in chunks and restores bit for bit, and a
training run resumed from such checkpoints matches the uninterrupted one exactly.

Real checkpointer, real store directory, real threads; only the writer's `torch.save` is held
back (by an event) where a test needs a save to be in flight."""

from __future__ import annotations

import threading

import pytest
import torch

import spotnb as spot
from spotnb.core.store import Store
from spotnb.errors import ConfigError
from spotnb.policy import resolve_policy
from spotnb.runtime.beacon import Beacon
from spotnb.runtime.checkpoint import checkpointer as checkpoint
from spotnb.runtime.checkpoint.checkpointer import Checkpointer
from spotnb.runtime.checkpoint.chunked import DATA_NAME
from spotnb.runtime.context import Context
from tests.support import jobfns
from tests.support.jobs import Recorder, assert_same_state

pytestmark = pytest.mark.jobs

MB = 1024 * 1024


def _big_state(step: int) -> dict:
    """8 MB of tensors of every awkward kind: one larger than the 2 MB budget (so split across
    chunks), a transposed view, bfloat16, ints, bools, a 0-d and an empty tensor."""
    g = torch.Generator().manual_seed(step)
    return {
        "step": step,
        "objects": {
            "model": {
                "big": torch.randn(1024, 1024 + 7, generator=g),  # ~4 MB, not a chunk multiple
                "t": torch.randn(700, 900, generator=g).t(),  # non-contiguous
                "bf": torch.randn(999, 513, generator=g).to(torch.bfloat16),
                "i": torch.randint(-(2**40), 2**40, (3333,), generator=g),
                "b": torch.rand(1001, generator=g) > 0.5,
                "scalar": torch.tensor(float(step)),
                "empty": torch.zeros(0, 5),
            },
            "opt": {"state": {0: {"exp_avg": torch.randn(300, 1000, generator=g)}}, "lr": [0.1, (1, 2)]},
        },
        "rng": {"torch": torch.get_rng_state()},
        "user": {"note": f"step {step}"},
    }


def test_a_state_four_times_the_budget_saves_in_chunks_and_restores_bit_exactly(store_url) -> None:
    rec = Recorder()
    c = Checkpointer(Store(store_url), "job", 1, rec, snapshot_memory=2 * MB)
    try:
        state = _big_state(10)
        expected = _big_state(10)
        snap = c.snapshot(state, 10, "periodic")
        assert snap.nbytes > 4 * c.budget()
        for t in state["objects"]["model"].values():
            t.add_(1) if t.dtype != torch.bool else t.logical_not_()  # training goes on: not in the file
        c.submit(snap)
        assert c.wait(60)
        c.save_now(c.snapshot(_big_state(20), 20, "emergency"))
        assert c.peak_bytes <= 2 * MB and c.held_bytes <= 2 * MB
        manifest, restored = c.load_latest()
        assert manifest.step == 20 and DATA_NAME in manifest.files
        assert_same_state(_big_state(20), restored)
        # the one before still restores too, and is what a damaged newest one falls back to
        data = f"{c.root}/{manifest.seq:08d}/{DATA_NAME}"
        with open(data, "r+b") as f:
            f.seek(5 * MB)
            f.write(b"\xff")
        manifest, restored = c.load_latest()
        assert manifest.step == 10
        assert_same_state(expected, restored)
        assert "blake3" in rec.kinds("checkpoint_invalid")[0]["reason"]  # the digest tensors.bin carries
    finally:
        c.close()


def test_a_state_within_the_budget_waits_for_the_writer_rather_than_take_a_second_copy(
    store_url, monkeypatch
) -> None:
    """1.5 MB of budget, a 1 MB state, saves faster than the writer: the second snapshot must
    not allocate a second whole copy while the first is being serialised."""
    writing, release = threading.Event(), threading.Event()
    real_save = torch.save

    def slow_save(obj, f, *a, **kw):
        if not writing.is_set():
            writing.set()
            release.wait(30)
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(checkpoint.torch, "save", slow_save)
    c = Checkpointer(Store(store_url), "job", 1, Recorder(), snapshot_memory=int(1.5 * MB))
    w = torch.zeros(512, 512)
    try:
        c.submit(c.snapshot({"step": 1, "w": w}, 1, "periodic"))
        assert writing.wait(30)
        w.fill_(2.0)
        second: list = []
        t = threading.Thread(target=lambda: second.append(c.snapshot({"step": 2, "w": w}, 2, "periodic")))
        t.start()
        release.set()  # the writer gives its buffers back; the snapshot takes them
        t.join(60)
        c.submit(second[0])
        assert c.wait(60)
        assert c.peak_bytes <= 1.5 * MB
        manifest, state = c.load_latest()
        assert manifest.step == 2 and torch.equal(state["w"], torch.full((512, 512), 2.0))
        assert DATA_NAME not in manifest.files  # it fitted: the whole-state format, as before
    finally:
        release.set()
        c.close()


def test_a_budget_below_one_strided_row_is_a_clear_error_and_the_next_save_works(store_url) -> None:
    c = Checkpointer(Store(store_url), "job", 1, Recorder(), snapshot_memory=64 * 1024)
    try:
        wide = torch.zeros(4, 40_000).t().t()[:, ::2]  # rows of 80 KB, not contiguous
        with pytest.raises(ValueError, match=r"snapshot_memory to at least"):
            c.snapshot({"step": 1, "w": wide}, 1, "periodic")
        assert c.held_bytes <= 64 * 1024
        # a contiguous tensor of any size is split inside itself
        big = torch.arange(100_000, dtype=torch.float64)
        c.save_now(c.snapshot({"step": 2, "w": big, "s": wide.contiguous()[:, :100]}, 2, "periodic"))
        _, state = c.load_latest()
        assert torch.equal(state["w"], big) and c.peak_bytes <= 64 * 1024
    finally:
        c.close()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("lots", "invalid size 'lots'"),
        (-1, "non-negative"),
        (True, "bool"),
        ("10KB", "less than 1MB"),
        ([512], "expected a size"),
    ],
)
def test_bad_snapshot_memory_is_a_config_error_naming_the_field(value, message) -> None:
    with pytest.raises(ConfigError, match="snapshot_memory") as err:
        spot.Config(snapshot_memory=value)
    assert message in str(err.value)


def test_snapshot_memory_sizes() -> None:
    assert spot.Config(snapshot_memory="512MB").snapshot_memory == 512_000_000
    assert spot.Config(snapshot_memory="2GiB").snapshot_memory == 2 * 1024**3
    assert spot.Config(snapshot_memory=3 * MB).snapshot_memory == 3 * MB
    assert spot.Config().snapshot_memory is None


def _context(store_url: str, incarnation: int, budget: int) -> tuple[Context, Checkpointer]:
    ckpt = Checkpointer(Store(store_url), "job", incarnation, Recorder(), snapshot_memory=budget)
    ctx = Context(
        job_id="job",
        incarnation=incarnation,
        checkpointer=ckpt,
        policy=resolve_policy("static:10"),
        emit=Recorder(),
        flush=lambda: None,
        beacon=Beacon(None),
        market={"mttp": 3600.0, "restart": 60.0, "grace": 120.0},
    )
    return ctx, ckpt


BUDGET = 256 * 1024


def test_training_resumed_from_chunked_checkpoints_matches_the_uninterrupted_run(tmp_path) -> None:
    """The MLP + Adam of the end-to-end resume tests (narrower: ~0.9 MB of state) with a 256 KB budget:
    stopped after step 25, resumed from the chunked checkpoint of step 20, it ends bit for bit
    where a run without a stop ends."""
    threads = torch.get_num_threads()
    try:
        ref_ctx, ref_ckpt = _context((tmp_path / "ref").as_uri(), 1, BUDGET)
        reference = jobfns.seeded_mlp(ref_ctx, steps=40, width=256)
        ref_ckpt.close()

        url = (tmp_path / "run").as_uri()
        ctx, ckpt = _context(url, 1, BUDGET)
        jobfns.seeded_mlp(ctx, steps=25, width=256)
        assert ckpt.wait(60) and ckpt.failures == 0
        assert [m.step for m in ckpt.list_manifests()][0] == 20
        assert ckpt.peak_bytes <= BUDGET and ckpt.last_bytes > 3 * BUDGET
        ckpt.close()

        ctx, ckpt = _context(url, 2, BUDGET)
        result = jobfns.seeded_mlp(ctx, steps=40, width=256)
        assert ctx.resumed_from == 20
        ckpt.close()
    finally:
        torch.set_num_threads(threads)
    for name, tensor in reference["params"].items():
        assert torch.equal(result["params"][name], tensor), name
    assert result["loss"] == reference["loss"]


def test_a_full_spool_disk_mid_chunks_fails_the_save_not_the_training_thread(tmp_path, store_url) -> None:
    """The drain's write fails after a few chunks (a 1 MB tmpfs spool): the training thread,
    waiting for the buffer the drain holds, is released; the save fails with an event, the
    earlier checkpoint restores, and the next save that fits the disk works."""
    from tests.support.jobs import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "spool", "1m") as spool:
        rec = Recorder()
        c = Checkpointer(Store(store_url), "job", 1, rec, spool_dir=str(spool), snapshot_memory=256 * 1024)
        try:
            c.save_now(c.snapshot({"step": 1, "w": torch.ones(20_000)}, 1, "periodic"))
            big = {"step": 2, "w": torch.randn(1_000_000)}  # 4 MB through a 1 MB disk
            with pytest.raises(OSError):
                c.save_now(c.snapshot(big, 2, "periodic"))
            assert c.held_bytes <= 256 * 1024 and not c._chunks.in_use
            c.submit(c.snapshot({"step": 3, "w": torch.full((20_000,), 3.0)}, 3, "periodic"))
            assert c.wait(60)
            manifest, state = c.load_latest()
            assert manifest.step == 3 and torch.equal(state["w"], torch.full((20_000,), 3.0))
            assert [e["step"] for e in rec.kinds("checkpoint_failed")] == []  # save_now raised instead
            import os

            assert [n for n in os.listdir(c.spool) if n.startswith("data-")] == []
        finally:
            c.close()


def test_an_emergency_save_abandons_a_chunked_upload_and_leaves_no_spool_behind(store_url) -> None:
    """A chunked save uploading slowly (throttled copy to the store) is abandoned for an
    emergency save; both snapshots' tensors.bin leave the spool, the emergency one commits."""
    import os

    rec = Recorder()
    c = Checkpointer(Store(store_url), "job", 1, rec, snapshot_memory=2 * MB, upload_bps=16e6)
    try:
        c.submit(c.snapshot(_big_state(10), 10, "periodic"))  # ~0.5 s of upload at 16 MB/s
        c.save_now(c.snapshot(_big_state(11), 11, "emergency"))
        manifest, restored = c.load_latest()
        assert manifest.step == 11
        assert_same_state(_big_state(11), restored)
        assert [n for n in os.listdir(c.spool) if n.startswith("data-")] == []
        assert c.peak_bytes <= 2 * MB
    finally:
        c.close()


def test_the_budget_travels_to_the_instance_in_the_spec() -> None:
    from spotnb.submit import job_spec as _spec

    spec = _spec("job", spot.Config(snapshot_memory="64MB"), [])
    assert spec.runtime.snapshot_memory == 64_000_000
    assert _spec("job", spot.Config(), []).runtime.snapshot_memory is None


def test_a_job_with_a_small_snapshot_budget_is_preempted_and_resumes_bit_exactly(reference) -> None:
    """End to end, real processes: Config.snapshot_memory reaches the agent's Checkpointer, so
    the ~3.4 MB MLP + Adam state is saved in chunks (a tensors.bin in each checkpoint) under a
    1 MB budget; killed mid-step and during a save, the job resumes from those checkpoints and
    ends bit for bit like the uninterrupted run."""
    import functools

    import spotnb as spot
    from spotnb.core.store import Store
    from tests.support import jobfns
    from tests.support.jobs import assert_matches_reference

    config = spot.Config(
        checkpoint="static:20",
        ship_modules=["tests.support.jobfns"],
        snapshot_memory="1MB",
        local_schedule=[{"step": 50, "phase": "step"}, {"step": 105, "phase": "save"}],
    )
    job = spot.train(functools.partial(jobfns.seeded_mlp, step_delay=0.005), config)
    assert_matches_reference(job, reference)
    assert job.breakdown().preemptions == 2
    resumed = [e for e in job.events if e["kind"] == "resumed"]
    assert resumed and all(e["from_step"] > 0 for e in resumed)
    store = Store(config.store_url())
    chunked = [p for p in store.fs.find(store.job(job.id, "ckpt")) if p.endswith(DATA_NAME)]
    assert chunked, "no checkpoint was written in chunks"
