"""`periodic:N`, the thesis's baseline: a save every N steps and no emergency save, ever.

`static:N` takes the emergency save whenever a notice leaves room for it, so the simulator
could not reproduce the baseline rows of the thesis's Table 6.2; these tests pin the difference
in the simulator (both engines), in `spotnb simulate`, in `Config.checkpoint` and on the local
spot market (a real agent, a real notice, a real SIGKILL)."""

from __future__ import annotations

import functools
import json

import pytest

import spotnb as spot
from spotnb.policy import Periodic, resolve_policy
from spotnb.sim import Scenario, simulate
from spotnb.sim.cli import main as simulate_main
from tests.support import jobfns

SHIP = ["tests.support.jobfns"]

# A notice long enough that every emergency save fits (δ + β = 8 s < 60 s grace): `static:N`
# takes one at nearly every preemption, `periodic:N` must take none.
ROOMY = Scenario(
    steps=20_000,
    step_time=1.0,
    save_time=(2, 4),
    backup_time=(3, 5),
    alloc_time=(60, 120),
    prep_time=30,
    grace=60,
    mttp=3 * 3600,
    spot_price=2.3,
    on_demand_price=6.2,
)


def test_resolve_and_config() -> None:
    p = resolve_policy("periodic:50")
    assert isinstance(p, Periodic) and p.every == 50
    assert spot.Config(checkpoint="periodic:50").checkpoint == "periodic:50"
    with pytest.raises(ValueError, match="periodic:100"):
        resolve_policy("periodic")
    with pytest.raises(ValueError, match="positive"):
        resolve_policy("periodic:0")


@pytest.mark.parametrize("engine", ["batch", "event"])
def test_periodic_never_takes_an_emergency_save(engine: str) -> None:
    periodic = simulate(ROOMY, "periodic:600", runs=200, seed=3, keep_samples=True, engine=engine)
    static = simulate(ROOMY, "static:600", runs=200, seed=3, engine=engine)
    assert periodic.engine == static.engine == engine
    assert static.mean["emergency_saves"] > 0.5 * static.mean["preemptions"] > 0  # the control
    rows = periodic.samples or []
    assert rows and all(r["emergency_saves"] == 0 for r in rows)
    assert sum(r["preemptions"] for r in rows) > 100
    # what the notice does not save is lost: redone work, more than static's
    assert periodic.mean["recompute"] > 2 * static.mean["recompute"]
    # and its only saves are the periodic ones
    assert all(r["insurance_saves"] == 0 for r in rows)
    assert periodic.mean["saves"] >= ROOMY.steps // 600 - 1


def test_both_engines_agree() -> None:
    batch = simulate(ROOMY, "periodic:600", runs=600, seed=5, engine="batch").mean
    event = simulate(ROOMY, "periodic:600", runs=600, seed=5, engine="event").mean
    assert batch["total"] == pytest.approx(event["total"], rel=0.03)
    assert batch["recompute"] == pytest.approx(event["recompute"], rel=0.2)


def test_simulate_cli_accepts_periodic(tmp_path, capsys: pytest.CaptureFixture) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(
        "steps: 5000\nstep_time: 1\nsave_time: 3\nbackup_time: 4\nalloc_time: [60, 120]\n"
        "prep_time: 30\ngrace: 60\nmttp: 3000\nspot_price: 2.3\non_demand_price: 6.2\n"
    )
    assert (
        simulate_main(
            [
                "--scenario",
                str(f),
                "--policy",
                "periodic:50",
                "--policy",
                "static:50",
                "--runs",
                "50",
                "--json",
            ]
        )
        == 0
    )
    out = {o["policy"]: o["mean"] for o in json.loads(capsys.readouterr().out)}
    assert out["periodic:50"]["emergency_saves"] == 0
    assert out["static:50"]["emergency_saves"] > 0


def test_simulate_cli_help_names_periodic(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        simulate_main(["--help"])
    assert "periodic:N" in capsys.readouterr().out


def test_periodic_on_the_local_market_trains_on_until_the_kill() -> None:
    """A real agent under `periodic:30`: a notice with room to spare for an emergency save,
    which `static` would take (tests/runtime/test_notice.py); periodic skips it and the kill
    lands, the job resuming from its last periodic checkpoint."""
    # 400 steps of 20 ms: the kill, 3 s after the notice at step 70, lands well before the end
    fn = functools.partial(jobfns.slow_steps, steps=400, step_time=0.02)
    config = spot.Config(
        local_grace=3.0,
        notice_poll=0.1,
        checkpoint="periodic:30",
        local_schedule=[{"step": 70, "notice": True}],
        ship_modules=SHIP,
    )
    job = spot.train(fn, config)
    assert job.result(timeout=180) == 400

    def by(kind: str, n: int | None = None) -> list[dict]:
        return [e for e in job.events if e["kind"] == kind and (n is None or e["incarnation"] == n)]

    assert by("notice", 1)
    assert [e for e in by("checkpoint") if e["save_kind"] == "emergency"] == []
    assert {e["save_kind"] for e in by("checkpoint", 1)} == {"periodic"}
    assert by("emergency_skipped", 1) and not by("evacuating", 1)
    (preempted,) = by("preempted", 1)
    assert preempted["how"] == "preempted"  # killed, not evacuated
    (resumed,) = by("resumed", 2)
    assert resumed["save_kind"] == "periodic" and resumed["from_step"] % 30 == 0
