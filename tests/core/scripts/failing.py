"""A script that fails: the job must fail with its error, not be retried as a preemption."""

import sys

print("starting with", sys.argv[1:], flush=True)
raise ValueError(f"learning rate {sys.argv[1]} is not a number")
