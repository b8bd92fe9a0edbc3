"""`spotnb simulate`: compare checkpoint policies on a scenario file from the shell.

    spotnb simulate --scenario job.yaml --policy adaptive --policy static:500 --runs 1000
    spotnb simulate --scenario job.yaml --json        # [{"policy", "mean", "std"}, ...]

The main CLI (`spotnb/cli.py`) calls `add_parser(subparsers)` and then `run(args)`; this
module also runs alone: `python -m spotnb.sim --scenario job.yaml`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["add_parser", "add_plan_parser", "run", "run_plan", "main", "DEFAULT_POLICIES"]

DEFAULT_POLICIES = ("static:1000", "young", "daly", "daly2", "adaptive", "hedged", "on-demand")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `simulate` sub-command on an argparse subparsers object."""
    from spotnb.policy import policy_names

    p = subparsers.add_parser(
        "simulate",
        help="simulate checkpoint policies on a spot scenario",
        description="Simulate a training job on spot VMs under several checkpoint policies. "
        "Policies: "
        + ", ".join(n + (":N" if n in ("static", "periodic") else "") for n in policy_names())
        + ", on-demand.",
    )
    p.add_argument("--scenario", required=True, help="scenario file (YAML or JSON)")
    p.add_argument(
        "--policy",
        action="append",
        dest="policies",
        metavar="NAME",
        help="policy to simulate; repeat for several (default: all)",
    )
    p.add_argument("--runs", type=int, default=100, help="independent runs (default 100)")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Execute `spotnb simulate`; returns the exit code."""
    from spotnb.sim.compare import run_policies
    from spotnb.sim.scenario import Scenario

    try:
        scenario = Scenario.load(args.scenario)
        if args.runs < 1:
            raise ValueError(f"--runs: give 1 or more, got {args.runs}")
        results = run_policies(scenario, list(args.policies or DEFAULT_POLICIES), args.runs, args.seed)
    except (OSError, ValueError) as exc:
        print(f"spotnb simulate: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = [
            {"policy": r.policy, "mean": _finite(r.mean), "std": _finite(r.std)}
            | ({"verdict": r.verdict} if r.verdict else {})
            for r in results
        ]
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"{scenario.name or args.scenario}: {scenario.steps} steps, {args.runs} runs, "
        f"seed {args.seed}; times in hours, cost in $"
    )
    cols = ("compute", "recompute", "save", "alloc", "prep", "total", "preemptions", "cost", "overhead")
    width = max(8, *(len(r.policy) for r in results))
    print(f"{'policy':<{width}} " + " ".join(f"{c:>11}" for c in cols))
    for r in results:
        if r.verdict:  # this policy's job cannot finish: why, instead of figures
            print(f"{r.policy:<{width}}   {r.verdict}")
            continue
        cells = []
        for c in cols:
            v = r.mean[c]
            if c in ("compute", "recompute", "save", "alloc", "prep", "total"):
                cells.append(f"{v / 3600:11.2f}")
            elif c == "overhead":
                cells.append(f"{v * 100:10.1f}%")
            else:
                cells.append(f"{v:11.2f}")
        print(f"{r.policy:<{width}} " + " ".join(cells))
    return 0


def add_plan_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `spotnb plan`: how many instances to rent for a scenario (spotnb.sim.fleet)."""
    p = subparsers.add_parser(
        "plan",
        help="pick the number of instances for a scenario (progress per dollar)",
        description="Simulate a job on several instances (elastic data parallel) for each "
        "instance count and rank them by steps per dollar, then by time.",
    )
    p.add_argument("--scenario", required=True, help="scenario file (YAML or JSON)")
    p.add_argument("--instances", default="1,2,4,8", help="instance counts to compare (default 1,2,4,8)")
    p.add_argument(
        "--sync-time", type=float, default=0.0, help="seconds of one all-reduce of the model (default 0)"
    )
    p.add_argument(
        "--sync",
        default="ddp,auto",
        help="sync strategies to compare, e.g. ddp,local_sgd:16,diloco:16,auto (default ddp,auto)",
    )
    p.add_argument("--join-time", type=float, default=0.1, help="peer state transfer seconds (default 0.1)")
    p.add_argument(
        "--coordinator-price",
        type=float,
        default=0.0,
        help="$/h of the on-demand coordinator a cloud job on several instances pays for the whole "
        "run (AWS t3.small: 0.0208; default 0, the local market's)",
    )
    p.add_argument("--runs", type=int, default=50, help="independent runs per count (default 50)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run_plan)
    return p


def run_plan(args: argparse.Namespace) -> int:
    """Execute `spotnb plan`; returns the exit code."""
    from spotnb.core.sync import parse_sync
    from spotnb.sim.fleet import plan_instances
    from spotnb.sim.scenario import Scenario

    try:
        scenario = Scenario.load(args.scenario)
        try:
            counts = [int(x) for x in str(args.instances).split(",") if x.strip()]
        except ValueError:
            counts = []
        if not counts or any(c < 1 or c > 64 for c in counts):
            raise ValueError(f"--instances: give counts between 1 and 64, e.g. 1,2,4; got {args.instances!r}")
        if args.runs < 1:
            raise ValueError("--runs must be positive")
        if not 0 <= args.coordinator_price < math.inf:
            raise ValueError(
                f"--coordinator-price: give $/h, a finite number >= 0; got {args.coordinator_price}"
            )
        for flag, value in (("--sync-time", args.sync_time), ("--join-time", args.join_time)):
            if not 0 <= value < math.inf:
                raise ValueError(f"{flag}: give seconds, a finite number >= 0; got {value}")
        syncs = tuple(x.strip() for x in str(args.sync).split(",") if x.strip())
        for sync in syncs or ("",):
            try:
                parse_sync(sync)
            except ValueError as exc:
                raise ValueError(f"--sync: {exc}") from None
        rows = plan_instances(
            scenario,
            counts,
            runs=args.runs,
            seed=args.seed,
            syncs=syncs,
            sync_time=args.sync_time,
            join_time=args.join_time,
            coordinator_price=args.coordinator_price,
        )
    except (OSError, ValueError) as exc:
        print(f"spotnb plan: error: {exc}", file=sys.stderr)
        return 2
    if args.json:  # JSON has no inf (free instances: steps per dollar): null
        print(json.dumps([_finite(r) for r in rows], indent=2))
        return 0
    print(f"{scenario.name or args.scenario}: {scenario.steps} steps, {args.runs} runs per count; best first")
    heads = (
        ("instances", 9),
        ("sync", 13),
        ("hours", 8),
        ("± sd", 7),
        ("cost $", 9),
        ("steps/$", 10),
        ("recompute s", 12),
    )
    print(" ".join(f"{h:>{w}}" for h, w in heads) + f" {'losses':>7}")
    for r in rows:
        if r.get("verdict"):  # this count cannot progress: why, instead of figures
            print(f"{r['instances']:>9} {r['sync']:>13}   {r['verdict']}")
            continue
        print(
            f"{r['instances']:>9} {r['sync']:>13} {r['wall_s'] / 3600:8.2f} {r['wall_sd'] / 3600:7.2f} "
            f"{r['cost']:9.2f} {r['steps_per_dollar']:10.0f} {r['recompute_s']:12.1f} "
            f"{r['group_losses']:7.2f}"
        )
    if any(r["sync"] != "ddp" for r in rows):
        print(
            "note: local_sgd / diloco / auto synchronise less often; how many more steps they need "
            "for the same loss is not simulated (measure it: python benchmarks/bench_sync.py)"
        )
    return 0


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    """JSON has no inf/nan: report them as null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spotnb")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["simulate", *(argv if argv is not None else sys.argv[1:])])
    return run(args)
