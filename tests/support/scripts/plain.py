"""A script that knows nothing of spotnb: says it started, then waits; the notice's SIGTERM
kills it (no handler), as SLURM's would."""

import sys
import time

print("started", flush=True)
sys.stderr.write("waiting\n")
sys.stderr.flush()
time.sleep(600)
