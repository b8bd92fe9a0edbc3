"""A script that prints N MB to stdout (numbered lines) and a little to stderr, then ends:
the instance log must stay capped and end with its last line."""

import sys

mb = float(sys.argv[1])
line = 0
written = 0
while written < mb * 1_000_000:
    text = f"line {line:09d} " + "x" * 100 + "\n"
    sys.stdout.write(text)
    written += len(text)
    line += 1
    if line % 5000 == 0:
        sys.stderr.write(f"progress {line}\n")
sys.stdout.write(f"the last line: {line}\n")
sys.stdout.flush()
sys.stderr.write("stderr's last line\n")
