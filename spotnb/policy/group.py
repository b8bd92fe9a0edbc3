"""How often a job on several instances is lost as a whole: the rate its policy plans for.

With elastic data parallel, losing one instance costs no checkpoint: the survivors go on and a
replacement receives the live state from a peer. The job falls back to its store checkpoint
only when *every* instance is down at once before a replacement joins. The insurance interval
must therefore use that group loss rate, not one instance's preemption rate.

Model (SPOTNIK and Parcae make the same independence assumption): each of the N instance
slots alternates between up, Exp(λ) with λ = 1/mttp, and down while its replacement is
allocated and joins, mean r (exponential in the derivation). In steady state a slot is down
with probability

    p = λr / (1 + λr).

The group enters "all down" when the last slot that is up fails, so the rate of group losses is

    Λ = N · (1 − p) · p^(N−1) · λ        (N ways to be the last one up, which then fails)

per unit of wall time. The policies' MTTP is a mean time to preemption *while running*, so we
divide by the probability that the group is running, 1 − p^N:

    group MTTP = (1 − p^N) / (N · (1 − p) · p^(N−1) · λ).

For N = 1 this is exactly 1/λ = mttp (today's single-instance behaviour, unchanged). For
mttp = 1 h and r = 2 min, four instances give a group MTTP of about 7,700 h, so a 4-instance
job takes insurance saves about √(7700) ≈ 88× less often than a 1-instance job on the same
market (Young/Daly intervals grow as √MTTP).

What breaks the model: preemptions that come in waves (a zone reclaims all its spot capacity
at once) are correlated, and then N instances in one zone are lost together about as often as
one. The Bamboo and Parcae traces show such waves; spread the instances over zones, or
expect the store checkpoint to matter more than this rate says. `simulate_group_losses`
checks the formula (tests/policy/test_group_loss.py).
"""

from __future__ import annotations

import math
import random

__all__ = ["group_loss_rate", "group_mttp", "simulate_group_losses"]


def _check(mttp: float, instances: int, replace_s: float) -> None:
    if not (mttp > 0) or math.isnan(mttp):
        raise ValueError(f"mttp={mttp!r}: give the mean time to preemption of one instance, > 0 seconds")
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise ValueError(f"instances={instances!r}: give a whole number >= 1")
    if not (replace_s >= 0) or math.isinf(replace_s):
        raise ValueError(f"replace_s={replace_s!r}: give the seconds a replacement takes to join, >= 0")


def group_loss_rate(mttp: float, instances: int, replace_s: float) -> float:
    """Group losses per second of running (see the module docstring); 1/mttp for one instance."""
    _check(mttp, instances, replace_s)
    lam = 1.0 / mttp
    if math.isinf(mttp):
        return 0.0
    if instances == 1:
        return lam
    x = lam * replace_s
    p = x / (1.0 + x)
    up = 1.0 - p**instances
    if up <= 0.0:
        return lam
    return instances * (1.0 - p) * p ** (instances - 1) * lam / up


def group_mttp(mttp: float, instances: int, replace_s: float) -> float:
    """Mean running time between losses of the whole group (math.inf when it cannot happen:
    instant replacement)."""
    rate = group_loss_rate(mttp, instances, replace_s)
    return math.inf if rate <= 0.0 else 1.0 / rate


def simulate_group_losses(
    mttp: float,
    instances: int,
    replace_s: float,
    horizon: float,
    rng: random.Random,
    replace: str = "exp",
) -> tuple[int, float]:
    """Monte-Carlo check: (group losses, running time) over `horizon` seconds of N slots that
    fail at rate 1/mttp and are replaced after Exp(replace_s) (`replace="exp"`) or exactly
    `replace_s` (`"fixed"`). A group loss is the moment the last slot that was up fails."""
    _check(mttp, instances, replace_s)
    if replace not in ("exp", "fixed"):
        raise ValueError(f"replace={replace!r}: 'exp' or 'fixed'")
    lam = 1.0 / mttp
    # next transition time of each slot and whether it is up
    up = [True] * instances
    nxt = [rng.expovariate(lam) for _ in range(instances)]
    t, losses, running, live = 0.0, 0, 0.0, instances
    while True:
        i = min(range(instances), key=nxt.__getitem__)
        t_next = min(nxt[i], horizon)
        if live > 0:
            running += t_next - t
        t = t_next
        if t >= horizon:
            return losses, running
        if up[i]:
            up[i] = False
            live -= 1
            if live == 0:
                losses += 1
            d = rng.expovariate(1.0 / replace_s) if replace == "exp" and replace_s > 0 else replace_s
            nxt[i] = t + d
        else:
            up[i] = True
            live += 1
            nxt[i] = t + rng.expovariate(lam)
