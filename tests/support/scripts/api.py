"""What a script's ctx does with bad calls, and how its ending is read (argv[1] says how)."""

import os
import signal
import sys

import spotnb

ctx = spotnb.ctx()
assert ctx is spotnb.ctx()
errors = {}
for name, call in {
    "backup": lambda: ctx.backup("no/such/folder"),
    "log": lambda: ctx.log(step=3),
    "track": lambda: ctx.track(model=object()),
    "missing": lambda: ctx.no_such_method(),
}.items():
    try:
        call()
    except Exception as exc:  # noqa: BLE001
        errors[name] = f"{type(exc).__name__}: {exc}"
ctx.log(loss=0.5, ready=1)
how = sys.argv[1]
if how == "result":
    ctx.set_result({"errors": errors, "step": ctx.step_index, "argv": sys.argv[1:]})
elif how == "exit0":
    os._exit(0)
elif how == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
