"""The group loss rate a job on several instances plans its insurance saves with
(`spotnb.policy.group`), checked against a Monte-Carlo simulation of its own model."""

from __future__ import annotations

import math
import random

import pytest

from spotnb.policy import Hedged, Observation
from spotnb.policy.group import group_loss_rate, group_mttp, simulate_group_losses


@pytest.mark.parametrize("instances, x", [(2, 0.1), (3, 0.3), (4, 1.0), (3, 1.0)])  # x: lambda * r
def test_formula_matches_the_simulation(instances: int, x: float) -> None:
    mttp = 100.0
    rate = group_loss_rate(mttp, instances, x * mttp)
    # long enough for ~800 group losses; 4 standard errors of a Poisson count
    horizon = 800 / rate
    losses, running = simulate_group_losses(mttp, instances, x * mttp, horizon, random.Random(7))
    assert losses > 300
    assert losses / running == pytest.approx(rate, rel=4 / math.sqrt(losses))


def test_one_instance_keeps_todays_mttp() -> None:
    assert group_mttp(3600.0, 1, 120.0) == 3600.0


def test_more_instances_are_lost_together_far_less_often() -> None:
    one, two, four = (group_mttp(3600.0, n, 120.0) for n in (1, 2, 4))
    assert one < two < four
    assert four / one > 1000  # 1 h MTTP, 2 min to replace: ~7,700 h for four


def test_a_four_instance_job_saves_far_less_often() -> None:
    """What the fleet controller hands the policy: the group MTTP, so insurance saves thin out."""
    policy = Hedged()

    def interval(mttp: float) -> int:
        obs = Observation(
            step=0,
            step_time=1.0,
            snapshot_time=2.0,
            upload_time=10.0,
            mttp=mttp,
            restart_time=120.0,
            grace=0.0,
        )
        plan = policy.next_save(obs, 0)
        return plan.step if plan is not None else 10**9

    assert interval(group_mttp(3600.0, 4, 120.0)) > 10 * interval(3600.0)


def test_fixed_replacement_time_is_close_to_the_formula() -> None:
    """The derivation assumes exponential replacement times; a fixed one (closer to a real
    allocation) changes the rate by a few tens of percent at most for these values."""
    mttp, r = 100.0, 30.0
    rate = group_loss_rate(mttp, 3, r)
    losses, running = simulate_group_losses(mttp, 3, r, 800 / rate, random.Random(3), replace="fixed")
    assert 0.5 < (losses / running) / rate < 1.5


@pytest.mark.parametrize(
    "args, words",
    [((0.0, 2, 1.0), "mttp=0.0"), ((10.0, 0, 1.0), "instances=0"), ((10.0, 2, -1.0), "replace_s=-1.0")],
)
def test_bad_input_names_the_argument(args: tuple, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        group_loss_rate(*args)
