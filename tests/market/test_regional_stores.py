"""Checkpoints in several stores (`Config.regional_stores`, `spotnb.market.regional`): the copy, the
restore across stores with its fall-backs, pruning across stores, the cost rule and the
refusals. Real checkpointers on real folders; no job runs here (tests/market/test_regional.py
runs jobs)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import spotnb as spot
from spotnb.core.store import Store
from spotnb.market.regional import CopyFailed, Regional, choose, copy_checkpoint, newest_committed
from spotnb.runtime.checkpoint.checkpointer import Checkpointer
from tests.support.jobs import Recorder, ckpt_save, mounted_tmpfs
from tests.support.paths import FIXTURES

pytestmark = pytest.mark.jobs

KEY = b"k" * 32
JOB = "job"


def _ck(store: Store, others: list[Store] = (), n: int = 1) -> tuple[Checkpointer, Recorder]:  # type: ignore[assignment]
    rec = Recorder()
    return Checkpointer(store, JOB, n, rec, keep_last=2, key=KEY, read_stores=list(others)), rec


def _flip(store: Store, path: str) -> None:
    data = bytearray(store.read_bytes(path))
    data[len(data) // 2] ^= 0xFF  # same size, one byte: only the hash can tell
    store.write_bytes(path, bytes(data))


@pytest.fixture
def stores(tmp_path: Path) -> tuple[Store, Store]:
    return Store((tmp_path / "home").as_uri()), Store(str(tmp_path / "zone-b"))


def test_a_copy_is_committed_by_its_manifest_and_restores_signed(stores) -> None:
    """The copy verifies every file and writes the manifest last, unchanged: the agent in the
    new region checks its signature there as at home and restores the same state."""
    home, reg = stores
    ck, _ = _ck(home)
    ckpt_save(ck, 10)
    ck.close()
    seq, _ = newest_committed(home, JOB)
    copied, _ = copy_checkpoint(home, reg, JOB, seq)
    assert copied > 0 and newest_committed(reg, JOB)[0] == seq
    there, rec = _ck(reg)  # only the regional store: the copy alone must restore
    manifest, state = there.load_latest()
    assert manifest.step == 10 and torch.equal(state["objects"]["w"], torch.full((64, 64), 10.0))
    assert there.restored_from == reg.url and not rec.kinds("checkpoint_invalid")
    there.close()


def test_a_damaged_regional_copy_falls_back_to_the_home_copy_then_to_an_older_checkpoint(stores) -> None:
    """A flipped byte in the copy: the same checkpoint is taken from the home store. A newer
    checkpoint that only the regional store has, damaged: the newest good one anywhere."""
    home, reg = stores
    ck, _ = _ck(home)
    ckpt_save(ck, 10)
    ck.close()
    seq, _ = newest_committed(home, JOB)
    copy_checkpoint(home, reg, JOB, seq)
    _flip(reg, reg.job(JOB, "ckpt", f"{seq:08d}", "state.pt"))
    there, rec = _ck(reg, [home], n=2)
    manifest, state = there.load_latest()
    assert (manifest.seq, manifest.step, there.restored_from) == (seq, 10, home.url)
    (bad,) = rec.kinds("checkpoint_invalid")
    assert bad["seq"] == seq and reg.url in bad["reason"]
    # a newer save in the region, then damaged: back to the step-10 checkpoint (at home)
    ckpt_save(there, 20)
    newer = there.list_manifests()[0]
    assert newer.step == 20 and newest_committed(reg, JOB)[0] == newer.seq
    assert newest_committed(home, JOB)[0] == seq  # the new save went to the region only
    _flip(reg, reg.job(JOB, "ckpt", f"{newer.seq:08d}", "state.pt"))
    again, _ = _ck(reg, [home], n=3)
    manifest, _ = again.load_latest()
    assert (manifest.step, again.restored_from) == (10, home.url)
    there.close()
    again.close()


def test_a_regional_store_that_disappeared_restores_from_home(stores, tmp_path) -> None:
    home, reg = stores
    ck, _ = _ck(home)
    ckpt_save(ck, 10)
    ck.close()
    seq, _ = newest_committed(home, JOB)
    copy_checkpoint(home, reg, JOB, seq)
    import shutil

    shutil.rmtree(tmp_path / "zone-b")
    there, _ = _ck(Store(str(tmp_path / "zone-b")), [home], n=2)
    manifest, _ = there.load_latest()
    assert manifest.step == 10 and there.restored_from == home.url
    there.close()


def test_pruning_counts_checkpoints_across_stores_and_keeps_every_copy_of_a_kept_one(stores) -> None:
    """keep the newest two checkpoints anywhere: the copied one stays in both stores while it
    is one of them, and goes from both once two newer ones exist in the region; the write
    store's blobs stay while listed."""
    home, reg = stores
    ck, _ = _ck(home)
    ckpt_save(ck, 10)
    ckpt_save(ck, 20)
    ck.close()
    seq, _ = newest_committed(home, JOB)
    copy_checkpoint(home, reg, JOB, seq)
    there, _ = _ck(reg, [home], n=2)
    there.load_latest()
    ckpt_save(there, 30)
    kept = {m.seq: m.step for m in there.list_manifests()}
    assert sorted(kept.values()) == [20, 30]
    assert newest_committed(home, JOB)[0] == seq and newest_committed(reg, JOB)[0] == seq + 1
    home_seqs = [n for n in home.ls(home.job(JOB, "ckpt")) if n.isdigit()]
    assert home_seqs == [f"{seq:08d}"]  # the step-10 one went; the copied one is still kept at home
    ckpt_save(there, 40)
    assert sorted(m.step for m in there.list_manifests()) == [30, 40]
    assert not [n for n in home.ls(home.job(JOB, "ckpt")) if n.isdigit()]
    there.close()


def test_a_copy_into_a_full_disk_leaves_nothing_committed(stores, tmp_path) -> None:
    """Attack: the regional folder is a 64 kB filesystem; the checkpoint is ~1 MB. The copy
    fails, naming the store, and leaves no manifest and no temp file behind."""
    home, _ = stores
    ck, _ = _ck(home)
    ckpt_save(ck, 10, size=512)
    ck.close()
    seq, _ = newest_committed(home, JOB)
    with mounted_tmpfs(tmp_path / "full", "64k") as full:
        reg = Store(str(full))
        with pytest.raises(CopyFailed, match="full"):
            copy_checkpoint(home, reg, JOB, seq)
        assert newest_committed(reg, JOB) is None
        leftovers = [
            f for _, _, files in os.walk(full) for f in files if ".tmp-" in f or f == "MANIFEST.json"
        ]
        assert not leftovers


def test_a_copy_of_a_damaged_source_is_refused(stores) -> None:
    home, reg = stores
    ck, _ = _ck(home)
    ckpt_save(ck, 10)
    ck.close()
    seq, _ = newest_committed(home, JOB)
    _flip(home, home.job(JOB, "ckpt", f"{seq:08d}", "state.pt"))
    with pytest.raises(CopyFailed, match=r"does not match its manifest \(blake3/size\)"):
        copy_checkpoint(home, reg, JOB, seq)
    assert newest_committed(reg, JOB) is None


@pytest.mark.parametrize(
    "fixture, key", [("ckpt_v1", None), ("ckpt_v2", b"ckpt_v2 fixture key, not secret!")]
)
def test_checkpoints_of_either_digest_are_copied_and_restore_from_the_copy(stores, fixture, key) -> None:
    """ckpt_v1 (sha256 entries only) and ckpt_v2 (BLAKE3 for files written by value, sha256 for
    blobs, a gated tensors.bin): the copy checks whichever digest each entry carries, and the
    regional copy alone restores."""
    home, reg = stores
    src = FIXTURES / fixture / "ckpt"
    shutil.copytree(src, home.job(JOB, "ckpt"))
    copied, _ = copy_checkpoint(home, reg, JOB, 2)
    assert copied > 0 and newest_committed(reg, JOB)[0] == 2
    rec = Recorder()
    there = Checkpointer(reg, JOB, 2, rec, key=key)
    try:
        manifest, _ = there.load_latest()
        assert manifest.seq == 2 and there.restored_from == reg.url and not rec.kinds("checkpoint_invalid")
    finally:
        there.close()


def test_the_cost_rule() -> None:
    """copy = B·r(source→target) + B·r(target→zone); read across = B·r(source→zone) +
    S·b·r(zone→source); the copy only when strictly cheaper."""
    same = {"copy": 0.02, "local": 0.0, "across": 0.02, "back": 0.02}
    many = choose(2e9, 1e9, 5.0, same, "home", "zb")
    assert many.action == "copy" and many.write == "zb"
    assert many.copy_cost == pytest.approx(0.04) and many.read_cost == pytest.approx(0.04 + 5 * 0.02)
    assert many.cost == pytest.approx(0.04) and many.save_per_gb == 0.0
    none_left = choose(2e9, 1e9, 0.0, same, "home", "zb")  # nothing saved there: a tie reads across
    assert none_left.action == "read_across" and none_left.write == "home"
    assert none_left.save_per_gb == 0.02 and none_left.cost == pytest.approx(0.04)
    # a dear copy route (across clouds) against a cheap restore and few saves back
    dear = {"copy": 0.12, "local": 0.0, "across": 0.02, "back": 0.02}
    assert choose(2e9, 1e9, 3.0, dear, "home", "zb").action == "read_across"
    assert choose(2e9, 1e9, 30.0, dear, "home", "zb").action == "copy"


def _local(tmp_path: Path, **fields: Any) -> spot.Config:
    zones = {"zone-a": {"price": 0.1}, "zone-b": {"price": 0.05, "egress": 0.02}}
    return spot.Config(local_regions=zones, regions="cheapest", **fields)


def test_the_controllers_choice_copies_and_falls_back_to_reading_across_when_the_copy_fails(tmp_path) -> None:
    """`Regional.place` on the local market: with saves expected in zone-b it copies and
    points the instance there; into a store that refuses the copy (a full disk) it reads
    across, with a warning and the read's cost."""
    from spotnb.settings.registry import get_provider_class

    home = Store((tmp_path / "home").as_uri())
    ck, _ = _ck(home)
    ckpt_save(ck, 10, size=512)
    ck.close()
    seq, _ = newest_committed(home, JOB)
    with mounted_tmpfs(tmp_path / "full", "64k") as full:
        for folder, action in ((tmp_path / "zone-b", "copy"), (full, "read_across")):
            config = _local(tmp_path, regional_stores={"zone-b": str(folder)})
            provider = get_provider_class("local")(config)
            regional = Regional(config, provider, home, JOB)
            doc, fields, warnings = regional.place("zone-b", lambda step: 5.0, 0, None)
            assert fields["action"] == action and fields["seq"] == seq
            assert doc["read"] == [home.url, str(folder)]
            assert doc["write"] == (str(folder) if action == "copy" else home.url)
            assert fields["copy_cost"] == pytest.approx(fields["nbytes"] / 1e9 * 0.02)
            assert bool(warnings) == (action == "read_across")
            # zone-a has no store of its own: the checkpoint stays where it is, home
            doc, fields, _ = regional.place("zone-a", lambda step: 5.0, 0, None)
            assert fields["action"] == "in_place" and doc["write"] == home.url


@pytest.mark.parametrize(
    ("stores", "words"),
    [
        ({"zone-c": "/tmp/x"}, "cannot run in 'zone-c'"),
        ({"zone-b": "s3://key:secret@bucket/x"}, "credentials"),
        ({"zone-b": "az://container/x?sig=abc"}, "query"),
        ({"zone-b": "relative/folder"}, "relative path"),
        ({"zone-b": "/proc/no/such/folder"}, "cannot be created"),
        ({"zone-b": "/etc/hostname"}, "not a folder"),
        ({"zone-b": "http://example.com/x"}, "can only be read"),
        ({}, "give {region or zone"),
    ],
)
def test_bad_regional_stores_are_refused_before_anything_runs(tmp_path, stores: dict, words: str) -> None:
    with pytest.raises(spot.ConfigError, match=rf"regional_stores.*{__import__('re').escape(words)}"):
        _local(tmp_path, regional_stores=stores)


def test_regional_stores_are_refused_for_a_job_on_several_processes(tmp_path) -> None:
    with pytest.raises(spot.ConfigError, match="regional_stores applies to jobs on one instance"):
        _local(tmp_path, regional_stores={"zone-b": str(tmp_path / "b")}, procs_per_instance=2)


def test_the_home_store_under_another_spelling_is_refused_and_never_copied_onto_itself(tmp_path) -> None:
    """Attack: `file:///…/store` and `/…/store` are one folder. As a regional store it would
    have the copy delete the newest manifest of the home store before rewriting it (a kill in
    between: the committed checkpoint is gone). Refused at Config, and the copy refuses it."""
    home_url = spot.Config().store_url()
    home = Store(home_url)
    with pytest.raises(spot.ConfigError, match="is the job's home store"):
        _local(tmp_path, regional_stores={"zone-b": home.root + "/"})
    ck, _ = _ck(home)
    ckpt_save(ck, 10)
    ck.close()
    seq, _ = newest_committed(home, JOB)
    with pytest.raises(CopyFailed, match="same store"):
        copy_checkpoint(home, Store(home.root), JOB, seq)
    assert newest_committed(home, JOB)[0] == seq


def test_regional_stores_are_refused_on_a_multi_gpu_type_that_would_run_a_group(tmp_path) -> None:
    """A group's other ranks restore from the home store only, so rank 0 must too: a type
    with several GPUs (procs_per_instance defaults to their count) needs procs_per_instance=1."""
    fields: dict[str, Any] = dict(
        provider="aws",
        instance_type="g5.12xlarge",
        regions=["us-east-1a", "us-west-2a"],
        store="s3://home-bucket/spot",
        regional_stores={"us-west-2": "s3://west-bucket/spot"},
    )
    with pytest.raises(spot.ConfigError, match="procs_per_instance=1"):
        spot.Config(**fields)
    assert spot.Config(**fields, procs_per_instance=1).regional_stores == {
        "us-west-2": "s3://west-bucket/spot"
    }


def test_an_instance_whose_regional_store_cannot_be_opened_saves_at_home_and_still_reads_all(
    tmp_path, monkeypatch
) -> None:
    """Attack: the controller pointed the instance at a regional folder that cannot be made
    on it (gone, unmounted). The agent saves in the home store, with a warning, rather than
    not at all, and still restores from every store it can open."""
    import json

    from spotnb.runtime.agent import Agent

    home = Store((tmp_path / "home").as_uri())
    reg = str(tmp_path / "zone-b")
    inc = home.job(JOB, "incarnations")
    home.write_bytes(f"{inc}/0002.json", json.dumps({"incarnation": 2, "ckpt_doc": True}).encode())
    doc = {"write": "/proc/no/such/store", "read": [home.url, "/proc/no/such/store", reg]}
    home.write_bytes(f"{inc}/0002.ckpt.json", json.dumps(doc).encode())
    agent = Agent(home.url, JOB, 2)
    write, read = agent._checkpoint_stores()
    assert write is agent.store and [s.url for s in read] == [reg]
    agent.events.flush()
    said = [getattr(e, "message", "") for e in _agent_events(home) if e.kind == "warning"]
    assert any("cannot be opened" in m for m in said) and any("saving in the home store" in m for m in said)


def _agent_events(store: Store) -> list[Any]:
    from spotnb.core.events import EventReader

    return EventReader(store, JOB).poll()


def test_the_cost_rule_with_an_unknown_length_and_free_saves_back_stays_a_number() -> None:
    """Attack: a job of unknown length (infinite expected saves) whose saves cross back for
    free (or a checkpoint of 0 bytes): inf × 0 is NaN, which made every comparison false —
    the copy was never taken even when it costs less than the restore across, and the event
    carried a NaN cost. Saves that cost nothing add nothing."""
    import math

    free_back = {"copy": 0.0, "local": 0.0, "across": 0.02, "back": 0.0}
    got = choose(2e9, 1e9, math.inf, free_back, "home", "zb")
    assert math.isfinite(got.read_cost) and got.read_cost == pytest.approx(0.04)
    assert got.action == "copy" and got.cost == 0.0
    empty = choose(0.0, 0.0, math.inf, {"copy": 0.02, "local": 0.0, "across": 0.02, "back": 0.02}, "h", "z")
    assert (empty.copy_cost, empty.read_cost, empty.action) == (0.0, 0.0, "read_across")
    assert "nan" not in empty.reason


@pytest.mark.parametrize("url", ["  {d}/zb  ", "{d}/zb\n", "\t{d}/zb"])
def test_a_regional_store_url_with_spaces_around_it_is_refused(tmp_path, url: str) -> None:
    """Attack: the check read the URL stripped, the controller and the agent used it as given:
    '  /d/zb  ' became a folder named '  /d/zb  ' under each process's working directory (the
    copy in one, the instance's saves in another), '/d/zb\\n' a folder whose name ends in a
    line break. Refused, naming the field."""
    with pytest.raises(spot.ConfigError, match=r"regional_stores\['zone-b'\].*spaces or a line break"):
        _local(tmp_path, regional_stores={"zone-b": url.format(d=tmp_path)})


@pytest.mark.parametrize("raw", [b'{"write": "/x", "re', b"[1, 2]", b'{"write": "/x", "read": "/x/y"}'])
def test_a_damaged_checkpoint_document_makes_the_agent_give_up_with_a_warning(tmp_path, raw: bytes) -> None:
    """Attack: `incarnations/0002.ckpt.json` truncated, not an object, or with a string where
    the list of stores goes (each character became a store: folders named '/', 'x', 'y' under
    the working directory). The agent says which file is damaged and gives up (the controller
    relaunches with a new document) rather than dying on a traceback or opening odd stores."""
    import json

    from spotnb.runtime.agent import Agent

    home = Store((tmp_path / "home").as_uri())
    inc = home.job(JOB, "incarnations")
    home.write_bytes(f"{inc}/0002.json", json.dumps({"incarnation": 2, "ckpt_doc": True}).encode())
    home.write_bytes(f"{inc}/0002.ckpt.json", raw)
    agent = Agent(home.url, JOB, 2)
    with pytest.raises(RuntimeError, match=r"0002\.ckpt\.json.*damaged"):
        agent._checkpoint_stores()


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (dict(provider="aws", store="s3://home-bucket/spot"), "cannot reach"),
        (dict(provider="aws", store="s3://home-bucket/spot", url="file:///srv/west"), "cannot reach"),
        (dict(provider="aws", store="s3://home-bucket/spot", url="memory://west"), "one process"),
        (dict(url="memory://west"), "one process"),
    ],
)
def test_a_regional_store_the_instances_cannot_reach_is_refused(tmp_path, fields: dict, words: str) -> None:
    """Attack: a folder as the regional store of a job on cloud VMs (the home store's check
    refuses it, this one did not), or a memory:// store (one process's): the controller copied
    the checkpoint there on its own machine, and the instance in that zone saved every
    checkpoint onto its own disk or memory, gone with it at the next preemption. Refused,
    naming the entry, before anything runs."""
    url = fields.pop("url", str(tmp_path / "west"))
    if fields.get("provider") == "aws":
        config = dict(instance_type="g5.xlarge", regions=["us-east-1a", "us-west-2a"], **fields)
        with pytest.raises(spot.ConfigError, match=rf"regional_stores\['us-west-2'\].*{words}"):
            spot.Config(**config, regional_stores={"us-west-2": url})
        assert spot.Config(**config, regional_stores={"us-west-2": "s3://west/spot"}).regional_stores
    else:
        with pytest.raises(spot.ConfigError, match=rf"regional_stores\['zone-b'\].*{words}"):
            _local(tmp_path, regional_stores={"zone-b": url})


def test_a_damaged_blob_in_the_write_store_is_written_again_not_reused_by_later_saves(stores) -> None:
    """Attack: one flipped byte in a blob (a frozen tensor, stored by content) of the copy in
    the regional store. The instance there restored the home copy, then each save found the
    damaged blob "already there" (same size) and listed it: every checkpoint it committed was
    unrestorable, pruning then deleted the good home one, and the next restore found nothing —
    the job would have started over. The blob that failed verification is written again."""
    base = torch.arange(256 * 256, dtype=torch.float32).reshape(256, 256)  # 256 kB: a blob
    frozen = {base.untyped_storage().data_ptr()}

    def save(ck: Checkpointer, step: int) -> None:
        state = {
            "step": step,
            "objects": {"base": base, "w": torch.full((8, 8), float(step))},
            "rng": {},
            "user": {},
        }
        ck.save_now(ck.snapshot(state, step, "periodic", frozen=frozen))

    home, reg = stores
    ck, _ = _ck(home)
    save(ck, 10)
    ck.close()
    seq, manifest = newest_committed(home, JOB)
    copy_checkpoint(home, reg, JOB, seq)
    (sha,) = [meta["sha256"] for meta in manifest["files"].values() if meta.get("blob")]
    _flip(reg, reg.job(JOB, "ckpt", "blobs", sha))
    there, _ = _ck(reg, [home], n=2)
    assert there.load_latest()[0].step == 10 and there.restored_from == home.url
    save(there, 20)
    save(there, 30)  # keep_last=2: the home checkpoint goes now
    there.close()
    again, rec = _ck(reg, [home], n=3)
    found = again.load_latest()
    assert found is not None and found[0].step == 30 and again.restored_from == reg.url
    assert torch.equal(found[1]["objects"]["base"], base) and not rec.kinds("checkpoint_invalid")
    again.close()


def test_two_checkpoints_that_got_one_number_while_a_store_was_out_of_reach_restore_the_newer(stores) -> None:
    """Attack: the regional store holds checkpoint 2 (step 20); it is out of reach when the
    next instance (at home) picks its numbers, so its step-30 save is also number 2, at home.
    Once the region is back, an instance writing there took its own copy first (the write
    store's) and restored step 20: ten committed steps thrown away. Of two checkpoints with one
    number, the one further on is restored."""
    home, reg = stores
    ck, _ = _ck(home)
    ckpt_save(ck, 10)
    ck.close()
    copy_checkpoint(home, reg, JOB, 1)
    there, _ = _ck(reg, [home], n=2)
    there.load_latest()
    ckpt_save(there, 20)  # number 2, in the region
    there.close()
    back_home, _ = _ck(home, n=3)  # the region out of reach: it is not among its stores
    back_home.load_latest()
    ckpt_save(back_home, 30)  # number 2 again, at home
    back_home.close()
    assert newest_committed(home, JOB)[0] == newest_committed(reg, JOB)[0] == 2
    again, _ = _ck(reg, [home], n=4)
    manifest, _ = again.load_latest()
    assert (manifest.step, again.restored_from) == (30, home.url)
    again.close()
    # the controller places the one further on too: it is not "already" in the region
    newest = Regional.__new__(Regional)
    newest.home, newest.job_id, newest.urls, newest._stores = (
        home,
        JOB,
        {"zone-b": reg.url},
        {home.url: home, reg.url: reg},
    )
    seq, manifest, holders = newest.newest()
    assert (seq, manifest["step"], holders) == (2, 30, [home.url])


@pytest.mark.parametrize(
    "home", ["az://container/spot?sv=2022-11-02&sig=SECRET", "s3://b/x?X-Amz-Signature=SECRET"]
)
def test_a_home_store_url_with_a_token_is_refused_as_a_regional_one_is(tmp_path, home: str) -> None:
    """Attack: a regional store URL with a query (a SAS token) was refused, the home store's
    was not — and with regional stores the home store's URL is written into every
    `checkpoint_placed` event and incarnation document (its spec already carried it)."""
    with pytest.raises(spot.ConfigError, match=r"store.*query"):
        spot.Config(store=home)


def test_temp_files_a_killed_copy_or_save_left_among_the_blobs_are_removed_once_stale(stores) -> None:
    """Attack: a controller SIGKILLed while copying a blob (a frozen base model: gigabytes)
    leaves `blobs/<sha>.tmp-…` in the regional store, and an instance killed mid-upload the
    same at home; nothing ever removed them (the copy cleaned only the checkpoint's folder).
    The next copy and the next prune remove those untouched for `STALE_TEMP_S`; a younger one
    may be a live writer's and stays."""
    import time

    from spotnb.core.store import STALE_TEMP_S

    home, reg = stores
    ck, _ = _ck(home)
    ckpt_save(ck, 10)
    seq, _ = newest_committed(home, JOB)
    paths = {}
    for name, store in (("reg", reg), ("home", home)):
        blobs = store.job(JOB, "ckpt", "blobs")
        os.makedirs(blobs, exist_ok=True)
        old, young = (
            os.path.join(blobs, "a" * 64 + ".tmp-dead0001"),
            os.path.join(blobs, "b" * 64 + ".tmp-live0001"),
        )
        for p in (old, young):
            Path(p).write_bytes(b"x" * 1024)
        then = time.time() - STALE_TEMP_S - 5
        os.utime(old, (then, then))
        paths[name] = (old, young)
    copy_checkpoint(home, reg, JOB, seq)
    ckpt_save(ck, 20)  # prunes nothing yet, but cleans its own blobs folder
    ck.close()
    for old, young in paths.values():
        assert not os.path.exists(old) and os.path.exists(young)


@pytest.mark.parametrize(
    "raw",
    [
        '{"files": {}, "bytes": "x"}',
        '{"files": {}, "step": "x"}',
        '{"files": {}, "bytes": 1e400}',
        '{"files": {}, "bytes": -5e9}',
        '{"files": {}, "referenced": [1]}',
    ],
)
def test_a_manifest_with_bad_numbers_is_passed_over_by_the_controller_not_fatal(tmp_path, raw: str) -> None:
    """Attack: a newer manifest in a regional store whose byte count or step is text, a list,
    infinite or negative (damaged, or a foreign writer: the controller does not verify
    signatures). `Regional.place` raised (ValueError, OverflowError, TypeError) in the
    controller's loop, or billed a negative transfer. It is passed over, as the agent would
    refuse it, and the newest good checkpoint is placed."""
    from spotnb.settings.registry import get_provider_class

    home = Store((tmp_path / "home").as_uri())
    ck, _ = _ck(home)
    ckpt_save(ck, 10)
    ck.close()
    seq, _ = newest_committed(home, JOB)
    reg = Store(str(tmp_path / "zone-b"))
    reg.write_bytes(reg.job(JOB, "ckpt", "00000009", "MANIFEST.json"), raw.encode())
    assert newest_committed(reg, JOB) is None
    config = _local(tmp_path, regional_stores={"zone-b": str(tmp_path / "zone-b")})
    regional = Regional(config, get_provider_class("local")(config), home, JOB)
    _, fields, _ = regional.place("zone-a", lambda step: 5.0, 0, None)
    assert fields["seq"] == seq and fields["action"] == "in_place" and fields.get("cost", 0.0) >= 0.0
