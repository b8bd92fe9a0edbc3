"""`$SPOTNB_HOME`: where the job DB, job keys, controller logs and the default store live.

Imports nothing from spotnb: the job DB, signing, the providers and `Config` all need it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["spotnb_home"]


def spotnb_home() -> Path:
    """`$SPOTNB_HOME`, default `~/.spotnb`: job DB and the default `file://` store live here."""
    return Path(os.environ.get("SPOTNB_HOME", Path.home() / ".spotnb")).expanduser()
