"""What `spotnb.ctx()` costs a script (issue 13). Prints measured figures; asserts nothing.

    python benchmarks/bench_script_ctx.py [--steps 20000]

A script's ctx calls cross a Unix socket to the agent's Context (`spotnb.runtime.script.runner`):
this runs a real ScriptRunner on a real store, with a script doing `with ctx.step():
ctx.log(loss=...)` in a loop, and compares the time per step with the same loop on the
Context in this process (a function's `ctx`). Goal: a per-step overhead well under a
millisecond, i.e. under 1 % of a 100 ms training step.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from spotnb.core.spec import ScriptSpec  # noqa: E402
from spotnb.core.store import Store  # noqa: E402
from spotnb.policy import resolve_policy  # noqa: E402
from spotnb.runtime.beacon import Beacon  # noqa: E402
from spotnb.runtime.checkpoint.checkpointer import Checkpointer  # noqa: E402
from spotnb.runtime.context import Context  # noqa: E402
from spotnb.runtime.script.runner import ScriptRunner  # noqa: E402

SCRIPT = textwrap.dedent(
    """
    import sys, time
    import spotnb

    ctx = spotnb.ctx()
    n = int(sys.argv[1])
    ctx.log(warm=1)
    t0 = time.perf_counter()
    for i in range(n):
        with ctx.step():
            ctx.log(loss=1.0 / (i + 1))
    ctx.set_result((time.perf_counter() - t0) / n)
    """
)


def _context(root: str) -> Context:
    ckpt = Checkpointer(Store(os.path.join(root, "store")), "job", 1, lambda e: None, Beacon(None))
    return Context(
        job_id="job",
        incarnation=1,
        checkpointer=ckpt,
        policy=resolve_policy("static:1000000000"),
        emit=lambda e: None,
        flush=lambda: None,
        beacon=Beacon(None),
        market={"mttp": 3600.0, "restart": 60.0, "grace": 30.0},
    )


def main() -> None:
    import cloudpickle

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20000)
    n = parser.parse_args().steps
    with tempfile.TemporaryDirectory() as root:
        os.chdir(root)
        with open("loop.py", "w") as f:
            f.write(SCRIPT)
        ctx = _context(root)
        runner = ScriptRunner(
            ctx, ScriptSpec(path="loop.py", args=[str(n)]), lambda e: None, job_id="job", incarnation=1
        )
        remote = cloudpickle.loads(runner.run().pickled)
        local_ctx = _context(root + "/local")
        t0 = time.perf_counter()
        for i in range(n):
            with local_ctx.step():
                local_ctx.log(loss=1.0 / (i + 1))
        local = (time.perf_counter() - t0) / n
    print(f"with ctx.step(): ctx.log(...) per step, {n} steps")
    print(f"  in a function (same process):  {local * 1e6:8.1f} us")
    print(f"  in a script (over the socket): {remote * 1e6:8.1f} us")
    print(f"  script / function:             {remote / local:8.0f} x")
    print(f"  share of a 100 ms step:        {remote / 0.1 * 100:8.3f} %  (goal < 1 %)")


if __name__ == "__main__":
    main()
