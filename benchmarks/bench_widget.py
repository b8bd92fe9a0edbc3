"""Widget benchmarks (issue 4).

1. Front-end messages per second while a job logs 5,000 steps/s: synthetic events are fed to a
   live `JobView` (its real flusher thread, the wall clock) through a recording comm that
   timestamps every message. Goal: ≤ 10 messages in any one-second window.
2. Kernel-side CPU of following a real local job: a child process runs a job on the local spot
   market (with preemptions); this process `spot.attach`es to it and shows it in a `JobView`.
   CPU = `time.process_time()` of this whole process (store tailing + folding + widget) over the
   job's wall time. Goal: ≤ 2 % of one core.

    python benchmarks/bench_widget.py [--seconds 10] [--rate 5000] [--job-steps 3000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class RecordingComm:
    kernel = "recording"
    n = 0

    def __init__(self, log: list[float], **kwargs: Any) -> None:
        RecordingComm.n += 1
        self.comm_id = f"bench-{RecordingComm.n}"
        self.log = log

    def open(self, *a: Any, **k: Any) -> None:
        pass

    def on_msg(self, cb: Any) -> None:
        pass

    def on_close(self, cb: Any) -> None:
        pass

    def send(self, data: Any = None, metadata: Any = None, buffers: Any = None) -> None:
        self.log.append(time.monotonic())

    def close(self, *a: Any, **k: Any) -> None:
        pass


def _install_recording_comm() -> list[float]:
    import comm

    log: list[float] = []
    comm.create_comm = lambda **kw: RecordingComm(log, **kw)  # the comm package's own hook
    return log


def bench_messages(seconds: float, rate: int) -> None:
    from spotnb.views.widget.synthetic import synthetic_events
    from spotnb.views.widget.view import JobView

    log = _install_recording_comm()
    view = JobView(None)
    opened = len(log)
    steps = int(seconds * rate)
    # the agent flushes every ~0.5 s; we deliver every 10 ms to be harsher (50 rows per batch)
    rows = max(1, rate // 100)
    batches = synthetic_events(
        steps=steps,
        preempt_at=(steps // 2 + 137,),
        step_time=1.0 / rate,
        rows_per_flush=rows,
        save_every=max(rows, rate),
    )
    fold_cpu = 0.0
    start = time.monotonic()
    t_first = None
    delivered = 0
    for batch in batches:
        t_first = batch[0]["t"] if t_first is None else t_first
        due = start + (batch[-1]["t"] - t_first) * 1.0
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        c0 = time.thread_time()
        view.on_events(batch)
        fold_cpu += time.thread_time() - c0
        delivered += sum(len(e.get("rows", ())) for e in batch if e["kind"] == "metrics")
    fed = time.monotonic() - start
    assert view._thread is not None
    view._thread.join(30)
    wall = time.monotonic() - start
    flusher_cpu = view.cpu_s
    stamps = log[opened:]
    worst = max((sum(1 for s in stamps if a <= s < a + 1.0) for a in stamps), default=0)
    print(
        f"[messages] {delivered} metric rows fed at {rate:,} steps/s while training, in {fed:.1f} s "
        f"including two simulated relaunches ({delivered / fed:,.0f} steps/s on average)"
    )
    print(
        f"[messages] front-end messages: {len(stamps)} in {wall:.1f} s = {len(stamps) / wall:.1f}/s "
        f"on average, worst 1-s window {worst} (goal <= 10); figure refreshes "
        f"{view.figure_flushes}, final status shown: {view.state.status}"
    )
    print(
        f"[messages] plotted points per trace <= {max(len(s) for s in view.state.first.values())} "
        f"(of {view.state.first['loss'].count} steps logged)"
    )
    print(
        f"[messages] kernel CPU: folding {fold_cpu / fed:.1%} of a core at {rate} steps/s"
        f", drawing (flusher thread) {flusher_cpu / wall:.1%}"
    )


CHILD = textwrap.dedent("""
    import sys, time, torch, spotnb as spot
    STEPS = int(sys.argv[1])
    def fit(ctx):
        torch.set_num_threads(1)
        model = torch.nn.Linear(10, 1); opt = torch.optim.SGD(model.parameters(), lr=0.01)
        ctx.track(model=model, optimizer=opt)
        for step in ctx.steps(STEPS):
            x = torch.randn(32, 10); loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            ctx.log(loss=loss.item(), lr=0.01)
            time.sleep(0.002)
        return loss.item()
    job = spot.train(fit, spot.Config(local_schedule=[6, {"step": STEPS * 2 // 3}], local_grace=2,
                                      save_every=max(1, STEPS // 6), notice_poll=0.1))
    print(job.id, flush=True)
    job.result(timeout=600)
""")


def bench_follow(job_steps: int) -> None:
    import spotnb as spot
    from spotnb.views.widget.view import JobView

    _install_recording_comm()
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "SPOTNB_HOME": os.environ.get("SPOTNB_HOME") or tmp,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        os.environ["SPOTNB_HOME"] = env["SPOTNB_HOME"]
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(job_steps)], cwd=tmp, env=env, stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        job_id = child.stdout.readline().strip()
        cpu0, wall0 = time.process_time(), time.monotonic()
        job = spot.attach(job_id)
        view = JobView(job)
        job.wait(600)
        assert view._thread is not None
        view._thread.join(30)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        child.wait(60)
        b = job.breakdown()
        steps = sum(s.count for s in view.state.first.values()) // max(1, len(view.state.first))
        print(
            f"[follow] real local job {job_id}: {b.step} steps, {b.preemptions} preemptions, "
            f"{wall:.1f} s wall, ~{steps / max(wall, 1e-9):,.0f} steps/s logged, status {job.status}"
        )
        print(
            f"[follow] CPU of this process (attach + tail store + widget): {cpu:.2f} s over "
            f"{wall:.1f} s = {cpu / wall:.2%} of one core (goal <= 2 %); "
            f"{view.figure_flushes} figure refreshes, {view.budget.total} messages"
        )
        print(
            f"[follow]   of which widget: folding {view.fold_cpu_s:.2f} s, drawing {view.cpu_s:.2f} s "
            f"({(view.fold_cpu_s + view.cpu_s) / wall:.2%}); the rest is attach + store tailing "
            f"(Job.follow polls every 0.25 s) + the interpreter"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--job-steps", type=int, default=3000)
    ap.add_argument("--only", choices=("messages", "follow"))
    args = ap.parse_args()
    if args.only in (None, "messages"):
        bench_messages(args.seconds, args.rate)
    if args.only in (None, "follow"):
        bench_follow(args.job_steps)


if __name__ == "__main__":
    main()
