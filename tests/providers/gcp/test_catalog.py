"""GCP prices from the Cloud Billing catalog (`spotnb.providers.gcp.catalog`).

The catalog's answer is replayed from `tests/fixtures/gcp_catalog/skus.json` (two pages, shaped
as the REST API returns them) through a fake authorized session; Compute Engine's
`machineTypes.get` is a fake too (the control plane cannot run here). What is real: the paging,
the SKU selection, the pricing of a machine type from its vCPUs, memory and bundled GPU, the
disk cache, and the fall back to the dated table.
"""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest

import spotnb as spot
from spotnb.market.prices import lookup_price
from spotnb.providers.gcp.provider import GCPProvider
from tests.support.paths import FIXTURES

PAGES = json.loads((FIXTURES / "gcp_catalog" / "skus.json").read_text())["pages"]


class FakeCatalog:
    """An authorized session answering the catalog's pages by `pageToken`."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fail = fail

    def get(self, url: str, params: dict[str, Any], timeout: float) -> Any:
        self.calls.append(params)
        if self.fail is not None:
            raise self.fail
        assert url.endswith("/v1/services/6F81-5844-456A/skus") and params["currencyCode"] == "USD"
        page = PAGES[1] if params.get("pageToken") == "page-2" else PAGES[0]
        return SimpleNamespace(raise_for_status=lambda: None, json=lambda: page)


class FakeMachineTypes:
    SHAPES = {
        "g2-standard-4": (4, 16 * 1024, [("nvidia-l4", 1)]),
        "n2-standard-8": (8, 32 * 1024, []),
        "m1-ultramem-40": (40, 961 * 1024, []),
    }

    def __init__(self) -> None:
        self.calls = 0

    def get(self, project: str, zone: str, machine_type: str) -> Any:
        self.calls += 1
        cpus, mem, gpus = self.SHAPES[machine_type]
        return SimpleNamespace(
            guest_cpus=cpus,
            memory_mb=mem,
            accelerators=[
                SimpleNamespace(guest_accelerator_type=t, guest_accelerator_count=c) for t, c in gpus
            ],
        )


def _provider(catalog: Any, machine_types: Any, instance_type: str = "g2-standard-4") -> GCPProvider:
    config = spot.Config(
        provider="gcp", store="gs://b/p", region="us-central1-a", instance_type=instance_type, gcp_project="p"
    )
    return GCPProvider(
        config, instances=object(), zones=object(), machine_types=machine_types, catalog=catalog
    )


def test_a_machine_type_is_priced_from_its_cores_memory_and_gpu() -> None:
    catalog, types = FakeCatalog(), FakeMachineTypes()
    price = _provider(catalog, types).prices("g2-standard-4")["us-central1-a"]
    # 4 vCPU, 16 GiB and one L4 at the fixture's us-central1 rates
    assert price.spot == pytest.approx(4 * 0.008746 + 16 * 0.001025 + 0.196)
    assert price.on_demand == pytest.approx(4 * 0.024988 + 16 * 0.002929 + 0.56)
    assert "Cloud Billing catalog" in price.source and "us-central1" in price.source
    assert [c.get("pageToken") for c in catalog.calls] == [None, "page-2"]  # both pages read
    # a second provider (another controller) reads the cached catalog and shape from disk
    again = _provider(catalog, types).prices("g2-standard-4", ["us-east1-b", "us-central1-a"])
    assert again["us-central1-a"].spot == pytest.approx(price.spot)
    assert again["us-east1-b"].spot == pytest.approx(price.spot)  # the SKU covers both regions
    assert len(catalog.calls) == 2 and types.calls == 1
    n2 = _provider(catalog, types, "n2-standard-8").prices("n2-standard-8")["us-central1-a"]
    assert n2.on_demand == pytest.approx(8 * 0.031611 + 32 * 0.004237)  # not the Custom SKU


def test_a_type_the_catalog_cannot_price_falls_back_to_the_table() -> None:
    """A family this module does not know (m1) is not priced from a guess."""
    prices = _provider(FakeCatalog(), FakeMachineTypes(), "m1-ultramem-40").prices("m1-ultramem-40")
    assert prices == {}  # not in the dated table either: no price rather than a wrong one
    table = lookup_price("g2-standard-4", "gcp")
    assert table is not None


def test_without_credentials_the_dated_table_answers_and_the_catalog_is_asked_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="spotnb")
    catalog = FakeCatalog(fail=PermissionError("403 cloudbilling.googleapis.com is disabled"))
    p = _provider(catalog, FakeMachineTypes())
    table = lookup_price("g2-standard-4", "gcp")
    assert table is not None
    for _ in range(3):
        price = p.prices("g2-standard-4")["us-central1-a"]
        assert (price.spot, price.on_demand, price.source) == (table.spot, table.on_demand, table.source)
    assert len(catalog.calls) == 1
    assert "Cloud Billing catalog is not readable" in caplog.text
