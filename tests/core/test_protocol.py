"""The event protocol (issue 12): typed records, one reducer, logs of other spotnb versions.

The fixture `tests/fixtures/job_v0/` is a real job directory written by spotnb before the
protocol existed (commit eccafb5: plain dict events, no segment headers, a v1 JobSpec): a job
of 40 steps, killed without notice at step 20 and resumed. `expected.json` holds what that
version's own reader computed from it; `<job id>.key` is the throwaway key that job was signed
with (made for this fixture, it guards nothing).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotnb.core import protocol as ev
from spotnb.core.events import EventReader, EventWriter
from spotnb.core.spec import load_spec
from spotnb.core.state import JobState
from spotnb.core.store import Store
from spotnb.views.widget.text import event_text
from tests.support.paths import FIXTURES

FIXTURE = FIXTURES / "job_v0"


@pytest.fixture
def old_job(tmp_path: Path) -> tuple[Store, str, dict[str, Any]]:
    expected = json.loads((FIXTURE / "expected.json").read_text())
    job_id = expected["job_id"]
    dest = tmp_path / "store" / "jobs" / job_id
    shutil.copytree(FIXTURE, dest, ignore=shutil.ignore_patterns("expected.json", "*.key"))
    return Store((tmp_path / "store").as_uri()), job_id, expected


def test_a_log_written_before_the_protocol_reads_as_it_did(old_job) -> None:
    store, job_id, expected = old_job
    events = EventReader(store, job_id).poll()
    assert [e.kind for e in events] == expected["kinds"]
    assert not any(isinstance(e, ev.UnknownEvent) for e in events)
    state = JobState.from_events(events)
    assert state.status == ev.JobStatus.SUCCEEDED == expected["status"]
    assert state.n_skipped == 0
    got = state.breakdown().as_dict()  # every figure it had, as it was (newer ones may be added)
    assert {k: got[k] for k in expected["breakdown"]} == pytest.approx(expected["breakdown"])
    assert state.preemptions == 1 and state.checkpointed
    from spotnb.job import Job

    job = Job(job_id, store)
    job._ingest(events)
    got = job.breakdown().as_dict()
    assert job.status == "succeeded"
    assert {k: got[k] for k in expected["breakdown"]} == pytest.approx(expected["breakdown"])
    assert {k: [list(p) for p in v[:3]] for k, v in job.metrics.items()} == expected["metrics"]


def test_a_spec_of_the_first_version_still_loads(old_job) -> None:
    store, job_id, _ = old_job
    key = bytes.fromhex((FIXTURE / f"{job_id}.key").read_text().strip())  # a test key
    spec = load_spec(store, job_id, key)
    assert spec.spec_version == 1 and spec.name == "fixture-v0"
    config = spec.to_config()
    assert config.provider == "local" and config.save_every == 10


@pytest.mark.parametrize("cls", list(ev.EVENT_TYPES.values()), ids=lambda c: c.__name__)
def test_every_kind_round_trips_through_json(cls: type[ev.Event]) -> None:
    event = _example(cls).stamped(t=1234.5, incarnation=3, gen=2)
    again = ev.from_json(json.loads(json.dumps(event.to_json())))
    assert again == event and type(again) is cls
    assert again["kind"] == cls.KIND.value and again.get("t") == 1234.5


def test_unknown_kinds_and_fields_from_a_newer_writer_are_kept_and_shown(tmp_path: Path) -> None:
    """A job runs for days and may be read by an older spotnb: what it does not know is kept,
    shown in the feed, and never an exception."""
    store = Store((tmp_path / "s").as_uri())
    folder = store.job("j1", "events")
    lines = [
        {
            "t": 1.0,
            "kind": "segment",
            "incarnation": 1,
            "protocol": ev.PROTOCOL_VERSION + 5,
            "writer": "agent",
        },
        {"t": 2.0, "kind": "status", "incarnation": 0, "status": "running"},
        {"t": 3.0, "kind": "gpu_throttled", "incarnation": 1, "gpu": 0, "temp_c": 91},
        {
            "t": 4.0,
            "kind": "checkpoint",
            "incarnation": 1,
            "seq": 1,
            "save_kind": "tiered",
            "step": 10,
            "snapshot_s": 0.1,
            "upload_s": 0.2,
            "bytes": 5,
            "referenced_bytes": 0,  # a field this version knows (written with its default)
            "tier": "nvme",
        },
        {"t": 5.0, "kind": "status", "incarnation": 0, "status": "paused"},
    ]
    store.write_bytes(
        f"{folder}/0001-agent-00000.jsonl", b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    )
    events = EventReader(store, "j1").poll()
    kinds = [e.kind for e in events]
    assert kinds == ["status", "gpu_throttled", "checkpoint", "status"]  # header consumed
    unknown = events[1]
    assert isinstance(unknown, ev.UnknownEvent) and unknown["temp_c"] == 91
    assert unknown.to_json() == lines[2]
    ckpt = events[2]
    assert isinstance(ckpt, ev.Checkpoint) and ckpt.save_kind == "tiered" and ckpt.nbytes == 5
    assert ckpt.extra == {"tier": "nvme"} and ckpt.to_json() == lines[3]
    state = JobState.from_events(events)
    assert unknown in state.feed and "gpu_throttled" in event_text(unknown)
    assert state.status == "paused" and not state.done and state.n_skipped == 0


def test_values_of_the_wrong_type_do_not_stop_a_reader() -> None:
    odd = ev.from_json(
        {
            "t": "noon",
            "kind": "progress",
            "incarnation": "two",
            "step": "ten",
            "compute_s": float("nan"),
            "total": 1e400,
            "steps_done": True,
        }
    )
    assert isinstance(odd, ev.Progress)
    assert (odd.t, odd.incarnation, odd.step, odd.compute_s, odd.total, odd.steps_done) == (
        0.0,
        0,
        0,
        0.0,
        None,
        0,
    )
    state = JobState.from_events(
        [odd, {"kind": "preempted", "incarnation": 1, "t": 5, "lifetime_s": "long", "step": None}]
    )
    assert state.n_skipped == 0 and state.preemptions == 1
    # a status nobody can read changes nothing (it would otherwise read as `pending`)
    state.feed_events(
        [
            {"kind": "status", "t": 6, "status": "running"},
            {"kind": "status", "t": 7, "status": ["x"]},
            {"kind": "status", "t": 8},
        ]
    )
    assert state.status == "running" and [e.kind for e in state.feed[-2:]] == ["status", "status"]


def test_every_segment_starts_with_the_protocol_version(tmp_path: Path, monkeypatch) -> None:
    import spotnb.core.events as events_mod

    monkeypatch.setattr(events_mod, "SEGMENT_BYTES", 200)
    store = Store((tmp_path / "s").as_uri())
    writer = EventWriter(store, "j2", 1, "agent")
    for i in range(6):
        writer.emit(ev.Metrics(rows=[{"step": i, "loss": 0.5}]))
        writer.flush()
    folder = store.job("j2", "events")
    names = sorted(store.ls(folder))
    assert len(names) > 1
    for name in names:
        first = json.loads(store.read_bytes(f"{folder}/{name}").splitlines()[0])
        assert first["kind"] == "segment" and first["protocol"] == ev.PROTOCOL_VERSION
    reader = EventReader(store, "j2")
    assert [e["rows"][0]["step"] for e in reader.poll()] == list(range(6))
    assert set(reader.protocols.values()) == {ev.PROTOCOL_VERSION}


def test_terminal_statuses_are_defined_once() -> None:
    assert {s for s in ev.JobStatus if s.is_terminal} == ev.TERMINAL
    assert ev.JobStatus.LOST.is_terminal and not ev.JobStatus.PREEMPTED.is_terminal
    schema = ev.json_schema()
    assert sorted(schema["$defs"]["JobStatus"]["terminal"]) == sorted(s.value for s in ev.TERMINAL)
    assert {d["properties"]["kind"]["const"] for n, d in schema["$defs"].items() if "properties" in d} == set(
        ev.EVENT_TYPES
    )


def _example(cls: type[ev.Event]) -> ev.Event:
    """An instance of `cls` with a value of the right type in every field."""
    samples = {
        "float": 1.5,
        "int": 7,
        "str": "x",
        "bool": True,
        "dict[str, Any]": {"a": 1},
        "list[dict[str, Any]]": [{"step": 1, "loss": 0.5}],
        "list[str]": ["a"],
        "JobStatus": ev.JobStatus.RUNNING,
        "Outcome": ev.Outcome.EVACUATED,
        "SaveKind": ev.SaveKind.INSURANCE,
    }
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in ("t", "incarnation", "gen", "extra"):
            continue
        values[f.name] = samples[str(f.type).removesuffix(" | None")]
    return cls(**values)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from([*ev.EVENT_TYPES, "future_kind"]),
    fields=st.dictionaries(
        st.sampled_from(
            [
                "t",
                "incarnation",
                "gen",
                "step",
                "status",
                "rows",
                "seq",
                "save_kind",
                "how",
                "reason",
                "lifetime_s",
                "total",
                "spot_price",
                "bytes",
                "extra",
            ]
        ),
        _json,
        max_size=8,
    ),
)
def test_no_record_stops_a_reader(kind: str, fields: dict[str, Any]) -> None:
    """Whatever a writer (or a corrupt store) put in a record with a kind, reading it and
    folding it never raise, and what is read writes back as JSON."""
    event = ev.from_json({**fields, "kind": kind})
    json.dumps(event.to_json(), default=str)
    state = JobState()
    state.feed_events([event])
    state.breakdown(now=1e9)
    assert state.n_events == 1 and state.n_skipped == 0
