"""A plotly `FigureWidget` whose front end is ready at once, fills its output and follows it
when it is resized.

Why, ready at once: since plotly 6 the FigureWidget is an anywidget whose front-end module is
plotly's widget bundle (plotly.js, ~5 MB of JavaScript). anywidget gives a model 2 s (0.11) to
load its module; past that, the front-end model drops every message the kernel sends it, for
good, while its view still renders. A busy machine takes longer than 2 s to compile 5 MB, and
the live widget then showed an empty figure for a job that had logged every metric (the
quickstart's browser test saw it: status succeeded, no loss curve). So the figure's module
(`_esm`) is a small loader that is ready at once: it keeps the kernel's plot messages that arrive
while plotly's bundle (the `_spotnb_plotly` trait) loads, then hands them, in order, to
plotly's own model code, and draws once plotly is there. The bundle is evaluated once per page,
however many figures it shows.

Why, fills its output: plotly's `render` draws the plot at once, before JupyterLab has
attached the element to the page. Plotly then finds no width to fill and draws its 700 px
default, and nothing redraws it later (the old Lumino resize messages no longer reach it;
plotly/plotly.py#5208). An experienced user expects a live chart to be as wide as the cell.
The loader's `render` puts a `ResizeObserver` on the plot element that asks plotly to fit the
container whenever the element's width changes, including the first time it gets one, through
plotly's own responsive handler (`config.responsive`), so nothing of plotly's internals is
called.

When a plotly release changes the bundle's export line, the stock module is used unchanged
(loaded within anywidget's timeout or not, 700 px wide) and a debug line says so.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import pathlib
import re
from typing import Any

import plotly.basewidget
import plotly.graph_objects as go
import traitlets
from plotly.serializers import custom_serializers

__all__ = ["ResponsiveFigureWidget", "wrap_render"]

log = logging.getLogger("spotnb.views.widget")

# the bundle's last line exports the model, the view and the anywidget factory
_EXPORT = re.compile(
    r"export\{(?P<model>[\w$]+) as FigureModel,(?P<view>[\w$]+) as FigureView,"
    r"(?P<factory>[\w$]+) as default\};?"
)

#: the figure's front-end module (`_esm`): small, so anywidget's model is ready at once
_LOADER = """
// spotnb's live figure: plotly's widget module, loaded after the model is ready
// (spotnb/views/widget/responsive.py says why)
const MESSAGES = ["_py2js_addTraces", "_py2js_deleteTraces", "_py2js_moveTraces",
  "_py2js_restyle", "_py2js_relayout", "_py2js_update", "_py2js_animate",
  "_py2js_removeLayoutProps", "_py2js_removeTraceProps"];
// plotly's module, by the kernel's id of its source: evaluated once per page
const modules = (globalThis.__spotnbPlotlyModules ??= new Map());
let figureModel, figureView; // plotly's named exports, bound once its module is loaded
export { figureModel as FigureModel, figureView as FigureView };

function plotly(model) {
  const id = model.get("_spotnb_plotly_id");
  let loading = modules.get(id);
  if (!loading) {
    const source = new Blob([model.get("_spotnb_plotly")], { type: "text/javascript" });
    const url = URL.createObjectURL(source);
    loading = import(url).finally(() => URL.revokeObjectURL(url));
    modules.set(id, loading);
  }
  return loading;
}

// plotly's Python side marks "not this trace" in a batched update as "_undefined_"; its
// ipywidgets serializers turned that into undefined, but anywidget applies none, and plotly's
// model then wrote the string into the figure's data: a trace updated beside others lost the
// properties they changed (the breakdown's allocation bar its row, then its bar)
const UNDEFINED = "_undefined_";
function revive(value) {
  if (value === UNDEFINED) return undefined;
  if (Array.isArray(value)) return value.map(revive);
  if (value && typeof value === "object" && Object.getPrototypeOf(value) === Object.prototype) {
    const out = {};
    for (const [k, v] of Object.entries(value)) out[k] = revive(v);
    return out;
  }
  return value;
}
function reviving(model) {
  const get = (key) => {
    const value = model.get(key);
    return MESSAGES.includes(key) ? revive(value) : value;
  };
  return new Proxy(model, {
    get(target, prop) {
      if (prop === "get") return get;
      const value = Reflect.get(target, prop, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

export default () => {
  let loaded = null;
  return {
    initialize(ctx) {
      const model = ctx.model;
      ctx = { ...ctx, model: reviving(model) };
      // a plot message is a value set then reset to null by the kernel: keep the values that
      // come before plotly's model code listens
      const early = [];
      const keep = MESSAGES.map((key) => {
        const listener = () => {
          const value = model.get(key);
          if (value !== null && value !== undefined) early.push([key, value]);
        };
        model.on(`change:${key}`, listener);
        return [key, listener];
      });
      loaded = plotly(model).then(async (mod) => {
        figureModel = mod.FigureModel;
        figureView = mod.FigureView;
        const base = typeof mod.default === "function" ? mod.default() : mod.default;
        await base.initialize(ctx);
        for (const [key, listener] of keep) model.off(`change:${key}`, listener);
        // the same messages again, in order, now to plotly's model (it updates the figure
        // a view draws from)
        for (const [key, value] of early) {
          model.set(key, value);
          model.set(key, null);
        }
        return base;
      });
      loaded.catch((error) => console.error("spotnb: plotly's widget module failed", error));
    },
    async render(ctx) {
      const base = await loaded;
      ctx = { ...ctx, model: reviving(ctx.model) };
      const el = ctx.el;
      const cleanup = await base.render(ctx);
      let width = 0, frame = 0;
      // plotly draws at once, maybe before the element is on the page (then 700 px wide):
      // refit whenever the element's width changes, the first time it has one included
      const observer = new ResizeObserver((entries) => {
        const w = Math.round(entries[entries.length - 1].contentRect.width);
        if (!w || w === width) return;
        width = w;
        cancelAnimationFrame(frame);
        frame = requestAnimationFrame(() => {
          // a relayout that sets the height (a new metric panel, a new lane) makes plotly.js
          // pin the width at its value then, and a plot whose width and height are both set
          // is never resized again: the width is the output's, never pinned
          if (el.layout) delete el.layout.width;
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
    """The figure's front-end module for plotly's widget module `source`: the loader (ready at
    once, refitting `render`), or `source` unchanged when its export line is not the one the
    loader was written against."""
    if not _EXPORT.search(source):
        log.debug("plotly's widget bundle has no recognised export line: figures keep 700 px")
        return source
    return _LOADER


@functools.cache
def _plotly_esm() -> str:
    esm = plotly.basewidget.BaseFigureWidget._esm  # anywidget holds the file's contents
    return esm.read_text() if isinstance(esm, pathlib.Path) else str(esm)


#: the figure's module, and plotly's for the loader to import ("" when the stock module is used)
_MODULE = wrap_render(_plotly_esm())
_BUNDLE = _plotly_esm() if _MODULE is _LOADER else ""


class ResponsiveFigureWidget(go.FigureWidget):
    """A `go.FigureWidget` ready as soon as its front end is, as wide as its output, redrawn
    when the output's width changes."""

    _esm = _MODULE
    #: plotly's widget module, which the `_esm` loader imports, and the id a page caches it by
    _spotnb_plotly = traitlets.Unicode(_BUNDLE).tag(sync=True)
    _spotnb_plotly_id = traitlets.Unicode(
        hashlib.sha1(_BUNDLE.encode(), usedforsecurity=False).hexdigest()
    ).tag(sync=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # plotly's responsive handler is what the loader's `render` calls
        config: dict[str, Any] = dict(self._config)  # type: ignore[has-type]
        self._config = {**config, "responsive": True}

    def get_state(self, key: Any = None) -> dict[str, Any]:
        """The state a front end gets, with the figure as it is now. plotly sets
        `_widget_data` and `_widget_layout` once, when the figure is made, and sends every later
        change as a message: a front end that asks for the whole state (the page reloaded, the
        notebook opened in a second tab) drew the figure as it began, without a metric."""
        state: dict[str, Any] = super().get_state(key)
        to_json = custom_serializers["to_json"]
        if "_widget_data" in state and hasattr(self, "_data"):
            state["_widget_data"] = to_json(list(self._data), self)  # new containers: a snapshot
        if "_widget_layout" in state and hasattr(self, "_layout_obj"):
            state["_widget_layout"] = to_json(dict(self._layout_obj._props), self)
        return state
