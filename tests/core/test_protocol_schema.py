"""The lab extension's types, schema and palette are generated from the Python protocol and
palette (scripts/gen_protocol.py) and checked in: this fails when they drift."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from spotnb.core import protocol
from spotnb.views import palette
from tests.support.paths import REPO

ROOT = REPO
GEN = ROOT / "extension" / "src" / "protocol.gen.ts"


def test_checked_in_files_match_the_python() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protocol.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_every_kind_and_the_terminal_statuses_reach_typescript() -> None:
    schema = json.loads((ROOT / "extension" / "src" / "protocol.schema.json").read_text())
    kinds = {d["properties"]["kind"]["const"] for d in schema["$defs"].values() if "properties" in d}
    assert kinds == {k.value for k in protocol.EventKind}
    ts = GEN.read_text()
    terminal = json.loads(
        re.search(r"export const TERMINAL: readonly JobStatus\[\] = (\[.*?\]);", ts).group(1)
    )
    assert set(terminal) == {s.value for s in protocol.TERMINAL}
    for cls in protocol.EVENT_TYPES.values():
        assert f"export interface {cls.__name__}Event {{" in ts


def test_widget_panel_and_css_share_one_palette() -> None:
    ts = GEN.read_text()
    css = (ROOT / "extension" / "style" / "palette.gen.css").read_text()
    for status, (color, _label) in palette.STATUS.items():
        assert f"--spotnb-status-{status}: {color};" in css
    for key, (color, label) in palette.CATEGORIES.items():
        assert f'"key": "{key}",\n      "label": "{label}",\n      "color": "{color}"' in ts
    base = (ROOT / "extension" / "style" / "base.css").read_text()
    assert not re.search(r"data-status='\w+'\]\s*\{\s*background:\s*#", base), (
        "a status colour typed by hand in base.css"
    )
    sources = "".join(
        p.read_text() for p in (ROOT / "extension" / "src").glob("*.ts") if not p.name.endswith(".gen.ts")
    )
    assert not re.search(r"'(succeeded|failed|stopped|lost)'\s*,\s*'", sources), (
        "a list of statuses typed by hand in the extension"
    )
    from spotnb.views.widget.figures import CATEGORY_COLORS, COLORS

    assert COLORS == palette.METRICS
    assert {k: c for k, (c, _l) in palette.CATEGORIES.items()} == CATEGORY_COLORS
