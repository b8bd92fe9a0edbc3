"""A restarted lighthouse numbers its quorums from 1 again (issue 9). Three replicas in this
process (real torchft Managers, gloo, a real lighthouse stopped and started again on the same
port), driven phase by phase so the numbers collide on purpose: before the restart the last
quorum of all three is number 2; after it, two replicas train in the new quorum 1 and then all
three meet in the new quorum 2. The third replica sees "2, same members" and, going by the
number alone, would keep its old process group while the other two build a new one under the
same name. Every replica must rebuild, and the step must commit the first time."""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

pytestmark = [pytest.mark.jobs, pytest.mark.elastic]

pytest.importorskip("torchft", reason="spotnb[elastic] is installed by scripts/setup.sh")

import torch  # noqa: E402

from spotnb.core.sync import SyncSpec  # noqa: E402
from spotnb.runtime.group import elastic  # noqa: E402

WIDTH = 4


def _grad(step: int) -> torch.Tensor:
    """The gradient of group step `step`: integers, so sums are exact."""
    return torch.tensor([[float(step % 5 + 1 + i) for i in range(WIDTH)]], dtype=torch.float64)


def _expected(steps: int) -> list[float]:
    total = sum((_grad(s) for s in range(steps)), torch.zeros(1, WIDTH, dtype=torch.float64))
    return (-total).flatten().tolist()


class _Replica:
    """One replica: a linear model, spotnb's `Replication` and its optimizer."""

    def __init__(self, slot: int, address: str, instances: int) -> None:
        self.slot = slot
        self.model = torch.nn.Linear(WIDTH, 1, bias=False).double()
        torch.nn.init.zeros_(self.model.weight)
        el = elastic.Elastic(
            lighthouse=address,
            slot=slot,
            instances=instances,
            min_instances=1,
            join=True,
            sync=SyncSpec("ddp"),
        )
        self.rep = elastic.Replication(el, "restart", self._state, self._load)
        self.opt = elastic.ReplicatedOptimizer(torch.optim.SGD(self.model.parameters(), lr=1.0), self.rep)
        self.quorums: list[dict[str, Any]] = []  # the Quorum events begin_step returned
        self.failed = 0

    def _state(self) -> dict[str, Any]:
        return {"w": self.model.weight.detach().clone(), "sync": self.rep.sync.state_dict()}

    def _load(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            self.model.weight.copy_(state["w"])
        self.rep.sync.load_state_dict(state["sync"])

    def train_until(self, members: int) -> None:
        """Train steps until one commits in a quorum of `members` (the lighthouse may first
        form a quorum of whoever asked first: those steps count too)."""
        while True:
            changed = self.rep.begin_step()
            if changed is not None:
                self.quorums.append(changed)
            self.opt.zero_grad()
            self.model.weight.grad = _grad(self.rep.step)
            self.opt.step()
            ok = self.rep.end_step(last=False)
            if not ok:
                self.failed += 1
            elif self.rep.replicas == members:
                return


def _lighthouse(port: int = 0) -> tuple[subprocess.Popen, int]:
    """The job's coordinator as the local market runs it (`spotnb.runtime.group.lighthouse`)."""
    cmd = [
        sys.executable,
        "-m",
        "spotnb.runtime.group.lighthouse",
        "--min-replicas",
        "2",
        "--bind",
        f"[::]:{port}",
    ]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    assert line.startswith("LIGHTHOUSE "), line
    return proc, int(line.rsplit(":", 1)[1])


def _together(pool: ThreadPoolExecutor, calls: list[Callable[[], None]], timeout: float) -> None:
    for fut in [pool.submit(c) for c in calls]:
        fut.result(timeout=timeout)


@pytest.fixture
def fast_failures(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A collective that hangs fails in 5 s, and a quorum request the dead lighthouse refused is
    retried within 0.1 s (torchft sleeps quorum_timeout / (retries + 1) between tries)."""
    monkeypatch.setattr(elastic, "COLLECTIVE_TIMEOUT", timedelta(seconds=5))
    monkeypatch.setattr(elastic, "QUORUM_TIMEOUT", timedelta(seconds=30))
    yield


@pytest.mark.usefixtures("fast_failures")
def test_quorum_numbers_a_restarted_lighthouse_repeats_do_not_split_the_group() -> None:
    server, port = _lighthouse()
    address = f"http://127.0.0.1:{port}"
    pool = ThreadPoolExecutor(3)
    a, b, c = replicas = [_Replica(k, address, 3) for k in range(3)]
    try:
        _together(pool, [functools.partial(r.train_until, 2) for r in (a, b)], 60)  # quorum 1: a, b
        _together(pool, [functools.partial(r.train_until, 3) for r in replicas], 60)  # quorum 2: all three
        assert [r.rep.lighthouse_quorum_id for r in replicas] == [2, 2, 2]

        server.kill()  # as in test_elastic_hostile: the market starts it again at the same port
        server.wait()
        server, _ = _lighthouse(port)
        _together(pool, [functools.partial(r.train_until, 2) for r in (a, b)], 60)  # new quorum 1
        assert [r.rep.lighthouse_quorum_id for r in replicas] == [1, 1, 2]
        before = [len(r.quorums) for r in replicas]
        failed = [r.failed for r in replicas]
        t0 = time.monotonic()
        _together(pool, [functools.partial(r.train_until, 3) for r in replicas], 60)  # new quorum 2
        took = time.monotonic() - t0

        assert [r.failed for r in replicas] == failed, f"a step failed after the restart ({took:.1f} s)"
        assert [r.rep.lighthouse_quorum_id for r in replicas] == [2, 2, 2]  # c saw "2" twice
        assert all(len(r.quorums) > n for r, n in zip(replicas, before, strict=True)), "c kept its old group"
        steps = {r.rep.step for r in replicas}
        assert len(steps) == 1
        weights = [r.model.weight.detach().flatten().tolist() for r in replicas]
        assert weights == [_expected(steps.pop())] * 3
    finally:
        for r in replicas:
            r.rep.leave()
        pool.shutdown(wait=False, cancel_futures=True)
        server.kill()
        server.wait()
