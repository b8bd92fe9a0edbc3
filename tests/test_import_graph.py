"""The package's import graph has no circles (issue 12), each folder imports only what its rule
allows (#27), no module imports another's private name, and the light entry points stay light.

Why: a circle hides behind function-level imports until someone moves one to the top and the
package stops importing; the direction of imports is what ARCHITECTURE.md documents (the
runtime imports nothing from the notebook side, the settings import no provider, the market
no settings). Imports inside functions are edges too: a lazy import of a sibling module is
still a dependency, and so is a submodule's import of its own package's `__init__` (that edge
once hid `settings.config -> providers/__init__ -> settings.* -> market.prices -> providers.base`).
Only imports under `TYPE_CHECKING` are left out (they do not run).
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

import spotnb

ROOT = Path(spotnb.__file__).parent


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


@functools.cache
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
                if target and target != module:  # a package's own __init__ counts too
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


# --- import rules per folder (#27) -----------------------------------------------------------
#
# A module's *area* is its folder under spotnb/ (`core`, `settings`, `market`, …) or, for the
# public surface's single modules, its own name (`api`, `job`, `aio`, `submit`, …). The root
# `spotnb` (its `__init__` imports everything lazily, nothing at import) may be imported from
# anywhere. An edge inside one area is always allowed.

#: area -> the only other areas it imports (the bottom layers: each question has one answer).
ONLY: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "core": frozenset({"errors"}),
    "policy": frozenset({"core", "errors"}),
    # settings validate through the market's checks (regional stores, GPU count, price table),
    # so the market must never import settings (see NEVER)
    "settings": frozenset({"core", "errors", "policy", "market"}),
    "market": frozenset({"core", "errors", "policy", "traces"}),
    "traces": frozenset({"core", "errors", "market"}),
    "sim": frozenset({"core", "errors", "market", "policy", "traces"}),
}

#: the public surface: single modules the user imports (through `spotnb`'s lazy names)
SURFACE = frozenset({"api", "job", "aio", "submit", "script_job", "cli", "demo", "weights", "_jupyter"})

#: area -> areas it must never import.
NEVER: dict[str, frozenset[str]] = {
    "providers": frozenset({"control", "views", "doctor", "sim"}) | SURFACE,
    "control": frozenset({"views", "doctor", "api", "submit", "script_job", "cli", "demo"}),
    "runtime": frozenset({"control", "views", "market", "providers", "settings", "doctor"}) | SURFACE,
    "integrations": frozenset({"control", "views", "market", "providers", "settings", "doctor"}) | SURFACE,
    "market": frozenset({"settings", "providers", "control", "views"}),
}

#: area -> the only areas that may import it (what is above it).
IMPORTED_ONLY_BY: dict[str, frozenset[str]] = {
    "views": frozenset({"api", "job", "cli", "demo"}),
    "doctor": frozenset({"cli"}),
}

#: edges that cross a rule on purpose, each with its reason; a new one is a decision, not an accident
EXCEPTIONS: dict[tuple[str, str], str] = {
    (
        "spotnb.core.spec",
        "spotnb.settings.config",
    ): "JobSpec.to_config builds the Config when called (notebook side)",
    ("spotnb.core.spec", "spotnb.settings.any"): "JobSpec.to_config: provider='any' keeps its clouds' fields",
    ("spotnb.market.regional", "spotnb.runtime.checkpoint.digest"): "a regional copy is checked with the "
    "checkpoint's own digests",
    ("spotnb.providers.cleanup", "spotnb.control.jobdb"): "`spotnb gc` asks the job DB which jobs have ended",
    ("spotnb.providers.local.provider", "spotnb.control.jobdb"): "the local market hosts a job's controller "
    "(controller='cloud') unless one holds its lease",
    (
        "spotnb.providers.local.provider",
        "spotnb.control.supervise",
    ): "the local market hosts a job's controller (controller='cloud') as a process of its own session",
}


def area(module: str) -> str:
    """`spotnb.core.spec` -> "core"; `spotnb.api` -> "api"; `spotnb` -> "spotnb"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _crossing_edges() -> list[tuple[str, str]]:
    return sorted(
        (m, t)
        for m, targets in import_graph().items()
        for t in targets
        if area(m) != area(t) and area(t) != "spotnb" and (m, t) not in EXCEPTIONS
    )


def test_every_area_named_by_a_rule_exists() -> None:
    """A rule for a folder that was renamed away checks nothing: the table must name real areas."""
    areas = {area(m) for m in import_graph()}
    named = set(ONLY) | set(NEVER) | set(IMPORTED_ONLY_BY) | {t for v in ONLY.values() for t in v}
    assert named - SURFACE <= areas, f"rules name areas that do not exist: {sorted(named - SURFACE - areas)}"
    assert all(m in import_graph() and t in import_graph() for m, t in EXCEPTIONS), (
        "an exception names a gone module"
    )


@pytest.mark.parametrize("name", sorted(ONLY))
def test_area_imports_only_its_layers(name: str) -> None:
    allowed = ONLY[name]
    bad = [f"{m} -> {t}" for m, t in _crossing_edges() if area(m) == name and area(t) not in allowed]
    assert not bad, f"{name} may import only {sorted(allowed)}; it imports: " + "; ".join(bad)


@pytest.mark.parametrize("name", sorted(NEVER))
def test_area_never_imports(name: str) -> None:
    forbidden = NEVER[name]
    bad = [f"{m} -> {t}" for m, t in _crossing_edges() if area(m) == name and area(t) in forbidden]
    assert not bad, f"{name} must never import {sorted(forbidden)}; it imports: " + "; ".join(bad)


@pytest.mark.parametrize("name", sorted(IMPORTED_ONLY_BY))
def test_area_is_imported_only_from_above(name: str) -> None:
    allowed = IMPORTED_ONLY_BY[name]
    bad = [f"{m} -> {t}" for m, t in _crossing_edges() if area(t) == name and area(m) not in allowed]
    assert not bad, f"{name} may be imported only by {sorted(allowed)}; imported by: " + "; ".join(bad)


# --- no private name across modules (#27) ----------------------------------------------------


def private_imports() -> list[tuple[str, str, str]]:
    """Every `from spotnb.a import _b` (also relative, also inside functions) where `spotnb.a` is
    not the importing module itself: (file, module, name)."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        module = _module_name(path)
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _resolve(node, module, is_pkg)
            if not (source == "spotnb" or source.startswith("spotnb.")) or source == module:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append((path.relative_to(ROOT.parent).as_posix(), source, alias.name))
    return found


def test_no_private_name_is_imported_across_modules() -> None:
    """A name another module needs is part of an interface: make it public (and document it)."""
    bad = [f"{f}: from {m} import {n}" for f, m, n in private_imports()]
    assert not bad, "private names imported across modules (make them public): " + "; ".join(bad)


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
