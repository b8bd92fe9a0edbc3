"""Regional stores (`spotnb.market.regional`): what a verified copy costs next to a plain copy, and a
restore from the copy next to one from the home store. Prints figures of one run; asserts
nothing.

    python benchmarks/bench_regional.py            # ~100 MB of tracked state
    python benchmarks/bench_regional.py --mb 20

1. copy_checkpoint (stream + sha256 + read back) / shutil.copytree of the same folder
2. restore from the regional copy / restore from the home store (same disk here: ~1)
3. the controller's decision without the copy (listing + manifests + costs), ms
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from spotnb.core.store import Store  # noqa: E402
from spotnb.market.regional import copy_checkpoint, newest_committed  # noqa: E402
from spotnb.runtime.checkpoint.checkpointer import Checkpointer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=100)
    args = parser.parse_args()
    side = int((args.mb * 1e6 / 4) ** 0.5)
    tmp = tempfile.mkdtemp(prefix="bench-regional-")
    try:
        home, reg = Store(os.path.join(tmp, "home")), Store(os.path.join(tmp, "zone-b"))
        events: list = []
        ck = Checkpointer(home, "job", 1, events.append)
        state = {"w": torch.randn(side, side)}
        ck.save_now(ck.snapshot(state, 10, "periodic"))
        ck.close()
        seq, manifest = newest_committed(home, "job")
        nbytes = manifest["bytes"]
        t0 = time.perf_counter()
        copy_checkpoint(home, reg, "job", seq)
        copy_s = time.perf_counter() - t0
        src = home.job("job", "ckpt", f"{seq:08d}")
        t0 = time.perf_counter()
        shutil.copytree(src, os.path.join(tmp, "plain"))
        plain_s = time.perf_counter() - t0
        restore = {}
        for name, write, others in (("home", home, []), ("copy", reg, [home])):
            c = Checkpointer(write, "job", 2, events.append, read_stores=others)
            t0 = time.perf_counter()
            found = c.load_latest()
            restore[name] = time.perf_counter() - t0
            assert found is not None and c.restored_from == write.url
            c.close()
        t0 = time.perf_counter()
        for _ in range(20):
            newest_committed(home, "job")
            newest_committed(reg, "job")
        decide_ms = (time.perf_counter() - t0) / 20 * 1e3
        print(f"checkpoint {nbytes / 1e6:.0f} MB")
        print(f"1. verified copy {copy_s:.3f} s / plain copy {plain_s:.3f} s = {copy_s / plain_s:.2f}")
        print(
            f"2. restore from the copy {restore['copy']:.3f} s / from home {restore['home']:.3f} s "
            f"= {restore['copy'] / restore['home']:.2f}"
        )
        print(f"3. finding the newest checkpoint in two stores: {decide_ms:.2f} ms")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
