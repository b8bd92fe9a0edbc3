"""A training script that keeps its own checkpoint folder, the way scripts written for SLURM do:
it saves `ckpt/state.json` every 10 steps and when SIGTERM comes (reading the deadline from the
notice file), and resumes from that file. Under spotnb it also hands the folder to
`ctx.backup`; run plainly (`python resumable.py 60 ckpt`) it is a calm run printing its result."""

import contextlib
import json
import os
import signal
import sys
import time

import spotnb

steps, out = int(sys.argv[1]), sys.argv[2]
try:
    ctx = spotnb.ctx()
except spotnb.SpotnbError:
    ctx = None  # outside spotnb: the calm reference run

path = os.path.join(out, "state.json")
state = {"step": 0, "total": 0, "notices": []}
if os.path.exists(path):
    with open(path) as f:
        state = json.load(f)
resumed_from = state["step"]


def save() -> None:
    os.makedirs(out, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(state, f)
    os.replace(path + ".tmp", path)


def on_sigterm(signum, frame) -> None:
    global state
    with open(os.environ["SPOTNB_NOTICE_FILE"]) as f:
        notice = json.load(f)
    left = notice["deadline"] - time.time()
    state = {**state, "notices": [*state["notices"], {"step": state["step"], "time_left": left}]}
    save()
    ctx.backup(out)  # the emergency checkpoint: once it is committed, spotnb ends the script


signal.signal(signal.SIGTERM, on_sigterm)
while state["step"] < steps:
    with ctx.step() if ctx else contextlib.nullcontext():
        i = state["step"]
        time.sleep(0.02)
        # one assignment: a SIGTERM handler sees the state before or after a step, never half
        state = {**state, "step": i + 1, "total": state["total"] + i * i}
        if ctx:
            ctx.log(loss=1.0 / (i + 1))
    if state["step"] % 10 == 0:
        save()
        if ctx:
            ctx.backup(out)
result = {"total": state["total"], "steps": state["step"]}
if ctx:
    ctx.set_result({**result, "resumed_from": resumed_from, "notices": state["notices"]})
else:
    print(json.dumps(result))
