"""The docs' cheap invariants, in milliseconds (the real check is `bash scripts/docs.sh`, which
CI runs at the end of scripts/test.sh: Sphinx with warnings as errors, the tutorials executed).

The Config reference is generated from the fields' descriptions (docs/_ext/spotnb_config.py):
every field of `spot.Config` is in exactly one section, and a field without a description is
refused, so the reference can neither drift from the code nor have a hole. README and
ARCHITECTURE.md stay short enough to read (issue 27), README still opens with the two commands."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest
from pydantic import BaseModel, Field

from spotnb.settings.config import Config
from tests.support.paths import REPO


def _generator() -> ModuleType:
    path = REPO / "docs" / "_ext" / "spotnb_config.py"
    spec = importlib.util.spec_from_file_location("spotnb_config", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("spotnb_config", module)
    spec.loader.exec_module(module)
    return module


def test_the_config_reference_lists_every_field_once_with_its_description() -> None:
    sections = _generator().sections()
    names = [f.name for rows in sections.values() for f in rows]
    assert sorted(names) == sorted(Config.model_fields)
    assert len(names) == len(set(names))
    assert all(f.description for rows in sections.values() for f in rows)
    assert set(sections) == {"generic", "local", "aws", "azure", "gcp", "any"}


def test_a_field_without_a_description_fails_the_reference() -> None:
    gen = _generator()

    class Settings(BaseModel):
        described: int = Field(1, description="Has one.")
        bare: int = 2

    with pytest.raises(gen.MissingDescription, match="Settings.bare"):
        gen.fields_of(Settings, Settings.model_fields)


def test_readme_and_architecture_stay_short_and_readme_opens_with_the_two_commands() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert len((REPO / "ARCHITECTURE.md").read_text().splitlines()) <= 250
    first_block = readme.split("```bash", 1)[1].split("```", 1)[0].strip().splitlines()
    assert first_block[0].startswith("pip install torch==2.13.0 && pip install -e . && spotnb demo")
    assert first_block[1].startswith("bash scripts/test.sh")
