"""A script that misbehaves in the way argv[1] says, for tests/runtime/script/test_script_misbehaving.py."""

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import spotnb

how = sys.argv[1]
if how == "ignore":  # ignores the notice's SIGTERM and trains on
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("started", flush=True)
    while True:
        time.sleep(0.01)
elif how == "stop":  # stops itself (SIGSTOP): a hung script no signal but SIGKILL ends
    print("started", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
elif how == "orphan":  # leaves a process of its own behind and exits 0
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(sys.argv[2], "w") as f:
        f.write(str(child.pid))
elif how == "environ":  # what of the agent's secrets it can see
    seen = {"env": "SPOTNB_JOB_KEY" in os.environ}
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as f:
            seen["parent"] = b"SPOTNB_JOB_KEY" in f.read()
    except OSError as exc:
        seen["parent"] = f"unreadable: {exc}"
    spotnb.ctx().set_result(seen)
elif how == "garbage":  # sends the agent what no ScriptContext would, then uses ctx normally
    ctx = spotnb.ctx()
    errors = {}
    raw = socket.socket(socket.AF_UNIX)
    raw.connect(os.environ["SPOTNB_CTX_SOCKET"])
    for line in [
        b"not json\n",
        b"[1, 2]\n",
        b'{"op": "call", "name": "log", "kwargs": [1]}\n',
        b"\xff\xfe\n",
    ]:
        raw.sendall(line)
        errors[line.decode("latin-1").strip()] = json.loads(raw.makefile("rb").readline())
    for name, call in {
        "nan": lambda: ctx.log(loss=math.nan),
        "object": lambda: ctx.log(loss=object()),
        "huge": lambda: ctx.log(loss="x" * 10_000_000),
        "huge_name": lambda: ctx.log(**{"y" * 100_000: 1.0}),
    }.items():
        try:
            call()
            errors[name] = None
        except Exception as exc:  # noqa: BLE001
            errors[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
    for i in range(2000):
        ctx.log(flood=float(i))

    def from_thread():
        ctx.log(thread=1.0)

    t = threading.Thread(target=from_thread)
    t.start()
    t.join()
    pid = os.fork()
    if pid == 0:
        try:
            ctx.log(forked=1.0)
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    errors["fork_exit"] = status
    ctx.set_result(errors)
elif how == "flood":  # writes far more than a pipe holds to stdout and stderr
    block = "e" * 65536 + "\n"
    for _ in range(300):
        sys.stderr.write(block)
        sys.stdout.write(block)
    sys.stderr.write("the end\n")
    sys.exit(2)
