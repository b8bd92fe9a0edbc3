"""The lab extension's stylesheet must not restyle the notebook widget: every rule that names a
class the widget's HTML uses is scoped under an element only the extension renders. (Its
`.spotnb-progress` rule once hid the widget's progress line behind a 6 px grey bar.)"""

from __future__ import annotations

import re

from spotnb.core.state import JobState
from spotnb.views.widget.synthetic import synthetic_events
from spotnb.views.widget.view import render_info_html
from tests.support.paths import REPO

ROOT = REPO


def _widget_classes() -> set[str]:
    state = JobState()
    for batch in synthetic_events(steps=40, preempt_at=(15,), save_every=10, rows_per_flush=5):
        state.feed_events(batch)
    html = render_info_html(state, "job-1")
    return {c for attr in re.findall(r"class=['\"]([^'\"]+)['\"]", html) for c in attr.split()}


def _rules(css: str) -> list[str]:
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    return [sel.strip() for block in re.findall(r"([^{}]+)\{", css) for sel in block.split(",")]


def test_no_extension_rule_reaches_into_the_widget() -> None:
    widget = _widget_classes()
    assert "spotnb-progress" in widget  # the line that was hidden
    leaks = []
    for path in sorted((ROOT / "extension" / "style").glob("*.css")):
        for selector in _rules(path.read_text()):
            classes = re.findall(r"\.([\w-]+)", selector)
            # scoped: under an ancestor the widget never renders (one of the extension's own)
            scoped = any(c not in widget for c in classes[:-1])
            if classes and classes[-1] in widget and not scoped:
                leaks.append(f"{path.name}: {selector}")
    assert not leaks, f"extension CSS styles the notebook widget's elements: {leaks}"
