"""The notebook view of a job: a live widget inside a kernel, text lines elsewhere.

`Job._ipython_display_`, `job.show()` and `job.plot()` import this lazily, so `import spotnb`
never pulls in ipywidgets or plotly. Modules:

- `state`: folds events into downsampled series and timelines (no plotting library);
- `figures`: plotly traces and static figures from that state;
- `view`: the ipywidgets composite and its throttled, rate-limited flusher;
- `text`: the terminal / CI fallback (tqdm autonotebook style).
"""

from __future__ import annotations

import os
from typing import Any, Literal

__all__ = ["job_widget", "static_figures", "in_kernel", "TextView"]

from spotnb.views.widget.text import TextView


def in_kernel() -> bool:
    """True inside a Jupyter kernel whose front end can render widgets (comms available):
    JupyterLab, Notebook 7, VS Code, nbclient. False in scripts, plain IPython and CI logs."""
    if os.environ.get("SPOTNB_WIDGETS", "").lower() in ("0", "false", "text"):
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def job_widget(job: Any, mode: Literal["auto", "widget", "text"] = "auto", **kwargs: Any) -> Any:
    """The live view of `job`: an ipywidgets box in a kernel, else a `TextView` that prints
    progress lines (its repr is the job's one-line summary)."""
    if mode == "text" or (mode == "auto" and not in_kernel()):
        return TextView(job)
    from spotnb.views.widget.view import JobView

    return JobView(job, **kwargs).box


def static_figures(job: Any) -> dict[str, Any]:
    """{"metrics", "timeline", "breakdown"} → `plotly.graph_objects.Figure`, from the job's
    events so far (for `fig.write_html`, `write_image`, reports)."""
    from spotnb.core.state import JobState
    from spotnb.views.widget.figures import static_figures_from_state

    state = JobState()
    state.feed_events(job.events)
    return static_figures_from_state(state)
