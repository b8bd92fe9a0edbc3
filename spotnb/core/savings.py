"""What a job saved against on-demand, defined once for every view (widget, text view, job
view, panel, status bar, CLI, `job.cost()`), so they never disagree.

Definition: the spot spend (every instance's billed time at its spot price) against what the
same *useful* work would have cost on demand (the job's first-time compute seconds at the
on-demand price of the same instance type; recompute, saves, allocation and preparation are
spot overheads an on-demand run would not have had). A negative figure is said as "x% more
than on demand", never in the colour of a gain.

A percentage is withheld until it means something: while a job runs, until it has
`MIN_USEFUL_S` seconds of useful compute (before that the allocation and start-up dominate
and the figure swings from −400 % to +60 % in seconds); a job that failed or was lost shows
none (its work is not useful to anyone). A succeeded or stopped job shows its final figure.

Pure: imports nothing from spotnb, so the panel's server, the CLI and the widget share it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["MIN_USEFUL_S", "Savings", "describe_savings"]

#: seconds of useful compute before a running job's savings percentage is shown
MIN_USEFUL_S = 60.0

Tone = Literal["good", "bad", "none"]

_NO_FIGURE = frozenset({"failed", "lost"})
_FINAL = frozenset({"succeeded", "stopped"})


@dataclass(frozen=True)
class Savings:
    """`fraction`: 1 − spot / on-demand (0.62 = 62 % cheaper; negative = dearer), None when
    withheld. `text`: the sentence every view shows. `tone`: "good" (cheaper), "bad" (dearer)
    or "none" (withheld). `baseline`: what the figure is measured against, for a tooltip or
    a line under it."""

    fraction: float | None
    text: str
    tone: Tone
    baseline: str
    spot: float
    on_demand: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _money(x: float) -> str:
    return f"${x:.2f}" if abs(x) >= 1 else f"${x:.4f}"


def describe_savings(
    spot: float, on_demand: float, status: str, useful_s: float, instances: int = 1
) -> Savings:
    """The savings of a job that has spent `spot` dollars, whose `useful_s` seconds of
    first-time compute would have cost `on_demand` dollars on demand, in state `status`.
    `instances` side by side: `useful_s` is then instance-seconds, and the baseline says so."""
    spot, on_demand, useful_s = float(spot or 0.0), float(on_demand or 0.0), float(useful_s or 0.0)
    minutes = useful_s / 60.0
    what = "min of training" if instances <= 1 else f"instance-min of training on {instances} instances"
    baseline = f"vs {_money(on_demand)} on demand for the same {minutes:.1f} {what}"
    if status in _NO_FIGURE:
        return Savings(None, f"no savings figure: the job {status}", "none", baseline, spot, on_demand)
    if on_demand <= 0.0 and useful_s >= MIN_USEFUL_S:  # trained, but nothing to compare with
        text = "no savings figure: no on-demand price to compare with"
        return Savings(None, text, "none", baseline, spot, on_demand)
    if on_demand <= 0.0 or (status not in _FINAL and useful_s < MIN_USEFUL_S):
        return Savings(
            None,
            f"savings shown after {MIN_USEFUL_S / 60:.0f} min of training",
            "none",
            baseline,
            spot,
            on_demand,
        )
    fraction = 1.0 - spot / on_demand
    if fraction >= 0.0:
        text = f"{fraction:.0%} less than on demand"
        tone: Tone = "good"
    else:
        text = f"{-fraction:.0%} more than on demand"
        tone = "bad"
    return Savings(fraction, text, tone, baseline, spot, on_demand)
