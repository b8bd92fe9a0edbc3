"""Savings are defined once (`spotnb.core.savings`) and every view says the same: the widget, the
lab panel's API (job list and job view), the text view and the CLI."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest

import spotnb as spot
from spotnb.control.jobdb import JobDB
from spotnb.core.savings import MIN_USEFUL_S, describe_savings
from spotnb.views.server.data import JobViews, list_payload
from spotnb.views.widget.text import progress_line
from spotnb.views.widget.view import render_info_html
from tests.support import jobfns
from tests.support.jobs import wait_for


@pytest.mark.parametrize(
    "spot_cost, on_demand, status, useful, fraction, text, tone",
    [
        (0.3, 1.0, "succeeded", 600, 0.7, "70% less than on demand", "good"),
        (2.0, 1.0, "succeeded", 600, -1.0, "100% more than on demand", "bad"),  # never green
        (0.3, 1.0, "running", MIN_USEFUL_S - 1, None, "savings shown after 1 min of training", "none"),
        (0.3, 1.0, "running", MIN_USEFUL_S, 0.7, "70% less than on demand", "good"),
        (0.3, 1.0, "failed", 600, None, "no savings figure: the job failed", "none"),
        (0.0, 0.0, "succeeded", 0, None, "savings shown after 1 min of training", "none"),
        # an on-demand price of 0 (Config.price_on_demand=0, a zone of a type the table lacks):
        # it said "shown after 1 min" for ever, however long the job trained
        (0.3, 0.0, "running", 600, None, "no savings figure: no on-demand price to compare with", "none"),
        (0.3, 0.0, "succeeded", 600, None, "no savings figure: no on-demand price to compare with", "none"),
    ],
)
def test_the_definition(
    spot_cost: float,
    on_demand: float,
    status: str,
    useful: float,
    fraction: float | None,
    text: str,
    tone: str,
) -> None:
    sv = describe_savings(spot_cost, on_demand, status, useful)
    assert sv.fraction == (pytest.approx(fraction) if fraction is not None else None)
    assert (sv.text, sv.tone) == (text, tone)
    assert "on demand for the same" in sv.baseline  # the baseline is always stated


def test_every_view_says_the_same_for_one_job() -> None:
    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=60),
        spot.Config(local_alloc_delay=0.1, ship_modules=["tests.support.jobfns"]),
    )
    job.result(timeout=120)
    cost = job.state.cost()
    text = cost["savings_text"]
    assert cost["savings"] is not None and text.endswith("than on demand")  # a finished job: final figure
    # the widget
    assert text in render_info_html(job.state, job.id)
    # the text view
    assert text in progress_line(job.state)

    # the panel's job list and job view. The job DB row gets the final figures when the
    # controller folds the job's last status, which the notebook may see first (on a busy
    # machine a poll in between read the row of a few seconds earlier: "1457% more")
    def row() -> dict:
        return next(r for r in list_payload(JobDB())["jobs"] if r["id"] == job.id)

    wait_for(lambda: row()["savings_text"] == text, 60, f"the panel's row never said {text!r}: {row()}")
    assert row()["savings"] == pytest.approx(cost["savings"], abs=0.005)
    detail = JobViews().detail(job.id, figures=False)
    assert detail is not None and detail["cost"]["savings_text"] == text
    # the CLI
    out = subprocess.run(
        [sys.executable, "-m", "spotnb.cli", "show", job.id], capture_output=True, text=True, env=os.environ
    )
    assert out.returncode == 0 and text in out.stdout, out.stderr
