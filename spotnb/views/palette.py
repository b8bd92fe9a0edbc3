"""One palette and one set of labels for every view of a job: the notebook widget, the text
view, the JupyterLab panel (its TypeScript and CSS are generated from this module by
`scripts/gen_protocol.py`; a test fails when they drift) and the tutorials' figures.

Pure data; imports nothing.
"""

from __future__ import annotations

__all__ = [
    "STATUS",
    "CATEGORIES",
    "METRICS",
    "MARKS",
    "GOOD",
    "BAD",
    "status_color",
    "category_color",
    "category_label",
]

#: job status -> (colour, label)
STATUS: dict[str, tuple[str, str]] = {
    "pending": ("#757575", "pending"),
    "running": ("#1565c0", "running"),
    "preempted": ("#ef6c00", "preempted"),
    "restoring": ("#6a1b9a", "restoring"),
    "succeeded": ("#2e7d32", "succeeded"),
    "failed": ("#c62828", "failed"),
    "stopped": ("#424242", "stopped"),
    "lost": ("#6d4c41", "lost"),
}

#: where the time went, in the order every view stacks them: key -> (colour, label)
CATEGORIES: dict[str, tuple[str, str]] = {
    "compute": ("#2ca02c", "compute"),
    "recompute": ("#ff7f0e", "recompute"),
    "save": ("#1f77b4", "checkpoint save"),
    "alloc": ("#9e9e9e", "allocation"),
    "prep": ("#bcbd22", "preparation"),
    "other": ("#dddddd", "other"),
}

#: metric traces, in the order metrics were first logged
METRICS: tuple[str, ...] = (
    "#1f77b4",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
)

#: marks on the charts: a preemption, a resume, a notice, a committed checkpoint, redone steps,
#: a move to another zone
MARKS: dict[str, str] = {
    "preempt": "#d62728",
    "resume": "#17becf",
    "notice": "#ff7f0e",
    "checkpoint": "#1f77b4",
    "redo": "#ff7f0e",
    "move": "#6a1b9a",
}

GOOD = "#2e7d32"  # money saved
BAD = "#c62828"  # money lost, errors


def status_color(status: str) -> str:
    return STATUS.get(status, STATUS["pending"])[0]


def category_color(key: str) -> str:
    return CATEGORIES[key][0]


def category_label(key: str) -> str:
    return CATEGORIES[key][1]
