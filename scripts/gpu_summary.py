"""The summary `scripts/gpu-check.sh` prints: the device, the gpu tests' outcome, the figures the
tests reported (`SPOTNB_GPU_REPORT`) and the checkpoint benchmark's rows. Exits 1 when a test
failed or a part produced nothing (timed out), so the script's status says whether all is well."""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

#: the lines of a benchmark log that are measurements (printed as they are made)
MEASURED = re.compile(r"^(== .*==|    [^ ].*: \d+ ms|    [^ ].* FAILED: .*)$")


def main(out: Path) -> int:
    ok = True
    print("\n======== gpu-check summary ========")
    device = out / "device.txt"
    print(device.read_text().strip() if device.exists() else "device: unknown")
    tests = out / "tests.xml"
    if tests.exists():
        suite = ET.parse(tests).getroot()
        suite = suite if suite.tag == "testsuite" else suite[0]
        n, f, e, s = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
        took = float(suite.get("time", 0))
        print(f"gpu tests: {n - f - e - s} passed, {f + e} failed, {s} skipped ({took:.0f} s)")
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                print(f"  FAILED {case.get('classname')}::{case.get('name')}")
        ok = ok and f + e == 0
    else:
        print("gpu tests: no result (timed out?)")
        ok = False
    report = out / "report.jsonl"
    for line in report.read_text().splitlines() if report.exists() else []:
        fig = json.loads(line)
        name = fig.pop("name")
        print(f"  {name}: " + ", ".join(f"{k}={v}" for k, v in fig.items()))
    for part in ("bench-2gb", "bench-10gb"):
        path = out / f"{part}.json"
        if not path.exists():
            log = out / f"{part}.log"
            lines = log.read_text().splitlines() if log.exists() else []
            seen = [x for x in lines if MEASURED.match(x)]
            print(f"{part}: cut off or failed; measured before that:" if seen else f"{part}: no result")
            print("\n".join(seen))
            ok = False
            continue
        for r in json.loads(path.read_text()):
            print(
                f"{r['optimizer']:6} {r['gb']:5.1f} GB  pinned D2H {r['pinned_ms']:.0f} ms, "
                f"step {r['step_ms']:.0f} ms"
            )
            for name, row in r["rows"].items():
                rate = f"  throughput {row['throughput']:.3f}" if "throughput" in row else ""
                print(f"    {name:15} stall {row['stall_ms']:8.0f} ms = {row['x_pinned']:6.2f}× pinned{rate}")
    print("gpu-check:", "all passed" if ok else "SOMETHING FAILED (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
