"""How the house is laid out: rooms, the longest files and classes, where the tests sit.

    python scripts/house_metrics.py [TREE]     # TREE: a checkout (default: this one)

Issue 27 asked for these figures before and after the re-layout; run it on an old checkout
(`git archive REV | tar -x -C /tmp/old`) to compare. Import circles are tests/test_import_graph.py's.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
    files = [p for p in (root / "spotnb").rglob("*.py") if "labextension" not in p.parts]
    rooms: dict[str, int] = {}
    for p in files:
        rooms[str(p.parent.relative_to(root))] = rooms.get(str(p.parent.relative_to(root)), 0) + 1
    lines = {p: len(p.read_text().splitlines()) for p in files}
    print(f"modules: {len(files)}, lines: {sum(lines.values())}, folders: {len(rooms)}")
    print("most modules in one folder:", sorted(((n, d) for d, n in rooms.items()), reverse=True)[:5])
    longest = sorted(((n, str(p.relative_to(root))) for p, n in lines.items()), reverse=True)[:8]
    print("longest files:", longest)
    classes = []
    for p in files:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                methods = sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in node.body)
                classes.append((size, f"{p.relative_to(root)}:{node.name}", methods))
    print("longest classes (lines, where, methods):", sorted(classes, reverse=True)[:8])
    tests = list((root / "tests").rglob("test_*.py"))
    top = [t for t in tests if t.parent == root / "tests"]
    print(f"test files: {len(tests)}, at tests/ top level: {len(top)}")


if __name__ == "__main__":
    main()
