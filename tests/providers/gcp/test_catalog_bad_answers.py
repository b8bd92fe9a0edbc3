"""The GCP Cloud Billing catalog answering badly: a page token that repeats, SKUs with
garbage fields, zero prices, a corrupt or future-dated cache. Each must leave the dated table
as the answer (with a log line), never crash a price lookup or price a machine at $0.

The catalog is replayed through the fake authorized session of tests/providers/gcp/test_catalog.py, and
Compute Engine's `machineTypes.get` is faked (the control plane cannot run here); the paging,
the SKU parsing, the cache on disk and the fall back are the real ones."""

from __future__ import annotations

import copy
import json
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spotnb.core.home import spotnb_home
from spotnb.market.prices import lookup_price
from spotnb.providers.gcp.catalog import MachineShape, Rates, catalog_skus, machine_price, rates_from_skus
from tests.providers.gcp.test_catalog import PAGES, FakeCatalog, FakeMachineTypes, _provider

TABLE = lookup_price("g2-standard-4", "gcp")


class LoopingCatalog(FakeCatalog):
    """A catalog whose every page says there is a next one, under the same token."""

    def get(self, url: str, params: dict[str, Any], timeout: float) -> Any:
        self.calls.append(params)
        page = {**PAGES[0], "nextPageToken": "page-2"}
        return SimpleNamespace(raise_for_status=lambda: None, json=lambda: page)


class PagesCatalog(FakeCatalog):
    """The fixture's catalog with its pages replaced."""

    def __init__(self, pages: list[dict[str, Any]]) -> None:
        super().__init__()
        self.pages = pages

    def get(self, url: str, params: dict[str, Any], timeout: float) -> Any:
        self.calls.append(params)
        page = self.pages[1] if params.get("pageToken") == "page-2" else self.pages[0]
        return SimpleNamespace(raise_for_status=lambda: None, json=lambda: page)


def _table_price(price: Any) -> bool:
    assert TABLE is not None
    return (price.spot, price.on_demand, price.source) == (TABLE.spot, TABLE.on_demand, TABLE.source)


def test_a_page_token_that_repeats_is_a_failed_read_not_a_catalog(caplog: pytest.LogCaptureFixture) -> None:
    """200 requests of the same page, then a 'catalog' of duplicates cached for a day, is
    not an answer: the repeat is noticed at once and the table answers."""
    caplog.set_level(logging.INFO, logger="spotnb")
    with pytest.raises(ValueError, match="nextPageToken"):
        catalog_skus(LoopingCatalog())
    catalog = LoopingCatalog()
    price = _provider(catalog, FakeMachineTypes()).prices("g2-standard-4")["us-central1-a"]
    assert _table_price(price)
    assert len(catalog.calls) <= 3
    assert "Cloud Billing catalog is not readable" in caplog.text
    assert not list((spotnb_home() / "cache").glob("gcp-catalog-skus*"))  # nothing cached


def test_garbage_skus_are_skipped_and_zero_prices_never_make_a_free_machine() -> None:
    """One SKU with a malformed price or a non-list field does not throw the catalog away;
    a SKU priced at zero is no rate (the family is then unpriced: the table answers)."""
    pages = copy.deepcopy(PAGES)
    skus = pages[0]["skus"]
    skus.insert(0, {"description": "N2 Instance Core running in Americas", "pricingInfo": {"oops": 1}})
    skus.insert(0, {"description": "Junk", "category": "x", "serviceRegions": "us-central1"})
    skus.insert(
        0,
        {
            "description": "Spot Preemptible N2 Instance Ram running in Americas",
            "category": {"usageType": "Preemptible"},
            "serviceRegions": ["us-central1"],
            "pricingInfo": [{"pricingExpression": {"tieredRates": [{"unitPrice": {"units": "abc"}}]}}],
        },
    )
    catalog = PagesCatalog(pages)
    price = _provider(catalog, FakeMachineTypes()).prices("g2-standard-4")["us-central1-a"]
    assert "Cloud Billing catalog" in price.source  # the good SKUs still price it
    assert price.spot == pytest.approx(4 * 0.008746 + 16 * 0.001025 + 0.196)
    # a shape of nothing (a corrupt cache, an API answering zeros) is no price, not $0
    rates = Rates(
        {"core": {"n2": 0.01}, "ram": {"n2": 0.001}, "gpu": {}},
        {"core": {"n2": 0.03}, "ram": {"n2": 0.004}, "gpu": {}},
    )
    assert machine_price("n2-standard-8", MachineShape(0, 0.0), rates) is None
    zero = Rates({"core": {"n2": 0.0}, "ram": {"n2": 0.0}, "gpu": {}}, rates.on_demand)
    assert machine_price("n2-standard-8", MachineShape(8, 32.0), zero) is None
    free = rates_from_skus(
        [
            {
                "description": "N2 Instance Core running in Americas",
                "category": {"usageType": "OnDemand"},
                "serviceRegions": ["us-central1"],
                "pricingInfo": [{"pricingExpression": {"tieredRates": [{"unitPrice": {"units": "-1"}}]}}],
            }
        ],
        "us-central1",
    )
    assert free.on_demand["core"] == {}


@pytest.mark.parametrize(
    "shape",
    [
        "not json at all {",
        json.dumps({"fetched": time.time(), "value": {"cpus": "four"}}),
        json.dumps({"fetched": time.time(), "value": {"cpus": 0, "memory_gb": 0, "gpus": []}}),
        json.dumps({"fetched": time.time(), "value": [1, 2]}),
    ],
    ids=["not-json", "bad-field", "zero-shape", "wrong-type"],
)
def test_a_corrupt_machine_shape_cache_falls_back_to_the_table(shape: str) -> None:
    """The machine shape is cached for a month: a corrupt entry must cost a fetch or the
    table, never an exception out of `prices` (an allocation asks it) or a $0 machine."""
    cache = spotnb_home() / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "gcp-machine-g2-standard-4.json").write_text(shape)
    price = _provider(FakeCatalog(), FakeMachineTypes()).prices("g2-standard-4")["us-central1-a"]
    assert price.spot > 0 and price.on_demand > 0
    if "Cloud Billing catalog" in price.source:  # fetched again: the real shape
        assert price.spot == pytest.approx(4 * 0.008746 + 16 * 0.001025 + 0.196)
    else:
        assert _table_price(price)


def test_a_catalog_cache_from_the_future_or_corrupt_is_fetched_again() -> None:
    cache = spotnb_home() / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    for body in (
        json.dumps({"fetched": time.time() + 10 * 86400, "value": []}),
        json.dumps({"fetched": time.time(), "value": {"not": "a list"}}),
        "\x00\x01garbage",
    ):
        (cache / "gcp-catalog-skus.json").write_text(body)
        catalog = FakeCatalog()
        price = _provider(catalog, FakeMachineTypes()).prices("g2-standard-4")["us-central1-a"]
        assert price.spot > 0 and price.on_demand > 0
        assert "Cloud Billing catalog" in price.source or _table_price(price), body


def test_the_page_bound_is_an_error_not_a_partial_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    """A catalog that keeps paging with new tokens past the bound is a failed read: a
    partial SKU list cached for a day would leave families unpriced or priced from a subset."""
    n = {"i": 0}

    class Endless(FakeCatalog):
        def get(self, url: str, params: dict[str, Any], timeout: float) -> Any:
            n["i"] += 1
            page = {"skus": [], "nextPageToken": f"t{n['i']}"}
            return SimpleNamespace(raise_for_status=lambda: None, json=lambda: page)

    with pytest.raises(ValueError, match="pages"):
        catalog_skus(Endless())


def test_the_cache_file_path_is_the_one_the_price_cache_writes() -> None:
    """Sanity of the corrupt-cache tests above: they overwrite the files the cache reads."""
    _provider(FakeCatalog(), FakeMachineTypes()).prices("g2-standard-4")
    names = sorted(p.name for p in Path(spotnb_home() / "cache").iterdir())
    assert "gcp-catalog-skus.json" in names and "gcp-machine-g2-standard-4.json" in names
