"""A plotly `FigureWidget` that fills its output and follows it when it is resized.

Why: since plotly 6 the FigureWidget is an anywidget whose `render` draws the plot at once,
before JupyterLab has attached the element to the page. Plotly then finds no width to fill and
draws its 700 px default, and nothing redraws it later (the old Lumino resize messages no
longer reach it; plotly/plotly.py#5208). An experienced user expects a live chart to be as
wide as the cell, like every other output.

How: the widget's front-end module is plotly's own, with its `render` wrapped so a
`ResizeObserver` on the plot element asks plotly to fit the container whenever the element's
width changes, including the first time it gets one. The resize goes through plotly's own
responsive handler (`config.responsive`), so nothing of plotly's internals is called. When a
plotly release changes the bundle's export line, the stock module is used unchanged (the
figure is then 700 px wide, as before) and a debug line says so.
"""

from __future__ import annotations

import functools
import logging
import pathlib
import re
from typing import Any

import plotly.basewidget
import plotly.graph_objects as go

__all__ = ["ResponsiveFigureWidget", "wrap_render"]

log = logging.getLogger("spotnb.widget")

# the bundle's last line exports the model, the view and the anywidget factory
_EXPORT = re.compile(
    r"export\{(?P<model>[\w$]+) as FigureModel,(?P<view>[\w$]+) as FigureView,"
    r"(?P<factory>[\w$]+) as default\};?"
)

_WRAPPER = """
const __spotnbPlotly = %(factory)s;
export { %(model)s as FigureModel, %(view)s as FigureView };
export default () => {
  const base = __spotnbPlotly();
  return {
    initialize(ctx) { return base.initialize(ctx); },
    render(ctx) {
      const el = ctx.el;
      const cleanup = base.render(ctx);
      let width = 0, frame = 0;
      // plotly draws at once, maybe before the element is on the page (then 700 px wide):
      // refit whenever the element's width changes, the first time it has one included
      const observer = new ResizeObserver((entries) => {
        const w = Math.round(entries[entries.length - 1].contentRect.width);
        if (!w || w === width) return;
        width = w;
        cancelAnimationFrame(frame);
        frame = requestAnimationFrame(() => {
          if (el._responsiveChartHandler) el._responsiveChartHandler();
        });
      });
      observer.observe(el);
      return () => {
        observer.disconnect();
        cancelAnimationFrame(frame);
        if (typeof cleanup === "function") cleanup();
      };
    },
  };
};
"""


def wrap_render(source: str) -> str:
    """plotly's widget module `source` with the refitting `render`; unchanged when its export
    line is not the one this was written against."""
    matches = list(_EXPORT.finditer(source))
    if not matches:
        log.debug("plotly's widget bundle has no recognised export line: figures keep 700 px")
        return source
    last = matches[-1]
    return source[: last.start()] + _WRAPPER % last.groupdict() + source[last.end() :]


@functools.cache
def _plotly_esm() -> str:
    esm = plotly.basewidget.BaseFigureWidget._esm  # anywidget holds the file's contents
    return esm.read_text() if isinstance(esm, pathlib.Path) else str(esm)


class ResponsiveFigureWidget(go.FigureWidget):
    """A `go.FigureWidget` as wide as its output, redrawn when the output's width changes."""

    _esm = wrap_render(_plotly_esm())

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # plotly's responsive handler is what the wrapped `render` calls
        config: dict[str, Any] = dict(self._config)  # type: ignore[has-type]
        self._config = {**config, "responsive": True}
