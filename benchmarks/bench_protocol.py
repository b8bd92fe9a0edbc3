"""Issue 12's guard: the typed protocol and the one reducer cost no more than the dict events did.

    python benchmarks/bench_protocol.py --before /path/to/a/checkout/of/eccafb5

Runs the same measurements in alternating subprocesses against this checkout and the "before"
checkout (PYTHONPATH decides which spotnb is imported), several rounds, and prints medians and
after/before ratios measured in this one run. Asserts nothing.

1. ctx.steps + ctx.log per step (µs): the training loop's cost (benchmarks/bench_core.py, 5.)
2. reading a log: EventReader.poll of a 200,000-row job written by that version (µs per row)
3. folding it into the views' reducer (µs per metric row): before, `widget.state.JobState`;
   after, `spotnb.core.state.JobState` (which also folds what Job and the ledger used to re-derive)
Widget messages per second: `python benchmarks/bench_widget.py --only messages` (one process;
run it in each checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

PROBE = textwrap.dedent(
    """
    import json, sys, tempfile, time
    sys.path.insert(0, sys.argv[1] + "/benchmarks")
    from bench_core import _Never, make_context
    from spotnb.core.store import Store
    from spotnb.views.widget.synthetic import synthetic_events
    try:
        from spotnb.core.state import JobState
    except ImportError:
        from spotnb.views.widget.state import JobState
    from spotnb.core.events import EventReader, EventWriter

    store = Store(tempfile.mkdtemp())
    out = {}
    # 1. the training loop
    ctx, ckpt = make_context(store, _Never())
    n = 300_000
    t0 = time.perf_counter()
    for _ in range(n):
        pass
    bare = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in ctx.steps(n):
        ctx.log(loss=1.0)
    out["step_us"] = (time.perf_counter() - t0 - bare) / n * 1e6
    ckpt.close()
    # 2. a log of 200,000 rows, written by this version, read back
    batches = list(synthetic_events(steps=200_000, preempt_at=(60_000, 150_000), save_every=5_000,
                                    rows_per_flush=500))
    rows = sum(len(e.get("rows") or ()) for b in batches for e in b)
    writer = EventWriter(store, "bench", 1, "agent")
    for batch in batches:
        for e in batch:
            e = dict(e)
            kind = e.pop("kind")
            e.pop("incarnation", None)
            try:
                from spotnb.core import protocol
                writer.emit(protocol.from_json({**e, "kind": kind}))
            except ImportError:
                writer.emit(kind, **e)
        writer.flush()
    t0 = time.perf_counter()
    events = EventReader(store, "bench").poll()
    out["read_us_per_row"] = (time.perf_counter() - t0) / rows * 1e6
    # 3. fold them
    t0 = time.perf_counter()
    state = JobState()
    state.feed_events(events)
    out["fold_us_per_row"] = (time.perf_counter() - t0) / rows * 1e6
    print(json.dumps(out))
    """
)


def run(tree: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tree)], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, type=Path, help="a checkout of the previous version")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for _ in range(args.rounds):  # alternate, so a busier moment hits both alike
        results["before"].append(run(args.before.resolve()))
        results["after"].append(run(HERE))
    for key, label in (
        ("step_us", "ctx.steps + ctx.log per step (us)"),
        ("read_us_per_row", "EventReader.poll per metric row (us)"),
        ("fold_us_per_row", "reducer fold per metric row (us)"),
    ):
        before = statistics.median(r[key] for r in results["before"])
        after = statistics.median(r[key] for r in results["after"])
        print(f"{label:<40} before {before:7.3f}  after {after:7.3f}  after/before {after / before:5.2f}")


if __name__ == "__main__":
    main()
