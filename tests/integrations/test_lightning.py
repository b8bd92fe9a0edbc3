"""The Lightning integration on the real local spot market."""

from __future__ import annotations

import functools
import importlib
import sys
from pathlib import Path

import pytest
import torch

import spotnb as spot
from tests.integrations import lightningjobs

pytestmark = pytest.mark.jobs

SHIP = ["tests.integrations.lightningjobs"]
STEPS = 30  # three epochs of 10 batches


def _kinds(job: spot.Job, kind: str) -> list:
    return [e for e in job.events if e["kind"] == kind]


def test_fit_resumes_exactly_mid_epoch_after_two_preemptions(tmp_path: Path) -> None:
    # local instances run in the submitter's working directory: each job its own root
    job = functools.partial(lightningjobs.tiny, steps=STEPS, val=True)  # validates every epoch
    calm_fn = functools.partial(job, root=str(tmp_path / "calm"))
    fn = functools.partial(job, root=str(tmp_path / "spot"), step_delay=0.05)
    calm = spot.train(calm_fn, spot.Config(checkpoint="static:5", ship_modules=SHIP))
    config = spot.Config(
        checkpoint="static:5",
        ship_modules=SHIP,
        local_grace=3.0,
        notice_poll=0.1,
        # the save due at step 10 (the end of epoch 0) waits a step: resumed from there,
        # Lightning would skip the epoch's validation. Killed at step 13 without notice: back
        # to step 11, in epoch 1; then a notice at step 19: an emergency save at the next step
        # boundary that is not an epoch's end (20 is: that save waits a step too)
        local_schedule=[{"step": 13}, {"step": 19, "notice": True}],
    )
    spotted = spot.train(fn, config)
    ref, got = calm.result(timeout=120), spotted.result(timeout=120)
    assert calm.breakdown().preemptions == 0
    assert spotted.breakdown().preemptions == 2
    resumed = _kinds(spotted, "resumed")
    assert len(resumed) == 2 and resumed[0]["from_step"] == 11, resumed
    assert resumed[1]["save_kind"] == "emergency"
    assert resumed[1]["from_step"] % 10 != 0, resumed  # mid-epoch (10 batches an epoch)
    assert ref["step"] == got["step"] == STEPS
    assert ref["weights"].keys() == got["weights"].keys()
    for name, w in ref["weights"].items():
        assert torch.equal(w, got["weights"][name]), name
    # the Trainer's logged metrics are the job's, every fifth step, without a hole
    for j in (calm, spotted):
        assert [s for s, _ in j.metrics["loss"]] == list(range(5, STEPS + 1, 5)), j.metrics["loss"]
        assert [s for s, _ in j.metrics["val_loss"]] == [10, 20, 30], j.metrics["val_loss"]
    assert dict(spotted.metrics["loss"]) == dict(calm.metrics["loss"])
    assert dict(spotted.metrics["val_loss"]) == dict(calm.metrics["val_loss"])
    assert not _kinds(spotted, "warning"), _kinds(spotted, "warning")


def test_missing_lightning_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lightning", None)  # import lightning -> ImportError
    monkeypatch.delitem(sys.modules, "spotnb.integrations.lightning", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'spotnb\[lightning\]'"):
        importlib.import_module("spotnb.integrations.lightning")


def test_import_spotnb_does_not_import_lightning() -> None:
    import subprocess

    code = "import sys, spotnb; assert 'lightning' not in sys.modules, 'lightning imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


class _Ctx:
    """Records warnings; `fit` is not run (only the loader check that precedes it)."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        self.warnings.append(message)


def test_inexact_resume_is_a_warning_at_launch() -> None:
    from spotnb.integrations import lightning as spot_lightning

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            yield torch.zeros(1)

    cases = {
        "IterableDataset": torch.utils.data.DataLoader(Stream()),
        "one-shot": iter([torch.zeros(1)]),
        "2 training loaders": [torch.utils.data.DataLoader([1]), torch.utils.data.DataLoader([2])],
    }
    for needle, loaders in cases.items():
        ctx = _Ctx()
        callback = spot_lightning.SpotCallback(ctx)
        spot_lightning._wrap(ctx, callback, loaders)
        assert len(ctx.warnings) == 1 and needle in ctx.warnings[0], (needle, ctx.warnings)
    # a map-style DataLoader resumes exactly: wrapped, no warning
    ctx = _Ctx()
    callback = spot_lightning.SpotCallback(ctx)
    wrapped = spot_lightning._wrap(ctx, callback, torch.utils.data.DataLoader(list(range(8)), shuffle=True))
    assert isinstance(wrapped, spot_lightning.ResumableLoader) and callback.loaders == [wrapped]
    assert not ctx.warnings


class _Noisy(torch.utils.data.Dataset):
    """Random noise on every sample, drawn in the main process as it is loaded."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((2,), float(i)) + torch.randn(2)


def test_resumable_loader_continues_the_epoch_where_it_was_saved() -> None:
    from spotnb.integrations.lightning import ResumableLoader

    def loader() -> ResumableLoader:
        return ResumableLoader(torch.utils.data.DataLoader(_Noisy(), batch_size=2, shuffle=True))

    torch.manual_seed(0)
    calm = loader()
    expected = [*calm, *calm]  # two epochs of 5 batches
    torch.manual_seed(0)
    first = loader()
    it = iter(first)
    got = [next(it) for _ in range(4)]  # the trainer has trained 3 and prefetched the 4th
    first._trained = 3
    state = first.state_dict()
    torch.manual_seed(123)  # a new process: other RNG states, a fresh loader
    second = loader()
    second.load_state_dict(state)
    got = got[:3] + [*second, *second]
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(expected, got, strict=True)):
        assert torch.equal(a, b), i


def test_fit_refuses_a_ckpt_path() -> None:
    from spotnb.integrations import lightning as spot_lightning

    with pytest.raises(TypeError, match="ckpt_path"):
        spot_lightning.fit(_Ctx(), object(), object(), ckpt_path="last.ckpt")


def test_sigterm_stays_spotnb_s_notice_under_lightning(tmp_path: Path) -> None:
    """spotnb's agent takes SIGTERM as a preemption notice (its handler, stood in for here by
    one that records the call). Lightning's fit installs its own, which would end the run with
    SIGTERMException at the step's end; under `fit` the agent's handler stays in charge."""
    import signal

    class Ctx(_Ctx):  # the hook a Context offers to an external loop; saves never due here
        RESERVED_METRICS = frozenset({"step", "t", "incarnation", "replica"})
        notice = None
        resumed_from = None
        step_index = 0

        def external_loop(self, total: int | None = None) -> None:
            pass

        def step_done(self) -> None:
            self.step_index += 1

        def should_save(self) -> bool:
            return False

        def restore(self) -> None:
            return None

        def log(self, **metrics: float) -> None:
            pass

    calls: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    threads = torch.get_num_threads()
    try:
        with torch.random.fork_rng():
            out = lightningjobs.tiny(Ctx(), root=str(tmp_path), steps=6, sigterm_at=3)
    finally:
        torch.set_num_threads(threads)
        assert signal.signal(signal.SIGTERM, previous) is not None
    assert calls == [signal.SIGTERM]
    assert out["step"] == 6  # trained on: the notice's save and exit are spotnb's to decide


def test_a_fabric_loop_resumes_exactly_mid_epoch() -> None:
    """Lightning Fabric: a hand-written loop over `fabric_batches`, noticed at step 14 (in the
    middle of the second epoch), resumes from its emergency save and ends with the calm run's
    weights and losses bit for bit: the shuffle and the random noise of the epoch included."""
    fn = functools.partial(lightningjobs.fabric_tiny, steps=20)
    calm = spot.train(fn, spot.Config(checkpoint="static:100", ship_modules=SHIP))
    spotted = spot.train(  # held at step 14 until the notice is in: six steps may be too few for it
        functools.partial(fn, step_delay=0.05, hold_at=14),
        spot.Config(
            checkpoint="static:100",
            ship_modules=SHIP,
            local_grace=3.0,
            notice_poll=0.1,
            local_schedule=[{"step": 14, "notice": True}],
        ),
    )
    ref, got = calm.result(timeout=120), spotted.result(timeout=120)
    assert spotted.breakdown().preemptions == 1
    (resumed,) = _kinds(spotted, "resumed")
    assert resumed["save_kind"] == "emergency" and resumed["from_step"] % 10 != 0, resumed  # mid-epoch
    assert ref["step"] == got["step"] == 20
    for name, w in ref["weights"].items():
        assert torch.equal(w, got["weights"][name]), name
    assert dict(spotted.metrics["loss"]) == dict(calm.metrics["loss"])
