"""What the three fake-cloud runs (tests/test_{aws,gcp,azure}_e2e.py) share: the job, the
preemption it survives, what the VMs' boot logs must say, and the scan for credentials.

Each run differs only in its cloud (moto; a fake Compute API behind google-cloud-compute's REST
transport; ARM behind the azure-mgmt clients), its store emulator and its VM runner; the story is
the same everywhere: two VMs boot from a Python with torch and without spotnb
(`tests/support/vm_image.py`), each installs the job's spotnb wheel from the store, the first is told of
a preemption at step 10, saves, leaves, and the second resumes from that save and finishes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

import spotnb as spot
from spotnb.providers.local.metadata import MetadataEmulator
from tests.support.clouds_fixtures import CANARIES
from tests.support.vm_image import torch_only_python

__all__ = [
    "STEPS",
    "fit",
    "emulator",
    "image",
    "survive_a_preemption",
    "assert_survived_like_cloud_images",
    "assert_no_canary",
]

STEPS = 30


def fit(ctx: Any) -> dict[str, Any]:
    """A tiny model trained STEPS steps; the first incarnation waits at step 10 until the
    cloud's notice has reached it (a hand-shake, not a timing guess)."""
    import time as _time

    import torch

    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx.track(model=model, optimizer=opt)
    for step in ctx.steps(STEPS):
        loss = model(torch.ones(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=loss.item())
        if ctx.incarnation == 1 and step == 10:
            t0 = _time.monotonic()
            while ctx.notice is None and _time.monotonic() - t0 < 60:
                _time.sleep(0.02)
    return {"steps": ctx.step_index, "incarnation": ctx.incarnation}


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cloud image's Python: torch, and nothing of spotnb."""
    return torch_only_python(tmp_path_factory.mktemp("image") / "pytorch")


@pytest.fixture
def emulator() -> Any:
    """spotnb's metadata emulator: each VM's notice source, in its cloud's format."""
    em = MetadataEmulator()
    yield em
    em.close()


def _wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def survive_a_preemption(
    job: spot.Job, notify: Callable[[str], None], logs: Path, show: Callable[[], None] | None = None
) -> Any:
    """Wait until incarnation 1 reaches step 10, tell its VM of a preemption (`notify(instance
    id)`), and return the job's result; on any failure print the events, the VMs' logs under
    `logs` and whatever `show` prints, then raise."""
    try:
        _wait(
            lambda: any(
                e["kind"] == "progress" and e["incarnation"] == 1 and e["step"] >= 10 for e in job.events
            ),
            90,
            "incarnation 1 to reach step 10",
        )
        first = next(
            e["instance_id"] for e in job.events if e["kind"] == "allocated" and e["incarnation"] == 1
        )
        notify(first)
        return job.result(timeout=150)
    except BaseException:
        for e in job.events:
            print({k: v for k, v in e.items() if k not in ("config", "rows", "traceback")})
        for log in logs.glob("*.log"):
            print(log, log.read_text()[-3000:])
        if show is not None:
            show()
        raise


def assert_survived_like_cloud_images(
    job: spot.Job, result: Any, cloud: str, boot_logs: Iterable[Path], image: Path
) -> None:
    """The job's story, as the events tell it, and each VM's boot log: it installed the store's
    wheel (checked by its sha256) and ran on the image's torch."""
    assert result == {"steps": STEPS, "incarnation": 2}
    kinds = [(e["incarnation"], e["kind"]) for e in job.events]
    for expected in [
        (1, "bootstrap"),
        (1, "ready"),
        (1, "notice"),
        (1, "evacuated"),
        (2, "allocated"),
        (2, "bootstrap"),
        (2, "resumed"),
        (2, "done"),
    ]:
        assert expected in kinds, expected
    resumed = next(e for e in job.events if e["kind"] == "resumed")
    assert resumed["from_step"] >= 11 and resumed["save_kind"] == "emergency"
    boots = [e for e in job.events if e["kind"] == "bootstrap" and e.get("phase") == "installed"]
    assert [(b["cloud"], b["installed"]) for b in boots] == [(cloud, 1), (cloud, 1)]  # each VM installed
    logs = list(boot_logs)
    assert len(logs) == 2
    for log in logs:
        text = log.read_text()
        assert "spotnb code: " in text and "checked (sha256" in text  # the store's wheel, checked
        assert f"{image}, the image's torch" in text and "installing torch" not in text
    print("install seconds per VM:", [round(b["install_s"], 1) for b in boots])


def assert_no_canary(
    blobs: dict[str, bytes], job: spot.Job, spotnb_home: Path, logs: Path, secrets: Iterable[bytes] = ()
) -> None:
    """Nothing spotnb wrote or sent holds a credential: `blobs` (the store's objects, what the
    cloud was sent), plus the job DB and logs, the VMs' logs and the events, are scanned for the
    canary credentials and `secrets`."""
    found = dict(blobs)
    assert any(k.endswith("spec.json") for k in found) and any("MANIFEST" in k for k in found)
    for path in spotnb_home.rglob("*"):  # job DB, logs
        if path.is_file():
            found[str(path)] = path.read_bytes()
    for path in logs.glob("*.log"):  # what the VMs printed
        found[str(path)] = path.read_bytes()
    found["events"] = repr(job.events).encode()
    assert len(found) > 10
    canaries = [v.encode() for v in CANARIES.values()] + list(secrets)
    leaks = [name for name, data in found.items() if any(s in data for s in canaries)]
    assert leaks == []
