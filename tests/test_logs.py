"""A job's warnings reach the views of that job (issue 12: `logging`, and the widget shows
warnings in its feed)."""

from __future__ import annotations

import logging

from spotnb import logs
from spotnb.protocol import JobWarning


def test_only_the_jobs_own_warnings_reach_its_handler() -> None:
    seen: list[str] = []
    handler = logs.attach("job-a", lambda r: seen.append(r.getMessage()))
    try:
        log = logging.getLogger("spotnb.controller")
        log.warning("job %s: lease renewal failed", "job-a", extra={"job_id": "job-a"})
        log.warning("job %s: lease renewal failed", "job-b", extra={"job_id": "job-b"})
        log.info("job a is fine", extra={"job_id": "job-a"})
        logging.getLogger("spotnb.events").error("no id at all")
        logging.LoggerAdapter(logging.getLogger("spotnb.x"), {"job_id": "job-a"}).error("via adapter")
    finally:
        logs.detach(handler)
    logging.getLogger("spotnb.controller").warning("after", extra={"job_id": "job-a"})
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
    from spotnb.job import Job
    from spotnb.store import Store
    from spotnb.widget.view import JobView, render_info_html

    view = JobView(Job("job-w", Store((tmp_path / "store").as_uri())), autostart=False)
    try:
        logging.getLogger("spotnb.controller").warning(
            "job %s: cannot write events (disk full); 3 kept", "job-w", extra={"job_id": "job-w"}
        )
        logging.getLogger("spotnb.controller").warning("other", extra={"job_id": "job-x"})
        feed = view.state.feed
        assert len(feed) == 1 and isinstance(feed[0], JobWarning)
        assert "disk full" in render_info_html(view.state, "job-w")
    finally:
        view.detach()
    logging.getLogger("spotnb.controller").warning("late", extra={"job_id": "job-w"})
    assert len(view.state.feed) == 1
