"""The Jupyter server extension behind the JupyterLab "Spot jobs" panel.

Routes (all under the server's base URL, all behind Jupyter's own authentication):

    GET  /spotnb/api/jobs              every job in the job DB, running first, plus totals
    GET  /spotnb/api/jobs/<id>         one job: summary, downsampled metrics, timeline,
                                       breakdown, cost, recent events (and plotly figures)
    POST /spotnb/api/jobs/<id>/stop    ask the job's controller to stop it (STOP marker)

Enabled by `jupyter-config/jupyter_server_config.d/spotnb.json`
(`{"ServerApp": {"jpserver_extensions": {"spotnb.views.server": true}}}`). Importing this module
imports neither tornado handlers nor the job DB until the server loads it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["_jupyter_server_extension_points", "_load_jupyter_server_extension"]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "spotnb.views.server"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from spotnb.views.server.handlers import setup_handlers

    setup_handlers(serverapp.web_app)
    serverapp.log.info("spotnb: server extension loaded (/spotnb/api/jobs)")


# the pre-2.0 name, still looked up by some launchers
load_jupyter_server_extension = _load_jupyter_server_extension
