"""Tornado handlers for /spotnb/api/...: every method is behind Jupyter's authentication
(`tornado.web.authenticated`) and authorization (`jupyter_server.auth.authorized`, resource
"spotnb"); there is no unauthenticated route. The work (SQLite, store reads) runs in a thread
so a slow store never blocks the server's event loop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from spotnb.control.jobdb import AmbiguousJobId
from spotnb.views.server.data import JobViews

__all__ = ["setup_handlers", "JobsHandler", "JobHandler", "StopHandler"]

_ID = r"(?P<job_id>[A-Za-z0-9][A-Za-z0-9_.\-]*)"


class _Base(APIHandler):
    auth_resource = "spotnb"

    def initialize(self, views: JobViews) -> None:
        self.views = views

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
        except AmbiguousJobId as exc:  # a guess could stop the wrong job: name the candidates
            self.set_status(400)
            self.finish(json.dumps({"message": str(exc), "matches": exc.matches}))
            raise tornado.web.Finish() from None

    def _reply(self, payload: Any) -> None:
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(payload, default=str))


class JobsHandler(_Base):
    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        self._reply(await self._run(self.views.jobs))


class JobHandler(_Base):
    @tornado.web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        figures = self.get_argument("figures", "1") not in ("0", "false", "no")
        payload = await self._run(self.views.detail, job_id, figures)
        if payload is None:
            raise tornado.web.HTTPError(404, f"no job {job_id!r} in the job DB")
        self._reply(payload)


class StopHandler(_Base):
    @tornado.web.authenticated
    @authorized
    async def post(self, job_id: str) -> None:
        payload = await self._run(self.views.stop, job_id)
        if payload is None:
            raise tornado.web.HTTPError(404, f"no job {job_id!r} in the job DB")
        self._reply(payload)


def setup_handlers(web_app: Any, views: JobViews | None = None) -> JobViews:
    views = views or JobViews()
    base = url_path_join(web_app.settings["base_url"], "spotnb", "api")
    kw = {"views": views}
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "jobs") + "/?", JobsHandler, kw),
            (url_path_join(base, "jobs", _ID) + "/?", JobHandler, kw),
            (url_path_join(base, "jobs", _ID, "stop") + "/?", StopHandler, kw),
        ],
    )
    return views
