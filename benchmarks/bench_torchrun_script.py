"""A torchrun DDP script on two spot instances (`spot.run(..., Config(instances=2))`): what one
preemption without notice costs, on the local market (real processes, a real SIGKILL).

    python benchmarks/bench_torchrun_script.py [--steps 200] [--every 20] [--kill 110]

Runs `tests/support/scripts/ddp_train.py` twice, calm and with instance 1 killed at step `--kill`,
and prints: wall times, the pause (rank 0's last metric row before the kill to its first after:
the survivors' restart, the lone round, the replacement's join), the steps redone (the kill's
step minus the checkpoint every round restarted from), and the wall time a preemption cost
(kill run − calm run). Compare with `bench_elastic.py` (spot.train + ctx.replicate: survivors do
not restart). One run on one machine; its load is printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
SCRIPT = HERE.parent / "tests" / "support" / "scripts" / "ddp_train.py"


def run(steps: int, every: int, kill: int | None) -> dict[str, Any]:
    import spotnb as spot

    work = Path(tempfile.mkdtemp(prefix="bench-torchrun-script-"))
    shutil.copy(SCRIPT, work / "ddp_train.py")
    os.chdir(work)
    schedule = [{"instance": 1, "step": kill}] if kill is not None else None
    config = spot.Config(instances=2, local_alloc_delay=0.1, local_schedule=schedule)
    t0 = time.time()
    job = spot.run("ddp_train.py", [str(steps), "ckpt", str(every), "0.02"], config, detach=False)
    result = job.result(timeout=900)
    wall = time.time() - t0
    events = job.events
    rows = sorted((r["t"], r["step"]) for e in events if e["kind"] == "metrics" for r in e["rows"])
    out: dict[str, Any] = {"wall_s": wall, "start_to_first_step_s": rows[0][0] - t0 if rows else None}
    killed = [e for e in events if e["kind"] == "preempted"]
    if killed:
        kt = killed[0]["t"]
        before = [t for t, _ in rows if t <= kt]
        after = [t for t, _ in rows if t > kt]
        resumed = [e["from_step"] for e in events if e["kind"] == "resumed" and e["t"] > kt]
        out["pause_s"] = after[0] - before[-1] if before and after else None
        out["redone_steps"] = kill - min(resumed) if resumed and kill is not None else None
    assert result["agree"], result
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--kill", type=int, default=110)
    args = parser.parse_args()
    os.environ.setdefault("SPOTNB_HOME", tempfile.mkdtemp(prefix="bench-home-"))
    calm = run(args.steps, args.every, None)
    hit = run(args.steps, args.every, args.kill)
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    first = calm["start_to_first_step_s"]
    print(f"calm run:                 {calm['wall_s']:6.1f} s (first step after {first:.1f} s)")
    print(f"one kill at step {args.kill}:    {hit['wall_s']:6.1f} s")
    print(f"  pause of rank 0:        {hit.get('pause_s') or float('nan'):6.1f} s")
    print(f"  steps redone:           {hit.get('redone_steps')} (checkpoint every {args.every})")
    print(f"  cost of the preemption: {hit['wall_s'] - calm['wall_s']:6.1f} s of wall time")


if __name__ == "__main__":
    main()
