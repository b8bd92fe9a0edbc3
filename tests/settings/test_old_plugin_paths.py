"""A provider plugin written before the re-layout (issue 27) still loads after it.

Third-party packages register providers in the `spotnb.providers` entry-point group; until
695c75d the way to write one (ARCHITECTURE.md, "A provider"; the toy provider of the tests) was
`from spotnb.providers.info import ProviderInfo, ProviderSettings` and, to reuse the local
market, `from spotnb.providers.local import LocalProvider`. A plugin whose import fails is left
out with only a logged warning, so after an upgrade `Config(provider="toy")` says "unknown
provider 'toy'": the old import paths must keep working (as re-exports of the new homes).
"""

from __future__ import annotations

import importlib


def test_the_pre_relayout_plugin_imports_still_resolve_to_the_same_classes() -> None:
    from spotnb.providers.local.provider import LocalProvider
    from spotnb.settings.base import ProviderSettings
    from spotnb.settings.registry import ENTRY_POINT_GROUP, ProviderInfo

    info = importlib.import_module("spotnb.providers.info")
    assert info.ProviderInfo is ProviderInfo and info.ProviderSettings is ProviderSettings
    assert importlib.import_module("spotnb.providers.local").LocalProvider is LocalProvider
    assert ENTRY_POINT_GROUP == "spotnb.providers"
