"""Uses spotnb.ctx() and has no SIGTERM handler: it is not signalled on a notice (the default
action would kill it before it saves); ctx.should_save() says when, at its next step."""

import os
import sys

import spotnb

ctx = spotnb.ctx()
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for step in ctx.steps(10**6):
    ctx.log(loss=1.0 / (step + 1))
    if ctx.should_save():
        with open(os.path.join(out, "state.txt"), "w") as f:
            f.write(str(step))
        ctx.backup(out)  # after a notice: the emergency checkpoint, then spotnb ends the script
sys.exit("the loop ended without a notice")
