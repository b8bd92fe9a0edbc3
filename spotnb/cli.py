"""The `spotnb` command: run, jobs, logs, show, stop, resume, export, demo, simulate, plan, gc, doctor."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from typing import Any

from spotnb.core.protocol import JobStatus
from spotnb.settings.registry import registry

__all__ = ["main"]


def _fmt_age(t: float | None) -> str:
    if not t:
        return "-"
    s = time.time() - t
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


def cmd_jobs(args: argparse.Namespace) -> int:
    from spotnb.api import jobs

    rows = jobs()
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    if not rows:
        print("no jobs yet: try `spotnb demo`")
        return 0
    print(
        f"{'id':<24} {'name':<16} {'status':<10} {'provider':<8} {'type':<14} {'step':>11} "
        f"{'preempt':>7} {'spot $':>9} {'age':>6}"
    )
    order = {"running": 0, "restoring": 0, "preempted": 0, "pending": 1}
    for r in sorted(rows, key=lambda r: (order.get(r["status"], 2), -(r["created"] or 0))):
        step = f"{r['step'] or 0}/{r['total_steps'] or '?'}"
        print(
            f"{r['id']:<24} {(r['name'] or '-')[:16]:<16} {r['status']:<10} {r['provider']:<8} "
            f"{r['instance_type'][:14]:<14} {step:>11} {r['preemptions'] or 0:>7} "
            f"{r['spot_cost'] or 0:>9.4f} {_fmt_age(r['created']):>6}"
        )
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from spotnb.api import attach
    from spotnb.views.widget.text import event_line

    job = attach(args.job_id)
    shown = 0
    while True:
        done = job.done  # read before the events, so none that precede the end are missed
        events = job.events
        for e in events[shown:]:
            line = json.dumps(e, default=str) if args.all else event_line(e)
            if line:
                stamp = time.strftime("%H:%M:%S", time.localtime(e["t"]))
                print(line if args.all else f"{stamp} {line}")
        shown = len(events)
        if not args.follow or done:
            break
        job.wait(0.5)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from spotnb.api import attach

    job = attach(args.job_id)
    print(repr(job))
    if job.status == JobStatus.LOST:
        print(f"lost: {job.state.status_reason}")
    print(job.breakdown().table())
    from spotnb.views.widget.text import savings_text

    print(savings_text(job.state))
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from spotnb.api import attach

    job = attach(args.job_id)
    if job.done:
        print(f"job {job.id} already {job.status}")
        return 0
    job.stop(wait=not args.no_wait, timeout=args.timeout)
    if not args.no_wait and not job.done and not _controller_alive(job.id):
        _end_without_controller(job)
    print(f"job {job.id}: {job.status}")
    if args.no_wait or job.done:
        return 0
    print(
        f"spotnb stop: job {job.id} did not end within {args.timeout:g} s (its controller is "
        f"alive; see {_controller_log(job.id)})",
        file=sys.stderr,
    )
    return 1


def _controller_alive(job_id: str) -> bool:
    from spotnb.control.jobdb import JobDB

    return JobDB().controller_alive(job_id)


def _end_without_controller(job: Any) -> None:
    """A job whose controller cannot run (it crashes at start) would show `running` forever:
    record the stop in its log and the job DB ourselves. Its instance, if one is left, is
    beyond reach without the controller: say so."""
    from spotnb.control.jobdb import JobDB
    from spotnb.core import protocol as ev
    from spotnb.core.events import EventWriter

    reason = (
        "stopped by `spotnb stop` while no controller could run it (see "
        f"{_controller_log(job.id)}); an instance it left may still run: `spotnb gc`"
    )
    writer = EventWriter(job.store, job.id, 0, "stop")
    writer.emit(ev.Stopped(reason=reason))
    writer.emit(ev.Status(status=JobStatus.STOPPED, reason=reason))
    writer.flush()
    JobDB().update_job(job.id, status=JobStatus.STOPPED.value, burn_rate=0.0)
    job.wait(30)  # the follower reads the end back


def _controller_log(job_id: str) -> str:
    from spotnb.core.home import spotnb_home

    return str(spotnb_home() / "logs" / job_id / "controller.log")


def cmd_resume(args: argparse.Namespace) -> int:
    """Continue a failed or stopped job from its latest checkpoint (with the same function;
    from Python, `spot.resume(id, fn=fixed)` also replaces the function)."""
    from spotnb.api import resume

    overrides = _overrides(args.set)
    if overrides is None:
        return 2
    job = resume(args.job_id, **overrides)
    print(f"job {job.id} resumed: {job.status}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write a job's trained weights (its newest verified checkpoint, or --step's) into a
    folder as files other tools read (`spotnb.weights.export`)."""
    import logging

    from spotnb.weights import export

    logging.basicConfig(format="spotnb export: %(message)s")  # the skipped checkpoints, if any
    written = export(
        args.job_id,
        args.folder,
        step=args.step,
        format=args.format,
        store=args.store,
        overwrite=args.overwrite,
    )
    for path in written:
        print(path)
    return 0


def _overrides(items: list[str] | None) -> dict[str, Any] | None:
    """`--set FIELD=VALUE` items as Config overrides (JSON or a plain string); None if one is
    malformed (said on stderr)."""
    overrides: dict[str, Any] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            print(f"--set {item!r}: expected FIELD=VALUE, e.g. --set max_retries=2", file=sys.stderr)
            return None
        try:
            overrides[name] = json.loads(value)
        except ValueError:
            overrides[name] = value  # a plain string: "2m", "static:50"
    return overrides


def cmd_run(args: argparse.Namespace) -> int:
    """Run a script as a spot job and follow it in text until it ends: exit 0 when it
    succeeded, 1 when it failed or was stopped. Ctrl-C leaves the job running (its controller
    is its own process): `spotnb logs -f ID` follows it again."""
    from spotnb.script_job import run
    from spotnb.views.widget.text import event_line

    overrides = _overrides(args.set)
    if overrides is None:
        return 2
    script_args = [*args.args, *getattr(args, "after_dashes", [])]
    job = run(args.script, script_args, **overrides)
    print(f"job {job.id}: {shlex.join([args.script, *script_args])}", flush=True)
    shown = 0
    try:
        while True:
            done = job.done  # read before the events, so none that precede the end are missed
            events = job.events
            for e in events[shown:]:
                line = event_line(e)
                if line:
                    print(f"{time.strftime('%H:%M:%S', time.localtime(e['t']))} {line}", flush=True)
            shown = len(events)
            if done:
                break
            job.wait(0.5)
    except KeyboardInterrupt:
        print(f"\njob {job.id} goes on; follow it with: spotnb logs -f {job.id}", file=sys.stderr)
        return 130
    print(f"job {job.id}: {job.status}")
    if job.status == JobStatus.SUCCEEDED:
        result = job.result()
        if result is not None:  # what the script passed to ctx.set_result
            text = repr(result)
            print(f"result: {text if len(text) <= 2000 else text[:2000] + ' …'}")
        return 0
    err = job.state.error
    if err is not None and err.traceback:
        print(err.traceback.rstrip(), file=sys.stderr)
    return 1


def cmd_demo(args: argparse.Namespace) -> int:
    from spotnb.demo import run_demo

    return run_demo(steps=args.steps, step_delay=args.step_delay)


def cmd_controller(args: argparse.Namespace) -> int:
    from spotnb.api import run_controller

    return run_controller(args.job_id, args.store)


def cmd_providers(args: argparse.Namespace) -> int:
    """Every registered provider (built-in or from another package's entry point), whether its
    SDK is installed, what it cannot do and its Config fields."""
    from spotnb.settings.registry import describe_providers

    rows = describe_providers()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        state = "ready" if r["installed"] else f"not installed: {r['install']}"
        print(f"{r['name']:<8} {r['description']} ({state})")
        for feature, why in r["unsupported"].items():
            print(f"         no {feature}: {why}")
        print(f"         fields: {', '.join(r['fields'])}")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from spotnb.providers.cleanup import gc
    from spotnb.settings.config import Config

    ended = gc(args.provider, Config(provider=args.provider))
    for instance_id in ended:
        print(f"terminated {instance_id}")
    print(f"{len(ended)} instance(s) terminated")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spotnb", description="Spot GPU jobs from notebooks.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("jobs", help="list jobs (running first)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_jobs)
    p = sub.add_parser("logs", help="a job's events")
    p.add_argument("job_id")
    p.add_argument("--follow", "-f", action="store_true", help="keep following until the job ends")
    p.add_argument("--all", action="store_true", help="every event as JSON")
    p.set_defaults(func=cmd_logs)
    p = sub.add_parser("show", help="a job's status and breakdown")
    p.add_argument("job_id")
    p.set_defaults(func=cmd_show)
    p = sub.add_parser("stop", help="stop a job and its instance")
    p.add_argument("job_id")
    p.add_argument("--no-wait", action="store_true")
    p.add_argument("--timeout", type=float, default=120)
    p.set_defaults(func=cmd_stop)
    p = sub.add_parser("resume", help="continue a failed or stopped job from its latest checkpoint")
    p.add_argument("job_id")
    p.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="change a Config field (JSON or a plain string), repeatable",
    )
    p.set_defaults(func=cmd_resume)
    p = sub.add_parser(
        "export", help="write a job's trained weights (a checkpoint's) as safetensors or torch files"
    )
    p.add_argument("job_id")
    p.add_argument("folder", help="where to write them (created if missing)")
    p.add_argument("--format", choices=("safetensors", "torch"), default="safetensors")
    p.add_argument("--step", type=int, default=None, help="the checkpoint of this step (default: the newest)")
    p.add_argument("--store", default=None, help="the job's store URL, for a job this machine did not submit")
    p.add_argument("--overwrite", action="store_true", help="replace files that exist in the folder")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser(
        "run",
        help="run a Python script as a spot job and follow it: spotnb run train.py -- --lr 0.1",
    )
    p.add_argument("script", help="the .py file (shipped with the job)")
    p.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="a Config field (JSON or a plain string), repeatable: --set provider=aws",
    )
    p.add_argument(
        "args",
        nargs="*",
        default=[],  # without a default argparse calls a `*` positional required in its error
        help="the script's arguments; after -- everything goes to the script as given",
    )
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("demo", help="the quickstart on the local spot market")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--step-delay", type=float, default=0.01, help="seconds added to each step")
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("controller", help="drive a job until it ends (started for you by train)")
    p.add_argument("job_id")
    p.add_argument("--store", default=None)
    p.set_defaults(func=cmd_controller)
    p = sub.add_parser("gc", help="terminate instances left behind by spotnb jobs")
    p.add_argument("--provider", required=True, choices=sorted(registry()))
    p.set_defaults(func=cmd_gc)
    p = sub.add_parser("providers", help="the providers spotnb knows, their fields and capabilities")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_providers)
    from spotnb.doctor.report import add_parser as add_doctor

    add_doctor(sub)
    try:
        from spotnb.sim.cli import add_parser as add_simulate
        from spotnb.sim.cli import add_plan_parser
    except ImportError:
        pass
    else:
        add_simulate(sub)
        add_plan_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    after: list[str] = []
    if argv[:1] == ["run"] and "--" in argv:  # `spotnb run train.py --set k=v -- --lr 0.1 ...`
        cut = argv.index("--")
        argv, after = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    args.after_dashes = after
    from spotnb.errors import SpotnbError

    try:
        result: Any = args.func(args)
    except SpotnbError as exc:  # bad input (an ambiguous id, no such job): say so, no traceback
        print(f"spotnb {args.command}: {exc}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
