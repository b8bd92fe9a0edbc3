"""A dry run's plan, readable: `spot.train(fn, config, dry_run=True)` returns a `DryRun`.

It is the provider's plan (a dict: the exact requests, the boot script, ...) with two faces: in
a notebook an HTML summary (where, what type, what it costs and how old that price is, the
calls in order, what the boot script does) with the raw requests and the script behind
disclosures; in a terminal the same summary as text. The raw JSON is never printed twice.
"""

from __future__ import annotations

import html
import json
from typing import Any

from spotnb.prices import lookup_price

__all__ = ["DryRun"]

_WHERE = ("provider", "region", "zone", "zones", "zone_order", "project", "resource_group", "location")


class DryRun(dict[str, Any]):
    """The plan of a dry run (a dict, as before), displayed readably. Nothing was launched."""

    def __init__(self, plan: dict[str, Any], instance_type: str) -> None:
        super().__init__(plan)
        self.instance_type = instance_type

    # -- the parts of the summary ----------------------------------------------------------
    def _where(self) -> list[tuple[str, str]]:
        rows = [(k.replace("_", " "), _short(self[k])) for k in _WHERE if self.get(k) not in (None, "", [])]
        rows.append(("instance type", self.instance_type))
        price = lookup_price(self.instance_type, str(self.get("provider") or "") or None)
        if price is not None:
            rows.append(
                (
                    "price",
                    f"${price.spot:.3f}/h spot vs ${price.on_demand:.3f}/h on demand — approximate: "
                    f"{price.source}; the live spot price is read at launch",
                )
            )
        return rows

    def _calls(self) -> list[tuple[str, str]]:
        out = []
        for r in self.get("requests") or []:
            out.append((str(r.get("api", "?")), str(r.get("when", ""))))
        term = self.get("terminate")
        if isinstance(term, dict) and term.get("api"):
            out.append((str(term["api"]), "when the job ends"))
        return out

    def _boot(self) -> list[str]:
        """What the boot script does: its comment lines, which say it step by step."""
        script = str(self.get("bootstrap") or "")
        said = [ln.strip().lstrip("#").strip() for ln in script.splitlines() if ln.strip().startswith("# ")]
        said = [s for s in said if not s.startswith("shellcheck")][:12]
        runs = next((ln.strip() for ln in script.splitlines() if "spotnb.runtime.agent" in ln), None)
        return said + ([f"runs: {runs}"] if runs else [])

    # -- the two faces ----------------------------------------------------------------------
    def text(self) -> str:
        lines = ["dry run: nothing was launched"]
        lines += [f"  {k:<14} {v}" for k, v in self._where()]
        lines.append("  calls, in order:")
        lines += [f"    {api}" + (f"  ({when})" if when else "") for api, when in self._calls()]
        boot = self._boot()
        if boot:
            lines.append(f"  boot script ({len(str(self['bootstrap']).splitlines())} lines):")
            lines += [f"    - {b}" for b in boot]
        for what, why in (self.get("unsupported") or {}).items():
            lines.append(f"  not here: {what}: {why}")
        lines.append("  (plan['requests'] has the exact request bodies, plan['bootstrap'] the script)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        esc = html.escape
        where = "".join(
            f"<tr><th style='text-align:left'>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in self._where()
        )
        calls = "".join(
            f"<li><code>{esc(api)}</code>" + (f" <span style=color:#666>({esc(when)})</span>" if when else "")
            for api, when in self._calls()
        )
        boot = "".join(f"<li>{esc(b)}</li>" for b in self._boot())
        raw = json.dumps({k: v for k, v in self.items() if k != "bootstrap"}, indent=2, default=str)
        script = str(self.get("bootstrap") or "")
        return (
            "<div class='spotnb-dry-run'><b>Dry run: nothing was launched</b>"
            f"<table>{where}</table><div>Calls, in order:<ol>{calls}</ol></div>"
            + (f"<div>The boot script:<ul>{boot}</ul></div>" if boot else "")
            + f"<details><summary>raw requests (JSON)</summary><pre>{esc(raw)}</pre></details>"
            f"<details><summary>boot script</summary><pre>{esc(script)}</pre></details>"
            "</div>"
        )


def _short(v: Any) -> str:
    return ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
