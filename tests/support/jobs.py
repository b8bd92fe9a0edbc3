"""Helpers the core tests share: waiting on a live job's events, recording a checkpointer's
events, and a job that exists only in the store and the job DB (no controller, no instance)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

import spotnb as spot


class Until:
    """A sink that signals once an event matches."""

    def __init__(self, match: Callable[[dict], bool]) -> None:
        self.match, self.hit = match, threading.Event()

    def on_events(self, events: list[dict]) -> None:
        if any(self.match(e) for e in events):
            self.hit.set()


def wait_progress(job: spot.Job, step: int, timeout: float = 120) -> None:
    """Block until the job reported progress at or past `step` (an event, not a clock)."""
    until = Until(lambda e: e["kind"] == "progress" and e["step"] >= step)
    job.add_sink(until)
    assert until.hit.wait(timeout), f"job never reached step {step}"
    job.remove_sink(until)


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, what
        time.sleep(0.05)


class Recorder:
    """Stands in for the agent's `emit`: keeps the checkpointer's events."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def __call__(self, event: Any) -> None:
        self.events.append((event.kind, event.to_json()))

    def kinds(self, kind: str) -> list[dict]:
        return [f for k, f in self.events if k == kind]


def ckpt_state(step: int, size: int = 64) -> dict:
    return {"step": step, "objects": {"w": torch.full((size, size), float(step))}, "rng": {}, "user": {}}


def ckpt_save(c: Any, step: int, kind: str = "periodic", size: int = 64) -> None:
    c.save_now(c.snapshot(ckpt_state(step, size), step, kind))


def running_job_in_store(job_id: str) -> tuple[Any, Any, Any]:
    """A job the store and the job DB say is running, with no controller and no instance:
    (store, db, the api EventWriter, flushed)."""
    from spotnb.control.jobdb import JobDB
    from spotnb.core import protocol as ev
    from spotnb.core.events import EventWriter
    from spotnb.core.store import Store

    config = spot.Config()
    store, db = Store(config.store_url()), JobDB()
    db.add_job(
        job_id, name=None, provider="local", region=None, instance_type=config.instance_type, store=store.url
    )
    api = EventWriter(store, job_id, 0, "api")
    api.emit(ev.Submitted(name=None, provider="local", instance_type=config.instance_type, config={}))
    api.emit(ev.Status(status=ev.JobStatus.RUNNING))
    api.flush()
    return store, db, api


def assert_matches_reference(job: spot.Job, reference: Any, timeout: float = 300) -> Any:
    """The job's result and every logged loss equal the uninterrupted run's, bit for bit."""
    ref_result, ref_losses = reference
    result = job.result(timeout=timeout)
    for name, tensor in ref_result["params"].items():
        assert torch.equal(result["params"][name], tensor), name
    ref = dict(ref_losses)
    assert all(value == ref[step] for step, value in job.metrics["loss"])
    return result


@contextmanager
def mounted_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real, small filesystem at `path` (a full disk, a remount read-only). Mounting needs
    root: CI runs as root and must run these tests, so there a failed mount is an error; on a
    developer's machine without root the test is skipped, saying why."""
    path.mkdir(exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if done.returncode != 0:
        why = f"mounting a tmpfs needs root ({done.stderr.strip() or 'mount failed'})"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why + "; run as root, as CI does, to test a full or read-only store")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def assert_same_state(a: Any, b: Any) -> None:
    """`a` and `b` hold the same values, bit for bit: tensors of the same dtype and shape,
    containers of the same type and keys, other objects equal."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_state(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_state(x, y)
    else:
        assert a == b


def free_port() -> int:
    """A TCP port of this machine nobody listens on now (for a process group's store)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EventList(list):
    """A checkpointer's `emit` that keeps the events it is given, in order."""

    def __call__(self, event: Any) -> None:
        self.append(event)


def gloo_mesh(rank: int, world: int, port: int) -> Any:
    """Join a gloo process group of `world` CPU processes on `port`; its 1-D device mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    # a forked child's first parallel op waits forever on the parent's thread pool: one thread
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return init_device_mesh("cpu", (world,))


def agent_command(store_url: str, job_id: str, incarnation: int = 1) -> list[str]:
    """The command a provider launches: the agent of this job's incarnation."""
    return [
        "python",
        "-m",
        "spotnb.runtime.agent",
        "--store",
        store_url,
        "--job",
        job_id,
        "--incarnation",
        str(incarnation),
    ]
