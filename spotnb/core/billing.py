"""How a market bills an instance's time: the increment it rounds to and the minimum charge.

The clouds list spot prices per hour but bill the time an instance ran in increments, with a
minimum, so the ledger (`spotnb.core.ledger`) must bill the same way to tell the truth: a spot
instance preempted after 20 s on AWS is billed 60 s. And a move timed to the end of a
billing increment (`Config.migrate="billing-aware"`, `spotnb.market.migration`) needs to know where
that end is: the rest of a started increment is paid for anyway.

The documented values (Linux VMs, read 2026-11):

- AWS: "Amazon EC2 usage of Linux based instances that are launched in On-Demand, Reserved
  and Spot form will be billed on one second increments, with a minimum of 60 seconds"
  (https://aws.amazon.com/about-aws/whats-new/2017/10/announcing-amazon-ec2-per-second-billing/).
- GCP: per-second billing with a one-minute minimum for Compute Engine VMs, preemptible (spot)
  ones included (Google Cloud blog, "Extending per-second billing in Google Cloud", 2017-09;
  https://cloud.google.com/compute/vm-instance-pricing: "billed ... per second, with a
  one-minute minimum").
- Azure: "We bill for the full minutes that your virtual machine runs, so you are not billed
  for any extra seconds. In this example you are billed for 6 minutes" (for 6 min 45 s;
  https://azure.microsoft.com/resources/knowledge-center/if-my-virtual-machine-ran-for-6-minutes-and-45/):
  whole minutes, the partial one free (`round_down`). Third-party pages say "per second with a
  60 s minimum" instead; both leave no moment of an hour cheaper to leave at than another
  beyond the minute.

The local market bills continuously (increment 0) unless a zone of `local_regions` says
otherwise (`{"billing": "1h"}` or `{"billing": {"increment": "30s", "minimum": "1m"}}`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spotnb.core.durations import parse_duration

__all__ = ["Billing", "CLOUD_BILLING", "CONTINUOUS", "charge", "parse_billing", "price_at"]

#: the longest increment or minimum a market may have (a day: longer is a typo, not a market)
MAX_BILLING_S = 86400.0


@dataclass(frozen=True)
class Billing:
    """`increment_s`: the time is billed in whole increments (0: continuously); `minimum_s`: at
    least this much is billed per instance; `round_down`: a started increment is free (Azure's
    whole minutes) instead of paid in full (everyone else's)."""

    increment_s: float = 0.0
    minimum_s: float = 0.0
    round_down: bool = False

    def billed(self, seconds: float) -> float:
        """The seconds billed for an instance that ran `seconds` (from its allocation)."""
        s = max(0.0, seconds)
        inc = self.increment_s
        if inc > 0:
            k = s / inc
            # a float a hair past a whole increment is that increment, not the next one
            whole = math.floor(k + 1e-9) if self.round_down else math.ceil(k - 1e-9)
            s = max(0.0, whole) * inc
        return max(s, self.minimum_s)

    def period_end(self, seconds: float) -> float:
        """The end (seconds from the allocation) of the time already paid for, or free, at
        `seconds`: leaving any earlier saves nothing. Continuous billing: `seconds` itself."""
        s = max(0.0, seconds)
        inc = self.increment_s
        if inc > 0:
            s = (math.floor(s / inc + 1e-9) + 1) * inc if self.round_down else self.billed(s)
        return max(s, self.minimum_s)

    def describe(self) -> str:
        """In words, for the dry run and the docs: "per 1 s, at least 60 s"."""
        if self.increment_s <= 0:
            head = "continuously"
        else:
            head = f"per {_dur(self.increment_s)}" + (" (a started one free)" if self.round_down else "")
        return head + (f", at least {_dur(self.minimum_s)}" if self.minimum_s > 0 else "")

    def as_info(self) -> dict[str, Any]:
        """What the ledger reads back (`from_info`): the instance's `info["billing"]`."""
        out: dict[str, Any] = {"increment": self.increment_s, "minimum": self.minimum_s}
        if self.round_down:
            out["round_down"] = True
        return out

    @classmethod
    def from_info(cls, value: Any) -> Billing | None:
        """The billing an `allocated` event recorded, or None when it is absent or unreadable
        (an older spotnb, a foreign writer): then the ledger bills continuously."""
        if not isinstance(value, Mapping):
            return None
        inc, minimum = _finite(value.get("increment")), _finite(value.get("minimum", 0.0))
        if (
            inc is None
            or minimum is None
            or not (0 <= inc <= MAX_BILLING_S and 0 <= minimum <= MAX_BILLING_S)
        ):
            return None
        return cls(inc, minimum, value.get("round_down") is True)


#: continuous billing: the time an instance ran, to the fraction of a second
CONTINUOUS = Billing()

#: each cloud's billing of Linux spot VMs (sources in the module's docstring)
CLOUD_BILLING: dict[str, Billing] = {
    "aws": Billing(1.0, 60.0),
    "gcp": Billing(1.0, 60.0),
    "azure": Billing(60.0, 0.0, round_down=True),
}


def parse_billing(where: str, value: Any) -> Billing:
    """A billing given by a user: a duration (`"1h"`: per hour, at least an hour) or
    `{"increment": "30s", "minimum": "1m"}` (minimum defaults to 0). `where` names the field in
    the errors (e.g. "zone 'zone-a': billing")."""
    if isinstance(value, Mapping):
        bad = set(value) - {"increment", "minimum"}
        if bad:
            raise ValueError(f"{where}: the keys are increment and minimum; got {sorted(map(str, bad))}")
        if "increment" not in value:
            raise ValueError(f"{where}: give an increment, e.g. {{'increment': '30s', 'minimum': '1m'}}")
        inc = _duration(where, "increment", value["increment"])
        minimum = _duration(where, "minimum", value.get("minimum", 0))
        return Billing(inc, minimum)
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{where}: give a duration ('1h') or {{'increment': '30s', 'minimum': '1m'}}")
    inc = _duration(where, "increment", value)
    return Billing(inc, inc)


def _duration(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{where}: {key} {value!r} is not a duration; give seconds or '30s'")
    negative = isinstance(value, (int, float)) and value < 0
    if negative or (isinstance(value, str) and value.strip().startswith("-")):
        raise ValueError(f"{where}: {key} must be 0 or more (got {value!r}); 0 bills continuously")
    try:
        sec = parse_duration(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{where}: {key} {value!r} is not a duration ({exc}); give seconds or '30s'"
        ) from None
    if not math.isfinite(sec) or sec < 0:
        raise ValueError(f"{where}: {key} must be 0 or more (got {value!r}); 0 bills continuously")
    if sec > MAX_BILLING_S:
        raise ValueError(f"{where}: {key} {value!r} is more than a day; clouds bill per second to per hour")
    return float(sec)


def price_at(steps: Sequence[tuple[float, float]], t: float, default: float) -> float:
    """The $/h at `t` of a step function `[(time, $/h), ...]` sorted by time; `default` before
    its first step."""
    i = bisect.bisect_right([a for a, _ in steps], t) - 1
    return float(steps[i][1]) if i >= 0 else default


def charge(
    start: float,
    end: float,
    price: float,
    billing: Billing = CONTINUOUS,
    steps: Sequence[tuple[float, float]] = (),
) -> float:
    """$ billed for an instance allocated at `start` and gone at `end` (wall times): its billed
    time (`Billing.billed`) from `start` on, at `price` $/h changed by `steps` (sorted
    `[(time, $/h)]` of its zone's price changes; the first applies before any step) — so a price
    that changes while it runs is billed piecewise, and the billed tail after `end` at the price
    then."""
    stop = start + billing.billed(end - start)
    if stop <= start:
        return 0.0
    points = [(t, p) for t, p in steps if start < t < stop]
    total, t, p = 0.0, start, price_at(steps, start, price)
    for at, nxt in points:
        total += (at - t) * p
        t, p = at, float(nxt)
    total += (stop - t) * p
    return total / 3600.0


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _dur(sec: float) -> str:
    for unit, size in (("h", 3600.0), ("min", 60.0)):
        if sec >= size and sec % size == 0:
            return f"{sec / size:g} {unit}"
    return f"{sec:g} s"
