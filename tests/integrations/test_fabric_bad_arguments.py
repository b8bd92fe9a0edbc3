"""`fabric_batches` given bad arguments: a clear error naming the argument and the fix, at
the call (before anything is tracked), not a hang, a silent no-op loop or a misleading error
an epoch later. The `ctx` here only records what is tracked: every check runs before it is
used, and a real job's ctx is exercised by tests/integrations/test_lightning.py."""

from __future__ import annotations

from typing import Any

import pytest

from spotnb.integrations.fabric import fabric_batches


class RecordingCtx:
    def __init__(self) -> None:
        self.tracked: dict[str, Any] = {}

    def track(self, **objs: Any) -> None:
        self.tracked.update(objs)

    def steps(self, n: int) -> Any:
        return iter(range(n))


class NoLen:
    """An iterable-style loader (no `len`): streams are loaders too."""

    def __iter__(self) -> Any:
        return iter([[1], [2], [3]])


@pytest.mark.parametrize("steps", [0, -5, 2.5, "10", True, None])
def test_steps_that_are_not_a_positive_count_are_refused_at_the_call(steps: Any) -> None:
    ctx = RecordingCtx()
    with pytest.raises((ValueError, TypeError), match="fabric_batches: steps"):
        fabric_batches(ctx, [[1], [2]], steps)
    assert ctx.tracked == {}


@pytest.mark.parametrize(
    "loader, words",
    [
        (42, "not iterable"),
        (None, "not iterable"),
        ((b for b in [[1], [2]]), "an iterator"),
        (iter([[1], [2]]), "an iterator"),
    ],
    ids=["int", "none", "generator", "iterator"],
)
def test_a_loader_that_cannot_be_iterated_epoch_after_epoch_is_refused(loader: Any, words: str) -> None:
    """A one-shot iterator would train its first epoch, then fail with 'an empty dataset?':
    it cannot be iterated again nor replayed on a resume."""
    ctx = RecordingCtx()
    with pytest.raises(TypeError, match=f"fabric_batches: loader.*{words}"):
        fabric_batches(ctx, loader, 10)
    assert ctx.tracked == {}


def test_a_ctx_that_is_not_the_job_s_is_refused() -> None:
    with pytest.raises(TypeError, match="fabric_batches: ctx"):
        fabric_batches(object(), [[1]], 3)


def test_a_loader_without_len_runs_epoch_after_epoch() -> None:
    ctx = RecordingCtx()
    got = [batch[0] for _, batch in fabric_batches(ctx, NoLen(), 7)]
    assert got == [1, 2, 3, 1, 2, 3, 1]
    assert ctx.tracked["spotnb_epoch"].epoch == 2
