"""A sharded job (FSDP2 `fully_shard` over an instance's processes, `procs_per_instance=2`,
gloo on CPU) checkpoints in DCP's format through `ShardedCheckpointer` on every rank: real
agent processes on the local market, really killed by it mid-run. The preempted run must end
with weights equal, to the bit, to a calm run's."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

import spotnb as spot
from tests.support import procfns

pytestmark = [pytest.mark.jobs, pytest.mark.elastic]

torch = pytest.importorskip("torch")

SHIP = ["tests.support.procfns"]


def _by(job: spot.Job, kind: str, n: int | None = None) -> list[Any]:
    return [e for e in job.events if e["kind"] == kind and (n is None or e["incarnation"] == n)]


def _config(**kw: Any) -> spot.Config:
    return spot.Config(
        ship_modules=SHIP, local_alloc_delay=0.1, procs_per_instance=2, checkpoint="static:5", **kw
    )


def test_a_preempted_sharded_job_resumes_from_its_shards_exactly(tmp_path: Path) -> None:
    """instances=1 × procs=2, checkpoint every 5 steps; the market kills the instance at step
    13. The next instance's two ranks restore the newest committed shards (and Adam's state
    and each rank's RNG) and end with the calm run's weights; the checkpoint holds one `.distcp` per
    rank, committed once."""
    steps = 24
    calm_out, hit_out = tmp_path / "calm", tmp_path / "hit"
    calm_out.mkdir()
    hit_out.mkdir()
    # both jobs run at once: the calm one is the reference, not a timing
    calm = spot.train(functools.partial(procfns.sharded_mlp, steps=steps, out=str(calm_out)), _config())
    hit = spot.train(  # held at 13 until the kill: a late one would land after the save at 15
        functools.partial(procfns.sharded_mlp, steps=steps, out=str(hit_out), hold_at=13),
        _config(local_schedule=[{"instance": 0, "step": 13}]),
    )
    assert calm.result(timeout=90)["step"] == steps
    assert hit.result(timeout=90)["step"] == steps
    (preempted,) = _by(hit, "preempted", 1)
    assert preempted["how"] == "preempted" and preempted["step"] == 13
    (resumed,) = _by(hit, "resumed", 2)
    # one commit per save although two processes wrote it (rank 0 speaks for the group);
    # static:5 saves at 5 and 10 in the background: the one of step 10 may still have been
    # uploading when the instance died at 13, and then the job resumes from step 5
    committed = [c["step"] for c in _by(hit, "checkpoint", 1)]
    assert committed in ([5, 10], [5])
    assert resumed["from_step"] == committed[-1]
    root = hit.store.job(hit.id, "ckpt")
    newest = max(n for n in hit.store.ls(root) if n.isdigit())
    files = json.loads(hit.store.read_bytes(f"{root}/{newest}/MANIFEST.json"))["files"]
    shards = sorted(f for f in files if f.endswith(".distcp"))
    # each rank wrote its own files (`__<rank>_0`: its large tensors, `__<rank>_1`: the rest)
    assert {f.split("_")[2] for f in shards} == {"0", "1"}, sorted(files)
    assert all(f.startswith("dcp/__") for f in shards), sorted(files)
    assert "dcp/.metadata" in files
    calm_w = torch.load(calm_out / "1-0.pt")
    for name in ("2-0", "2-1"):
        got = torch.load(hit_out / f"{name}.pt")
        assert sorted(got) == sorted(calm_w)
        assert all(torch.equal(got[k], calm_w[k]) for k in calm_w), name


def test_a_noticed_sharded_group_saves_its_shards_together_and_resumes_exactly(tmp_path: Path) -> None:
    """A notice reaches rank 0 only; rank 1 learns it, and rank 0's decision to save, at the
    same step boundary, both write their shards of that step in one emergency checkpoint and
    leave; the next instance resumes from exactly that step and ends with the calm weights."""
    steps = 30
    calm_out, hit_out = tmp_path / "calm", tmp_path / "hit"
    calm_out.mkdir()
    hit_out.mkdir()
    fn = functools.partial(procfns.sharded_mlp, steps=steps, step_delay=0.03)
    calm = spot.train(functools.partial(fn, out=str(calm_out)), _config())
    hit = spot.train(
        functools.partial(fn, out=str(hit_out)),
        _config(
            local_schedule=[{"instance": 0, "step": 13, "notice": True}], local_grace=10.0, notice_poll=0.1
        ),
    )
    assert calm.result(timeout=90)["step"] == steps
    assert hit.result(timeout=90)["step"] == steps
    (preempted,) = _by(hit, "preempted", 1)
    assert preempted["how"] == "evacuated"
    (saved,) = [c for c in _by(hit, "checkpoint", 1) if c["save_kind"] == "emergency"]
    (evacuated,) = _by(hit, "evacuated", 1)
    assert evacuated["step"] == saved["step"] >= 13
    (resumed,) = _by(hit, "resumed", 2)
    assert resumed["from_step"] == saved["step"]
    calm_w = torch.load(calm_out / "1-0.pt")
    for name in ("2-0", "2-1"):
        got = torch.load(hit_out / f"{name}.pt")
        assert all(torch.equal(got[k], calm_w[k]) for k in calm_w), name
