"""A third-party provider, as another package would ship it (for
tests/providers/test_provider_registry.py).

Its settings are light (no SDK); its provider class is imported only when a job runs on it.
It is registered by `spotnb_toy-0.1.dist-info/entry_points.txt`, not by any edit in spotnb.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from spotnb.settings.base import ProviderSettings
from spotnb.settings.registry import ProviderInfo


class ToySettings(ProviderSettings):
    prefix: ClassVar[str] = "toy_"

    toy_color: Literal["red", "blue"] = Field("red", description="The toy market's colour.")
    toy_speed: float = Field(1.0, gt=0, description="How fast the toy market allocates.")

    @field_validator("toy_speed")
    @classmethod
    def _toy_speed(cls, v: float) -> float:
        if v > 100:
            raise ValueError("a toy cannot go that fast; use at most 100")
        return v

    @classmethod
    def check_config(cls, config: Any) -> None:
        if config.toy_color == "blue" and config.instance_type != "g4dn.xlarge":
            raise ValueError("the blue toy market sells only g4dn.xlarge")


INFO = ProviderInfo(
    "toy",
    "spotnb_toy.provider:ToyProvider",
    ToySettings,
    install="pip install spotnb-toy",
    description="a toy market for the tests",
)
