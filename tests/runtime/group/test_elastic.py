"""Jobs on several instances: real agent processes on the local market, really killed, training
together through a real torchft lighthouse over gloo (CPU). Nothing is mocked.

`jobfns.exact_dp` makes every gradient a multiple of 1/8, so the final weights say to the bit
whether each step's global batch was applied exactly once, whatever the membership did.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from typing import Any

import pytest

import spotnb as spot
from spotnb.errors import ConfigError
from spotnb.views.widget.figures import REPLICA_LANE
from tests.support import jobfns

pytestmark = [pytest.mark.jobs, pytest.mark.elastic]

SHIP = ["tests.support.jobfns"]

pytest.importorskip("torchft", reason="spotnb[elastic] is installed by scripts/setup.sh")


def _by(job: spot.Job, kind: str, n: int | None = None) -> list[Any]:
    return [e for e in job.events if e["kind"] == kind and (n is None or e["incarnation"] == n)]


def _slots(job: spot.Job) -> dict[int, int]:
    """incarnation -> slot."""
    return {e["incarnation"]: e["slot"] for e in _by(job, "allocating")}


def _rows(job: spot.Job) -> dict[int, list[dict]]:
    """Every metric row each incarnation logged (all replicas, not only replica 0)."""
    out: dict[int, list[dict]] = defaultdict(list)
    for e in _by(job, "metrics"):
        out[e["incarnation"]].extend(e["rows"])
    return out


def _finals(job: spot.Job) -> dict[int, float]:
    return {n: r["final"] for n, rows in _rows(job).items() for r in rows if "final" in r}


def _config(**kw: Any) -> spot.Config:
    kw.setdefault("instances", 3)
    return spot.Config(ship_modules=SHIP, local_alloc_delay=0.1, **kw)


def test_survivors_train_on_and_the_replacement_heals_from_a_peer() -> None:
    """A replica killed without notice: the other two never restart (same incarnation to the
    end), their next step commits with two members, the replacement receives the live state
    from a peer (no store restore), and every step is applied exactly once."""
    steps = 160
    job = spot.train(
        functools.partial(jobfns.exact_dp, steps=steps, step_delay=0.06),
        _config(local_schedule=[{"instance": 1, "step": 25}]),
    )
    result = job.result(timeout=240)
    assert result["weights"] == jobfns.exact_dp_expected(steps)
    slots = _slots(job)
    (killed,) = _by(job, "preempted")
    assert slots[killed["incarnation"]] == 1 and killed["how"] == "preempted"
    survivors = {n for n, k in slots.items() if k != 1}
    assert survivors == {n for n in slots if n <= 3} - {killed["incarnation"]}  # never replaced
    for n in survivors:
        (exited,) = _by(job, "exited", n)
        assert exited["reason"] == "done"
        assert not _by(job, "resumed", n)
        # the survivors' quorum shrank to two after the kill
        sizes = [q["replicas"] for q in _by(job, "quorum", n) if q["step"] >= 25]
        assert sizes and sizes[0] == 2
    (replacement,) = [n for n, k in slots.items() if k == 1 and n != killed["incarnation"]]
    quorums = _by(job, "quorum", replacement)
    assert quorums and quorums[0]["healed"] and quorums[0]["step"] > 25
    assert not _by(job, "resumed", replacement)  # never read the store
    finals = _finals(job)
    assert len(finals) == 3 and len(set(finals.values())) == 1  # identical weights everywhere


def test_a_noticed_replica_leaves_after_its_step_and_no_step_fails() -> None:
    steps = 120
    job = spot.train(
        functools.partial(jobfns.exact_dp, steps=steps, step_delay=0.06),
        _config(
            local_schedule=[{"instance": 2, "step": 20, "notice": True}], local_grace=10.0, notice_poll=0.1
        ),
    )
    result = job.result(timeout=240)
    assert result["weights"] == jobfns.exact_dp_expected(steps)
    slots = _slots(job)
    (noticed,) = [n for n in slots if _by(job, "notice", n)]
    assert slots[noticed] == 2
    (preempted,) = _by(job, "preempted", noticed)
    assert preempted["how"] == "evacuated"
    # it left by itself before the market's kill: its `preempted` says where and that it was
    # noticed all the same (from its `evacuated`), not step None (drawn at step 0)
    (evacuated,) = _by(job, "evacuated", noticed)
    assert preempted["step"] == evacuated["step"] > 20 and preempted["noticed"] is True
    assert not _by(job, "checkpoint", noticed)  # peers hold the state: nothing to save
    # no failed step anywhere: no replica logged the same step twice
    for n, rows in _rows(job).items():
        counts = Counter(r["step"] for r in rows if "loss" in r)
        assert max(counts.values()) == 1, f"incarnation {n} redid a step: {counts.most_common(2)}"
    assert job.breakdown().recompute == pytest.approx(0.0, abs=0.05)


def test_all_replicas_lost_restores_from_the_store() -> None:
    steps = 90
    kill = [{"instance": k, "step": 40} for k in range(3)]
    job = spot.train(
        functools.partial(jobfns.exact_dp, steps=steps, step_delay=0.03),
        _config(local_schedule=kill, checkpoint="static:10"),
    )
    result = job.result(timeout=300)
    assert result["weights"] == jobfns.exact_dp_expected(steps)
    # the replicas launched after the loss restored the newest checkpoint (static:10: 30 or 40)
    resumed = [r for r in _by(job, "resumed") if r["incarnation"] > 3]
    assert resumed and all(30 <= r["from_step"] <= 40 for r in resumed)
    assert len(_by(job, "preempted")) == 3
    # one replica writes the store's checkpoints: never two of the same step
    saved = Counter(c["step"] for c in _by(job, "checkpoint"))
    assert saved and max(saved.values()) == 1


def test_replica_0_lost_before_writing_the_result_another_writes_it(monkeypatch: Any) -> None:
    """Replica 0 dies after the last step but before the result reached the store: the job
    still ends with its result (a survivor holds the same state and writes it)."""
    monkeypatch.setenv("SPOTNB_RESULT_WAIT", "2")  # how long the others wait for replica 0's
    steps = 30
    job = spot.train(
        functools.partial(jobfns.exact_dp_slow_result, steps=steps, linger=20.0),
        _config(instances=2, local_schedule=[{"instance": 0, "step": steps}]),
    )
    result = job.result(timeout=240)
    assert result["weights"] == jobfns.exact_dp_expected(steps)
    (killed,) = _by(job, "preempted")
    assert _slots(job)[killed["incarnation"]] == 0
    writers = [e for e in _by(job, "done") if e.get("result")]
    assert writers and all(w["incarnation"] != killed["incarnation"] for w in writers)


def test_replicas_log_their_index_and_the_job_draws_replica_0() -> None:
    steps = 40
    job = spot.train(functools.partial(jobfns.exact_dp, steps=steps, step_delay=0.02), _config())
    job.result(timeout=240)
    replicas = {r.get("replica") for rows in _rows(job).values() for r in rows if "loss" in r}
    assert replicas == {0, 1, 2}
    steps_drawn = [s for s, _ in job.metrics["loss"]]
    assert len(steps_drawn) == len(set(steps_drawn)) == steps  # one point per step
    b = job.breakdown()
    lanes = {e["slot"] for e in _by(job, "allocating")}
    assert lanes == {0, 1, 2}
    # the timeline has a lane saying how many replicas trained, over time
    lane = next(t for t in job.plot()["timeline"].data if t.name == REPLICA_LANE)
    assert "3" in lane.text
    # instance-seconds: three lanes of the job's wall time, split into categories that add up
    assert b.total == pytest.approx(
        sum(getattr(b, c) for c in ("compute", "recompute", "save", "alloc", "prep", "other"))
    )
    assert b.compute > 0 and b.on_demand_cost > 0


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"instances": 0}, "Config.instances"),
        ({"instances": 2, "min_instances": 3}, "min_instances=3 is more than instances=2"),
        ({"instances": 2, "sync": "allreduce"}, "unknown sync 'allreduce'"),
        ({"instances": 2, "sync": "diloco"}, "diloco:50"),
        ({"sync": "local_sgd:5"}, "set instances=N"),
        ({"instances": 2, "sync": "auto:5"}, "chooses K itself"),
        ({"instances": 2, "local_link_delay": {2: 0.1}}, "local_link_delay"),
        ({"instances": 2, "local_link_delay": {1: "2 min"}}, "0 to 60 seconds"),
        (
            {"instances": 2, "procs_per_instance": 2, "sync": "diloco:5"},
            "sync='ddp' only",
        ),
        ({"instances": True}, "whole number"),
        ({"instances": 1000}, "Config.instances"),
    ],
)
def test_bad_fleet_settings_are_refused_before_anything_launches(fields: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace("[", r"\[")):
        spot.Config(**fields)


def test_a_provider_without_a_coordinator_refuses_several_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every built-in provider has a coordinator now; a provider that has none (a third-party
    one that does not implement `Provider.coordinator`) refuses before anything launches."""
    from spotnb.providers.base import Feature, Provider
    from spotnb.providers.local.provider import LocalProvider

    class NoCoordinator(LocalProvider):
        name = "nocoord"
        coordinator = Provider.coordinator

    assert not NoCoordinator(spot.Config()).supports(Feature.ELASTIC)
    monkeypatch.setattr("spotnb.api.get_provider_class", lambda name: NoCoordinator)
    config = spot.Config(provider="local", instances=2)
    with pytest.raises(ConfigError, match="instances: 2 instances are not available on provider='nocoord'"):
        spot.train(jobfns.exact_dp, config, dry_run=True)


@pytest.mark.parametrize("mistake", ["twice", "after_track", "no_replicate", "no_step"])
def test_misusing_replicate_fails_the_job_with_a_clear_error(mistake: str) -> None:
    # the first two mistakes are caught on any job; the others need a group
    instances = 1 if mistake in ("twice", "after_track") else 2
    job = spot.train(
        functools.partial(jobfns.misuse_replicate, mistake=mistake), _config(instances=instances)
    )
    with pytest.raises(spot.JobFailed) as err:
        job.result(timeout=240)
    words = {
        "twice": "already called",
        "after_track": "must come before ctx.track",
        "no_replicate": "call model, opt = ctx.replicate",
        "no_step": "call opt.step()",
    }[mistake]
    assert words in str(err.value)
