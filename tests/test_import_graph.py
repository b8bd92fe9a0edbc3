"""The package's import graph has no circles (issue 12), and the light entry points stay light.

Why: a circle hides behind function-level imports until someone moves one to the top and the
package stops importing; the direction of imports is what ARCHITECTURE.md documents (the
runtime imports nothing from the notebook side). Imports inside functions are edges too: a
lazy import of a sibling module is still a dependency. Only imports under `TYPE_CHECKING` are
left out (they do not run).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import spotnb

ROOT = Path(spotnb.__file__).parent
# lazy on purpose: a cloud SDK, or a module that needs torch/plotly/ipywidgets, behind an
# optional feature (listed here so that a new lazy edge is a decision, not an accident)


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, module: str, is_pkg: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                for sub in ast.walk(child):
                    if hasattr(sub, "lineno"):
                        lines.add(sub.lineno)
    return lines


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_lines(tree)
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, module, is_pkg)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                # a package's __init__ is not a dependency of its own submodules' circles
                if target and target != module and not module.startswith(target + "."):
                    graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circles() -> None:
    found = cycles(import_graph())
    assert not found, "import circles (break them by moving the shared part down): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_runtime_imports_nothing_from_the_notebook_side() -> None:
    """What runs on the instance may import only itself and the shared, light modules. The
    framework integrations (`spotnb.integrations`) run on the instance too, inside the user's
    function: they belong to the instance side."""
    shared = {
        "spotnb",
        "spotnb.core.protocol",
        "spotnb.core.events",
        "spotnb.core.store",
        "spotnb.core.signing",
        "spotnb.core.spec",
        "spotnb.core.files",
        "spotnb.errors",
        "spotnb.core.sizes",
        "spotnb.core.sync",
        "spotnb.policy",
        "spotnb.policy.base",
        "spotnb.policy.intervals",
        "spotnb.policy.static",
        "spotnb.policy.periodic",
        "spotnb.policy.hedged",
    }
    graph = import_graph()
    instance = ("spotnb.runtime", "spotnb.integrations")
    bad = {
        m: sorted(t for t in targets if not t.startswith(instance) and t not in shared)
        for m, targets in graph.items()
        if m.startswith(instance)
    }
    bad = {m: t for m, t in bad.items() if t}
    assert not bad, f"the runtime imports notebook-side modules: {bad}"


def test_import_spotnb_stays_light() -> None:
    """`import spotnb` (and `spotnb.market.forecast`) loads no cloud SDK, no torch, no plotly/ipywidgets,
    no statsmodels/pandas."""
    code = (
        "import sys, spotnb, spotnb.market.forecast; heavy = [m for m in ('boto3', 'azure', 'google.cloud', "
        "'torch', 'plotly', 'ipywidgets', 'statsmodels', 'pandas') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import spotnb pulled in {out.stdout.strip()}"
