"""A synthetic but protocol-faithful event stream, for widget tests, benchmarks and demos.

It follows the event shapes the controller and agent emit (see `spotnb.core.events`): allocation,
preparation, periodic checkpoints, metric flushes of many rows, a kill that loses the steps
since the last checkpoint, a relaunch that resumes and recomputes them. Time is simulated
(`t` advances by `step_time` per step), so a million-step job is generated in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

__all__ = ["synthetic_events"]


def synthetic_events(
    steps: int = 1000,
    preempt_at: tuple[int, ...] = (450,),
    save_every: int = 100,
    step_time: float = 0.01,
    rows_per_flush: int = 50,
    t0: float = 1.7e9,
    fail_at: int | None = None,
    spot_price: float = 0.158,
    on_demand_price: float = 0.526,
) -> Iterator[list[dict[str, Any]]]:
    """Yield batches of events (one batch ≈ one flush of the agent) for a job of `steps` steps,
    killed without notice when it first reaches each step in `preempt_at`."""
    t = t0
    inc = 0
    step = 0
    seq = 0
    saved = 0
    pending = sorted(preempt_at)
    high = 0  # highest step reached by an earlier instance

    def ev(kind: str, n: int, **f: Any) -> dict[str, Any]:
        return {"t": t, "kind": kind, "incarnation": n, **f}

    yield [
        ev("submitted", 0, name="synthetic", provider="local", instance_type="g4dn.xlarge", config={}),
        ev("status", 0, status="pending"),
    ]
    while True:
        inc += 1
        yield [ev("allocating", inc, region="local", attempt=1)]
        t += 0.5
        yield [
            ev(
                "allocated",
                inc,
                instance_id=f"local-{inc:04x}",
                region="local",
                instance_type="g4dn.xlarge",
                alloc_s=0.5,
                spot_price=spot_price,
                on_demand_price=on_demand_price,
            ),
            ev("status", 0, status="running" if inc == 1 else "restoring"),
        ]
        t += 1.0
        first = [ev("started", inc, pid=1000 + inc, host="vm")]
        if saved:
            first.append(ev("resumed", inc, from_step=saved, seq=seq, save_kind="periodic", restore_s=0.01))
        first.append(ev("ready", inc, prep_s=1.0, step=saved, total=steps))
        first.append(ev("status", 0, status="running"))
        yield first
        step = saved
        start_step = saved
        compute = recompute = 0.0
        rows: list[dict[str, Any]] = []
        killed = False
        while step < steps:
            if pending and step >= pending[0]:
                pending.pop(0)
                killed = True
                break
            if fail_at is not None and step == fail_at:
                yield [
                    ev(
                        "error",
                        inc,
                        message="RuntimeError: boom",  # as the agent writes it
                        exc_type="RuntimeError",
                        traceback='Traceback (most recent call last):\n  File "fit", line 1\n'
                        "RuntimeError: boom\n",
                    ),
                    ev("status", 0, status="failed"),
                ]
                return
            t += step_time
            if step < high:
                recompute += step_time
            else:
                compute += step_time
            rows.append(
                {"step": step, "t": t, "loss": 2.0 * math.exp(-step / (steps / 5)) + 0.05, "lr": 1e-3}
            )
            step += 1
            batch: list[dict[str, Any]] = []
            if step % save_every == 0:
                seq += 1
                saved = step
                batch.append(
                    ev(
                        "checkpoint",
                        inc,
                        seq=seq,
                        save_kind="periodic",
                        step=step,
                        snapshot_s=0.002,
                        upload_s=0.01,
                        bytes=15_000,
                    )
                )
            if len(rows) >= rows_per_flush or batch or step == steps:
                batch.append(ev("metrics", inc, rows=rows))
                batch.append(
                    ev(
                        "progress",
                        inc,
                        step=step,
                        total=steps,
                        steps_done=step - start_step,
                        compute_s=compute,
                        recompute_s=recompute,
                        save_s=0.002 * seq,
                        step_time=step_time,
                    )
                )
                rows = []
                yield batch
        if killed:
            high = max(high, step)
            if rows:
                yield [ev("metrics", inc, rows=rows)]
            t += 0.05
            yield [
                ev(
                    "preempted",
                    inc,
                    instance_id=f"local-{inc:04x}",
                    lifetime_s=1.0,
                    how="preempted",
                    phase="train",
                    step=step,
                    noticed=False,
                ),
                ev("status", 0, status="preempted"),
            ]
            continue
        t += 0.05
        yield [
            ev("done", inc, result="result.pkl", step=steps),
            ev("exited", inc, instance_id=f"local-{inc:04x}", lifetime_s=1.0, reason="done", code=0),
            ev("status", 0, status="succeeded"),
        ]
        return
