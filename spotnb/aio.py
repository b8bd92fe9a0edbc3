"""Awaiting a job: `await job`, `await job.wait_async()`, `async for event in job.stream()`.

A job's events arrive on a follower or controller thread; these functions bridge them into
the caller's event loop with `loop.call_soon_threadsafe` (no polling, no thread parked per
waiter), so they work wherever a loop runs: `asyncio.run`, an async web handler, and a Jupyter
cell, whose top-level `await` runs on the kernel's own loop.

Why no nest-asyncio: it is needed only when synchronous code must run a coroutine to
completion inside a loop that is already running. Nothing here does: the synchronous API
(`job.result()`, `job.wait()`) waits on threading events, and the asynchronous one is native.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from spotnb.core.events import EventSink
from spotnb.core.protocol import TERMINAL, Event, Status

__all__ = ["wait_async", "result_async", "stream", "AwaitableJob"]


class AwaitableJob(Protocol):
    """What these functions need of a job (`spotnb.job.Job` is one). Named as a protocol, not
    imported, so that `job` imports `aio` and `aio` imports nothing of `job`: no circle."""

    @property
    def id(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def done(self) -> bool: ...

    def result(self, timeout: float | None = None) -> Any: ...

    def add_done_callback(self, callback: Callable[[], None]) -> None: ...

    def remove_done_callback(self, callback: Callable[[], None]) -> None: ...

    def add_sink(self, sink: EventSink, replay: bool = True) -> None: ...

    def remove_sink(self, sink: EventSink) -> None: ...


_END = object()


async def wait_async(job: AwaitableJob, timeout: float | None = None) -> bool:
    """True once the job has ended; False if `timeout` seconds pass first."""
    if job.done:
        return True
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def on_end() -> None:  # any thread
        loop.call_soon_threadsafe(_settle, ended)

    job.add_done_callback(on_end)
    try:
        await asyncio.wait_for(asyncio.shield(ended), timeout)
        return True
    except asyncio.TimeoutError:
        return False
    finally:
        job.remove_done_callback(on_end)


async def result_async(job: AwaitableJob, timeout: float | None = None) -> Any:
    """What `job.result()` returns (or raises), awaited: `await job`."""
    if not await wait_async(job, timeout):
        raise TimeoutError(f"job {job.id} still {job.status} after {timeout} s")
    # the result is read from the store (and verified) off the loop: it may be remote
    return await asyncio.get_running_loop().run_in_executor(None, job.result, 0)


async def stream(job: AwaitableJob) -> AsyncIterator[Event]:
    """Every event of the job so far, then each new one as it arrives; ends after the status
    event that ends the job (or at once after the last one, for a job already ended; a job
    found `lost` ends the stream without an event). Leaving the loop early detaches."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()

    class _Sink:
        def on_events(self, events: list[Event]) -> None:  # the job's thread, or replay here
            loop.call_soon_threadsafe(queue.put_nowait, list(events))

    def on_end() -> None:
        loop.call_soon_threadsafe(queue.put_nowait, _END)

    sink = _Sink()
    job.add_sink(sink, replay=True)
    job.add_done_callback(on_end)
    try:
        while True:
            batch = await queue.get()
            if batch is _END:
                # the job ended: what the sinks got before the end is already queued
                while not queue.empty():
                    rest = queue.get_nowait()
                    if rest is not _END:
                        for event in rest:
                            yield event
                return
            for event in batch:
                yield event
                if isinstance(event, Status) and event.status in TERMINAL and job.done:
                    return
    finally:
        job.remove_sink(sink)
        job.remove_done_callback(on_end)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
