"""A script whose start-up (imports, building the model, loading its own checkpoint) takes a
while before its first step (argv[1] seconds), then trains three steps."""

import sys
import time

import spotnb

ctx = spotnb.ctx()
time.sleep(float(sys.argv[1]))  # the start-up
first = time.time()
for _ in range(3):
    with ctx.step():
        time.sleep(0.01)
ctx.set_result({"first_step": first})
