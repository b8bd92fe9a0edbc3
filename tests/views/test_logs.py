"""A job's warnings reach the views of that job (issue 12: `logging`, and the widget shows
warnings in its feed)."""

from __future__ import annotations

import logging

from spotnb.core.protocol import JobWarning
from spotnb.views import logs
from tests.support.paths import REPO


def test_only_the_jobs_own_warnings_reach_its_handler() -> None:
    seen: list[str] = []
    handler = logs.attach("job-a", lambda r: seen.append(r.getMessage()))
    try:
        log = logging.getLogger("spotnb.control.controller")
        log.warning("job %s: lease renewal failed", "job-a", extra={"job_id": "job-a"})
        log.warning("job %s: lease renewal failed", "job-b", extra={"job_id": "job-b"})
        log.info("job a is fine", extra={"job_id": "job-a"})
        logging.getLogger("spotnb.core.events").error("no id at all")
        logging.LoggerAdapter(logging.getLogger("spotnb.x"), {"job_id": "job-a"}).error("via adapter")
    finally:
        logs.detach(handler)
    logging.getLogger("spotnb.control.controller").warning("after", extra={"job_id": "job-a"})
    assert seen == ["job job-a: lease renewal failed", "via adapter"]


def test_views_do_not_leak_handlers_and_a_bad_callback_does_not_raise() -> None:
    root = logging.getLogger(logs.ROOT)
    before = list(root.handlers)
    handlers = [logs.attach(f"job-{i}", lambda r: None) for i in range(200)]
    for h in handlers:
        logs.detach(h)
    assert root.handlers == before

    def broken(record: logging.LogRecord) -> None:
        raise RuntimeError("a view bug")

    handler = logs.attach("job-c", broken)
    raise_exceptions, logging.raiseExceptions = logging.raiseExceptions, False
    try:
        logging.getLogger("spotnb.job").warning("still fine", extra={"job_id": "job-c"})
    finally:
        logging.raiseExceptions = raise_exceptions
        logs.detach(handler)


def test_the_widget_shows_its_jobs_warnings_in_the_feed(tmp_path) -> None:
    from spotnb.core.store import Store
    from spotnb.job import Job
    from spotnb.views.widget.view import JobView, render_info_html

    view = JobView(Job("job-w", Store((tmp_path / "store").as_uri())), autostart=False)
    try:
        logging.getLogger("spotnb.control.controller").warning(
            "job %s: cannot write events (disk full); 3 kept", "job-w", extra={"job_id": "job-w"}
        )
        logging.getLogger("spotnb.control.controller").warning("other", extra={"job_id": "job-x"})
        feed = view.state.feed
        assert len(feed) == 1 and isinstance(feed[0], JobWarning)
        assert "disk full" in render_info_html(view.state, "job-w")
    finally:
        view.detach()
    logging.getLogger("spotnb.control.controller").warning("late", extra={"job_id": "job-w"})
    assert len(view.state.feed) == 1


# -- the instance log is capped (issue #29 item 9: 300 MB of a script's stdout made a 310 MB log)
_CAPPED = r"""
import os, subprocess, sys
log = sys.argv[1]
fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
os.dup2(fd, 1); os.dup2(fd, 2); os.close(fd)
from spotnb.runtime import logcap
cap = logcap.install()
code = "import sys\nfor i in range(40000): sys.stdout.write('line %06d\\n' % i)\n"
code += "sys.stderr.write('child stderr end\\n')"
child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
threads = [logcap.forward(child.stdout, "stdout"), logcap.forward(child.stderr, "stderr")]
child.wait()
for t in threads:
    t.join()
for i in range(40000, 60000):  # the agent's own output (the function's prints): the watcher's
    print("line %06d" % i)
sys.stdout.flush()
cap.check()
print("rotations", cap.rotations, file=sys.stderr)
"""


def test_the_instance_log_rotates_past_its_cap_keeping_the_newest_output_and_losing_nothing_between(
    tmp_path, monkeypatch
) -> None:
    """A child's output forwarded by the agent and the agent's own: past half the cap the log
    becomes `<log>.1` and a fresh file takes its place on descriptors 1 and 2; the log always
    holds the newest output, `.1` the output just before it, byte for byte."""
    import os
    import subprocess
    import sys

    log = tmp_path / "0001-local-x.log"
    env = {**os.environ, "SPOTNB_INSTANCE_LOG": str(log), "SPOTNB_LOG_MAX": "200000"}
    env["PYTHONPATH"] = str(REPO)
    subprocess.run([sys.executable, "-c", _CAPPED, str(log)], env=env, check=True, timeout=60)
    older, newest = (log.with_name(log.name + ".1")).read_bytes(), log.read_bytes()
    assert len(older) + len(newest) < 200_000 + 3 * 65536, (len(older), len(newest))  # 660 KB written
    assert newest.startswith(b"[spotnb ") and b"what came before is in 0001-local-x.log.1" in newest
    assert b"older output was dropped" in newest and b"rotations " in newest
    assert b"line 059999\n" in newest  # the newest output is at the log's path, even right after a rotation
    # nothing lost at the seam: what .1 and the log hold is one stretch of the output, to its end
    seen = sorted(
        {
            int(x.split()[1])
            for x in (older + newest).decode().splitlines()
            if x.startswith("line ") and len(x) == 11
        }
    )
    assert seen == list(range(seen[0], 60000)) and len(seen) > 10_000


def test_without_a_market_log_nothing_is_capped(monkeypatch) -> None:
    from spotnb.runtime import logcap

    monkeypatch.delenv("SPOTNB_INSTANCE_LOG", raising=False)
    monkeypatch.setattr(logcap, "_current", None)
    assert logcap.install() is None
    logcap.wrote(10**9)  # no cap: nothing happens


_FULL_DISK = r"""
import os, sys
log = sys.argv[1]
fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
os.dup2(fd, 1); os.dup2(fd, 2); os.close(fd)
from spotnb.runtime import logcap
cap = logcap.LogCap(log, 100_000)
real = os.replace
def full(a, b):
    raise OSError(28, "No space left on device")
os.replace = full
sys.stdout.write("a" * 80_000 + "\n"); sys.stdout.flush()
assert not cap.check() and not os.path.exists(log + ".new") and not os.path.exists(log + ".1")
print("still writing")
os.replace = real
assert cap.check() and cap.rotations == 1
print("after the rotation")
"""


def test_a_rotation_that_fails_changes_nothing_and_a_bad_cap_is_the_default(tmp_path) -> None:
    import os
    import subprocess
    import sys

    from spotnb.runtime import logcap

    log = tmp_path / "i.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", _FULL_DISK, str(log)], env=env, check=True, timeout=60)
    assert b"still writing" in (tmp_path / "i.log.1").read_bytes()
    assert log.read_bytes().endswith(b"after the rotation\n")
    for bad in ("abc", "nan", "inf", "1e400", ""):
        assert logcap.cap_bytes({"SPOTNB_LOG_MAX": bad}) == logcap.LOG_MAX, bad
    assert logcap.cap_bytes({"SPOTNB_LOG_MAX": "2e6"}) == 2_000_000
    assert logcap.LogCap("x", 0).max_bytes == logcap.LOG_MIN  # a cap of 0 still keeps some output
