"""Where the tests' files are, from anywhere in the tests tree (tests live one to three folders
deep, mirroring the package, so a path counted in `parents[n]` from a test file breaks when the
file moves)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "support" / "fixtures"
SCRIPTS = REPO / "tests" / "support" / "scripts"
TOY_PROVIDER = REPO / "tests" / "support" / "toy_provider"
