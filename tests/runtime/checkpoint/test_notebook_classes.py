"""State whose classes were defined in the notebook checkpoints and restores.

A notebook defines classes in `__main__`; cloudpickle ships them by value with the function,
so on the instance they have no importable home, and plain pickle (what `torch.save` uses
unless told otherwise) refused them: every checkpoint failed and a preempted job started
again from step 0, with only `checkpoint_failed` events to say so. The script below is the
notebook: its class lives in `__main__` of a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.jobs

ROOT = Path(__file__).parents[3]

NOTEBOOK = textwrap.dedent(
    """
    import json, sys
    import spotnb as spot
    from tests.support import jobfns

    STORE = sys.argv[1].removeprefix("file://")


    class Tally:  # defined in the notebook: __main__.Tally
        def __init__(self) -> None:
            self.seen: list[int] = []


    def train(ctx):
        import torch

        ctx.track(model=torch.nn.Linear(2, 2))
        for step in ctx.steps(30):  # ctx.state is the restored one from the first step on
            tally = ctx.state.setdefault("tally", Tally())
            tally.seen.append(step)
            if step == 24 and ctx.incarnation == 1:
                jobfns.wait_for_checkpoint(ctx, STORE, 20)
            if step == 25 and ctx.incarnation == 1:
                jobfns.hold_for_the_market(ctx)
        return ctx.state["tally"].seen


    job = spot.train(
        train,
        spot.Config(
            store=sys.argv[1],
            ship_modules=["tests.support.jobfns"],
            checkpoint="static:10",
            local_schedule=[{"step": 25, "phase": "step"}],
        ),
    )
    seen = job.result(timeout=120)
    failed = [e.get("error") for e in job.events if e["kind"] == "checkpoint_failed"]
    resumed = [e["from_step"] for e in job.events if e["kind"] == "resumed"]
    print(json.dumps({"seen": seen, "failed": failed, "resumed": resumed}))
    """
)


def test_a_class_defined_in_the_notebook_survives_a_preemption_in_the_checkpoint(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPOTNB_HOME": str(tmp_path / "home")}
    out = subprocess.run(
        [sys.executable, "-c", NOTEBOOK, (tmp_path / "store").as_uri()],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["failed"] == []
    assert got["resumed"] == [20]
    # the tally came back with the step it was saved at: each step once, none lost or repeated
    assert got["seen"] == list(range(30))
