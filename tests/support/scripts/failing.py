"""A script that fails: the job must fail with its error (not be relaunched as a preemption)."""

import sys

print("starting", flush=True)
raise ValueError(f"bad arguments {sys.argv[1:]!r}")
