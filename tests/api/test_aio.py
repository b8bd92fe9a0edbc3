"""Awaiting jobs (issue 12): `await job`, `job.wait_async()`, `async for e in job.stream()`, on
real local-market jobs, inside a running event loop — `asyncio.run`, and a real Jupyter kernel
whose cells run on the kernel's own loop (top-level `await`)."""

from __future__ import annotations

import asyncio
import functools
import os
import textwrap
from pathlib import Path

import pytest

import spotnb as spot
from tests.support.jobfns import fails_at, slow_steps
from tests.support.paths import REPO

pytestmark = pytest.mark.jobs

DEADLINE = 240.0  # generous: the suite must pass on a busy machine


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE))


def test_await_a_job_gives_its_result_and_the_stream_ends_with_it() -> None:
    job = spot.train(
        functools.partial(slow_steps, steps=40, step_time=0.01, hold_at=15),  # until the kill
        spot.Config(local_schedule=[{"step": 15, "phase": "step"}]),
    )

    async def main():
        kinds = [e.kind async for e in job.stream()]
        result = await job
        return kinds, result, await job.wait_async(0)

    kinds, result, ended = _run(main())
    assert result == 40 and ended
    assert kinds[-1] == "status" and job.events[-1].kind == "status"
    assert "preempted" in kinds and kinds.count("done") == 1
    # a stream of a job that has ended replays and ends, it does not wait for more
    again = _run(_collect(job))
    assert [e.kind for e in again] == [e.kind for e in job.events]
    assert not job._sinks and not job._done_callbacks


def test_await_raises_what_result_raises() -> None:
    failing = spot.train(functools.partial(fails_at, step_fail=3), spot.Config())
    with pytest.raises(spot.JobFailed, match="step 3"):
        _run(_await(failing))

    stopped = spot.train(functools.partial(slow_steps, steps=100_000, step_time=0.01), spot.Config())

    async def stop_when_running():
        async for e in stopped.stream():
            if e.kind == "progress":
                await asyncio.get_running_loop().run_in_executor(None, stopped.stop, False)
                break
        return await stopped

    with pytest.raises(spot.JobStopped):
        _run(stop_when_running())
    assert _run(stopped.wait_async(DEADLINE))


def test_cancelling_a_consumer_detaches_it() -> None:
    job = spot.train(functools.partial(slow_steps, steps=100_000, step_time=0.01), spot.Config())
    try:

        async def main():
            first = asyncio.Event()

            async def consume():
                async for _ in job.stream():
                    first.set()

            task = asyncio.create_task(consume())
            await first.wait()
            waiter = asyncio.create_task(job.wait_async())
            await asyncio.sleep(0)  # let both register
            task.cancel()
            waiter.cancel()
            for t in (task, waiter):
                with pytest.raises(asyncio.CancelledError):
                    await t
            return await job.wait_async(timeout=0.01)  # still running: a timeout, not a hang

        assert _run(main()) is False
        assert not job._sinks and not job._done_callbacks
    finally:
        job.stop()


def test_top_level_await_in_a_jupyter_kernel(tmp_path: Path) -> None:
    """A notebook cell's `await job` runs on the kernel's running event loop."""
    from jupyter_client.manager import start_new_kernel

    env = {
        **os.environ,
        "SPOTNB_HOME": os.environ["SPOTNB_HOME"],
        "SPOTNB_FAST": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(tmp_path))
    try:
        code = textwrap.dedent("""
            import asyncio, spotnb as spot
            import time
            def fit(ctx):
                total = 0
                for step in ctx.steps(20):
                    time.sleep(0.02)  # work inside the step, so the kill aimed at it finds it there
                    total += step
                return total
            job = spot.train(fit, spot.Config(local_schedule=[{"step": 8, "phase": "step"}]))
            kinds = [e.kind async for e in job.stream()]
            result = await job
            print("RESULT", result, asyncio.get_running_loop().is_running(), kinds[-1],
                  kinds.count("preempted"))
            """)
        reply = kc.execute_interactive(code, timeout=DEADLINE, output_hook=(out := _Out()))
        assert reply["content"]["status"] == "ok", out.text
        assert "RESULT 190 True status 1" in out.text, out.text
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


class _Out:
    def __init__(self) -> None:
        self.text = ""

    def __call__(self, msg) -> None:
        content = msg.get("content", {})
        self.text += content.get("text", "") + "".join(content.get("traceback", []))


async def _collect(job):
    return [e async for e in job.stream()]


async def _await(job):
    return await job
