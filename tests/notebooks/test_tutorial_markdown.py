"""The tutorials' prose shows dollar amounts as dollars. JupyterLab's MathJax reads a pair of
`$` in a markdown cell as inline TeX — "**$6.2/h on demand, $2.3/h spot**" came out as italic
run-together maths — and, as measured in JupyterLab 4.6, markdown's own `\\$` escape does not
stop it (the markdown renderer consumes the backslash first). What does: `\\\\$` in the source
(the renderer leaves `\\$`, which MathJax reads as an escaped dollar), or a code span. The
browser tests check the rendered notebooks (no `mjx-container`); this checks every tutorial's
source, all of them, in milliseconds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.paths import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def bare_dollars(markdown: str) -> list[str]:
    """The lines of `markdown` with a `$` that MathJax would read as a delimiter: outside code
    spans and fenced blocks, not written as `\\\\$`."""
    found, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        text = re.sub(r"`[^`]*`", "", line).replace("\\\\$", "")
        if "$" in text:
            found.append(line)
    return found


def test_the_check_knows_a_bare_dollar_from_a_shielded_one() -> None:
    assert bare_dollars("**$6.2/h on demand, $2.3/h spot**")
    assert bare_dollars("costs \\$0.20/h")  # markdown's escape: typeset all the same
    assert not bare_dollars("costs \\\\$0.20/h, `$x$`, and\n```\n$ pip install\n```")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_no_dollar_in_a_tutorials_prose_reads_as_maths(path: Path) -> None:
    nb = json.loads(path.read_text())
    bad = [
        (i, line)
        for i, cell in enumerate(nb["cells"])
        if cell["cell_type"] == "markdown"
        for line in bare_dollars("".join(cell["source"]))
    ]
    assert not bad, f"{path.name}: write dollars as \\\\$ (cell, line): {bad}"
