"""A dry run's plan, readable once.

`spot.train(..., dry_run=True)` used to print the whole request as ~180 lines of JSON (the boot
script escaped into one string) and the notebook then printed the script again. A `Plan` is
still the same dict (code that reads `plan["requests"]` keeps working), but it shows itself as a
short summary: what would be launched, where, at what price (with the price's source and age,
since the built-in table is approximate), the disk, what the boot script does, and which API
calls would be made. The raw request sits behind a `<details>` disclosure in HTML and is one
`json.dumps(plan)` away in a terminal.
"""

from __future__ import annotations

import datetime
import html
import json
from typing import Any

from spotnb.market.prices import lookup_price, table_date
from spotnb.views.html_safe import NO_MATH

__all__ = ["Plan", "summary_rows"]

#: What every boot script does, in order (spotnb.providers.bootstrap); said in words so the
#: user does not have to read bash to know what runs on the VM.
_BOOT_STEPS = (
    "finds a Python on the image",
    'installs spotnb (see "spotnb code") and the job\'s requirements',
    "reports a `bootstrap` event to the store",
    "runs the spotnb agent, which trains and checkpoints",
    "powers off when the agent exits (the instance terminates itself)",
)


def _find(obj: Any, keys: tuple[str, ...]) -> Any:
    """The first value under any of `keys`, anywhere in a nested request body: the clouds
    name the same thing differently (VolumeSize, diskSizeGb, disk_size_gb)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in keys and not isinstance(v, (dict, list)):
                return v
        for v in obj.values():
            found = _find(v, keys)
            if found is not None:
                return found
    elif isinstance(obj, list):
        for v in obj:
            found = _find(v, keys)
            if found is not None:
                return found
    return None


def _age(day: str) -> str:
    """How old the price table is, in days: a stale table is the usual reason a figure is off."""
    try:
        days = (datetime.date.today() - datetime.date.fromisoformat(day)).days
    except ValueError:
        return f"dated {day}"
    return f"{days} day(s) old" if days > 0 else "dated today"


def summary_rows(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows shared by the HTML and the text form, so both say the same."""
    rows: list[tuple[str, str]] = [("provider", str(plan.get("provider", "?")))]
    names = ("InstanceType", "machineType", "vm_size")
    itype = plan.get("instance_type") or _find(plan.get("requests"), names)
    if itype:
        itype = str(itype).rsplit("/", 1)[-1]
        rows.append(("instance type", itype))
    where = " / ".join(str(plan[k]) for k in ("region", "zone") if plan.get(k))
    if where:
        rows.append(("region / zone", where))
    if plan.get("resource_group"):
        rows.append(("resource group", str(plan["resource_group"])))
    if itype:
        rows.extend(_price_rows(plan, itype))
    rows.extend(_fleet_rows(plan))
    across = plan.get("provider") == "any"  # zones of several clouds: the cloud column
    for i, zone in enumerate(plan.get("placement") or []):
        label = "zones by expected cost" if i == 0 else ""
        cloud = f"{zone.get('cloud') or '?':<6}" if across else ""
        rows.append((label, f"{i + 1}. {cloud}{zone.get('zone', '?')}: {zone.get('text', '')}"))
    for cloud, why in (plan.get("clouds_left_out") or {}).items():
        rows.append(("cloud left out", f"{cloud}: {why}"))
    if plan.get("migrate"):
        rows.append(("migrate", str(plan["migrate"])))
    if plan.get("controller"):
        rows.append(("controller", str(plan["controller"])))
    cap = _find(plan.get("requests"), ("MaxPrice", "maxPrice", "max_price"))
    if cap not in (None, "", -1, "-1"):
        rows.append(("max price", f"${float(cap):.3f}/h"))
    disk = _find(plan.get("requests"), ("VolumeSize", "diskSizeGb", "disk_size_gb", "disk_size_gi_b"))
    rows.append(("disk", f"{disk} GB" if disk is not None else "the image's default boot disk"))
    image = _image(plan.get("requests"))
    if image:
        rows.append(("image", image))
    if plan.get("bootstrap"):
        rows.append(("Python / torch", _python_row()))
    if plan.get("code"):
        rows.append(("spotnb code", str(plan["code"])))
    if plan.get("bootstrap"):
        rows.append(("boot script", "; ".join(_BOOT_STEPS)))
    calls = [
        str(r.get("api", "?")) + (f" ({r['when']})" if r.get("when") else "")
        for r in plan.get("requests", [])
    ]
    if calls:
        rows.append(("API calls", "; ".join(calls)))
    if plan.get("unsupported"):
        rows.append(("not on this cloud", "; ".join(plan["unsupported"])))
    return rows


def _image(requests: Any) -> str | None:
    """The VM image the requests launch (AMI / GCE image / Azure publisher:offer:sku:version)."""
    found = _find(requests, ("ImageId", "sourceImage", "source_image"))
    if found:
        return str(found)
    ref = _find_dict(requests, ("image_reference", "imageReference"))
    if ref:
        parts = [ref.get(k) for k in ("publisher", "offer", "sku", "version")]
        return ":".join(str(p) for p in parts if p) or None
    return None


def _find_dict(obj: Any, keys: tuple[str, ...]) -> dict[str, Any] | None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in keys and isinstance(v, dict):
                return v
            found = _find_dict(v, keys)
            if found:
                return found
    elif isinstance(obj, list):
        for v in obj:
            found = _find_dict(v, keys)
            if found:
                return found
    return None


def _python_row() -> str:
    """What the boot script runs the job with (spotnb.providers.bootstrap), in words."""
    from spotnb.providers.bootstrap import PYTHON_CANDIDATES, TORCH_SPEC

    return (
        f"the first of {', '.join(PYTHON_CANDIDATES)} that imports torch: the image's torch is "
        f"used when it is within {TORCH_SPEC}, else that is installed at each boot"
    )


def _price_rows(plan: dict[str, Any], itype: str) -> list[tuple[str, str]]:
    """The hourly prices: the Config's where it sets them (`price_fixed`: the market bills
    those), the table's otherwise, said approximate with the table's age."""
    table = lookup_price(itype, plan.get("provider"))
    given = plan.get("price_fixed")
    fixed: dict[str, Any] = given if isinstance(given, dict) else {}
    spot, od = _dollars(fixed.get("spot")), _dollars(fixed.get("on_demand"))
    if spot is not None and od is not None:  # one source for both
        both = f"${spot:.3f}/h spot, ${od:.3f}/h on demand"
        return [("price", f"{both} (Config.price_spot, Config.price_on_demand)")]
    if spot is None and od is None:
        if table is None:
            return []
        if plan.get("placement"):
            return [("price", f"${table.on_demand:.3f}/h on demand ({table.source}); spot: by zone, below")]
        both = f"~${table.spot:.3f}/h spot, ${table.on_demand:.3f}/h on demand"
        return [
            ("price", f"{both} (approximate: {table.source}, {_age(table_date())}; spot prices move hourly)")
        ]
    # one of them the Config's, the other the table's
    approx = f"approximate: {table.source}, {_age(table_date())}" if table is not None else "not in the table"
    if spot is not None:
        other = f"~${table.on_demand:.3f}/h on demand" if table is not None else "on demand unknown"
        return [("price", f"${spot:.3f}/h spot (Config.price_spot), {other} ({approx})")]
    if od is not None:
        mine = f"${od:.3f}/h on demand (Config.price_on_demand)"
        if plan.get("placement"):
            return [("price", f"{mine}; spot: by zone, below")]
        other = f"~${table.spot:.3f}/h spot" if table is not None else "spot unknown"
        return [("price", f"{other} ({approx}; spot prices move hourly), {mine}")]
    return []


def _dollars(value: Any) -> float | None:
    """A $/h of the plan, or None when it is not a number."""
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _fleet_rows(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """A job on several instances: how many, and its coordinator with its own hourly price (an
    on-demand machine for the whole job, billed beside the spot instances, so the user sees
    what it adds before anything is launched)."""
    rows: list[tuple[str, str]] = []
    count = int(plan.get("instances") or 1)
    if count > 1:
        rows.append(("instances", f"{count} spot instances training together (elastic data parallel)"))
    coordinator = plan.get("coordinator")
    if not isinstance(coordinator, dict):
        return rows
    price = coordinator.get("price_on_demand")
    cost = (
        f"${float(price):.4f}/h on demand for the whole job ({coordinator.get('price_source', '')})"
        if price is not None
        else f"price unknown ({coordinator.get('price_source', '')})"
    )
    rows.append(
        (
            "coordinator",
            f"{coordinator.get('instance_type', '?')}, {cost}: its own line in the cost, not spot "
            f"compute; torchft's lighthouse at {coordinator.get('address', '?')}; "
            f"{coordinator.get('ports', '')}; {coordinator.get('ends', '')}",
        )
    )
    return rows


_TH = "text-align:left;vertical-align:top;padding-right:1em;white-space:nowrap"


class Plan(dict):
    """The dry-run plan: a dict that shows itself as a summary (see the module docstring)."""

    def text(self) -> str:
        """The summary for a terminal: label: value lines."""
        rows = summary_rows(self)
        width = max(len(k) for k, _ in rows)
        lines = [f"spotnb dry run: nothing was sent. {len(self.get('requests', []))} request(s) planned."]
        lines += [f"  {k:<{width}}  {v}" for k, v in rows]
        lines.append("  (the raw requests: json.dumps(plan, indent=2); the boot script: plan['bootstrap'])")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text())

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><th style='{_TH}'>{html.escape(k)}</th>"
            f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
            for k, v in summary_rows(self)
        )
        raw = {k: v for k, v in self.items() if k != "bootstrap"}
        return (
            f"<div class='spotnb-plan {NO_MATH}'>"
            f"<b>spotnb dry run</b>: nothing was sent; {len(self.get('requests', []))} request(s) planned."
            f"<table>{rows}</table>"
            "<details><summary>raw requests (JSON)</summary><pre>"
            f"{html.escape(json.dumps(raw, indent=2, default=str))}</pre></details>"
            "<details><summary>boot script</summary><pre>"
            f"{html.escape(str(self.get('bootstrap', '')))}</pre></details>"
            "</div>"
        )
