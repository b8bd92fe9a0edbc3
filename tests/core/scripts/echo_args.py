"""Exits 0 only when it received exactly the arguments the CLI test passes."""

import sys

expected = ["--lr", "0.1", "two words", "--"]
if sys.argv[1:] != expected:
    sys.exit(f"argv {sys.argv[1:]!r} != {expected!r}")
print("arguments as given", flush=True)
