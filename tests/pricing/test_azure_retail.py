"""Azure Retail Prices collector against a local fake of the API (real httpx client, loopback only)."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from costopt.domain import Cloud, Market, OfferKey
from costopt.errors import MalformedInput, SourceUnavailable
from costopt.settings import Settings
from pricing.azure import (
    AZURE_GPU_SIZES,
    RETAIL_API_VERSION,
    AzureRetailPriceSource,
    parse_retail_item,
    parse_retail_page,
    retail_filter,
)
from tests.net_support import LoopbackServer, free_port

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "azure"
REAL_PREFIX = "https://prices.azure.com:443/api/retail/prices"
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def load_page(n: int) -> dict[str, Any]:
    page: dict[str, Any] = json.loads((FIXTURES / f"retail_prices_page{n}.json").read_text())
    return page


@dataclass
class Fault:
    """One scripted answer served instead of the page (then the queue moves on)."""

    status: int = 503
    headers: dict[str, str] = field(default_factory=dict)
    body: str = '{"error": "scripted"}'
    delay_s: float = 0.0


class FakeRetailPrices:
    """The Retail Prices API on 127.0.0.1: serves the fixture pages by ``$skip`` and rewrites their
    ``NextPageLink`` to point at itself; ``faults[skip]`` answers are served first, in order."""

    def __init__(self, pages: list[dict[str, Any]]) -> None:
        self.pages = pages
        self.faults: dict[int, list[Fault]] = {}
        self.requests: list[dict[str, list[str]]] = []
        self.raw_paths: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                fake.requests.append(query)
                fake.raw_paths.append(self.path)
                skip = int(query.get("$skip", ["0"])[0])
                queue = fake.faults.get(skip)
                if queue:
                    fault = queue.pop(0)
                    time.sleep(fault.delay_s)
                    self._send(fault.status, fault.body.encode(), fault.headers)
                    return
                if parts.path != "/api/retail/prices" or skip // 100 >= len(fake.pages):
                    self._send(404, b'{"error": "no such page"}', {})
                    return
                page = dict(fake.pages[skip // 100])
                if page.get("NextPageLink"):
                    page["NextPageLink"] = page["NextPageLink"].replace(REAL_PREFIX, fake.url)
                self._send(200, json.dumps(page).encode(), {})

            def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json; charset=utf-8")
                    self.send_header("Content-Length", str(len(body)))
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = LoopbackServer(Handler)
        self.url = f"{self.http.url}/api/retail/prices"

    def __enter__(self) -> FakeRetailPrices:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()


@pytest.fixture
def fake() -> Iterator[FakeRetailPrices]:
    with FakeRetailPrices([load_page(1), load_page(2), load_page(3)]) as server:
        yield server


class Sleeps(list[float]):
    """An injectable sleep that records instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def source(url: str, sleeps: Sleeps | None = None, **kw: Any) -> AzureRetailPriceSource:
    return AzureRetailPriceSource(
        base_url=url, sleep=sleeps if sleeps is not None else Sleeps(), clock=lambda: NOW, **kw
    )


def by_key(points: list[Any]) -> dict[tuple[str, str, Market], float]:
    return {(p.key.region, p.key.instance_type, p.key.market): p.usd_per_hour for p in points}


# --- the full run over three pages ---------------------------------------------------------------


def test_fetch_follows_next_page_link_until_the_empty_link_of_the_last_page(fake):
    result = source(fake.url).fetch()
    assert result.pages == 3
    assert not result.partial
    assert result.errors == []
    assert [q.get("$skip") for q in fake.requests] == [None, ["100"], ["200"]]


def test_first_request_asks_for_gpu_vm_consumption_prices_of_the_preview_api_version(fake):
    source(fake.url, regions=["eastus", "westus2"]).fetch()
    first = fake.requests[0]
    assert first["api-version"] == [RETAIL_API_VERSION]
    flt = first["$filter"][0]
    assert "serviceName eq 'Virtual Machines'" in flt
    assert "priceType eq 'Consumption'" in flt
    for family in ("Standard_NC", "Standard_ND", "ads_A10_v5"):
        assert f"contains(armSkuName, '{family}')" in flt
    assert "(armRegionName eq 'eastus' or armRegionName eq 'westus2')" in flt
    assert first["meterRegion"] == ["'primary'"]
    # spelled like the documented examples: a literal $filter, spaces as %20
    assert "&$filter=serviceName%20eq%20'Virtual%20Machines'%20and%20" in fake.raw_paths[0]


def test_linux_spot_and_pay_as_you_go_prices_become_regional_price_points(fake):
    result = source(fake.url).fetch()
    prices = by_key(result.points)
    assert prices == {
        ("eastus", "Standard_NC6s_v3", Market.ON_DEMAND): 3.06,
        ("eastus", "Standard_NC6s_v3", Market.SPOT): 0.3672,
        ("eastus", "Standard_NC4as_T4_v3", Market.ON_DEMAND): 0.526,
        ("eastus", "Standard_NC4as_T4_v3", Market.SPOT): 0.0526,
        ("westus2", "Standard_NC24ads_A100_v4", Market.ON_DEMAND): 3.673,
        ("westus2", "Standard_NC24ads_A100_v4", Market.SPOT): 0.7346,
        ("southcentralus", "Standard_ND96asr_v4", Market.ON_DEMAND): 27.197,
        ("eastus", "Standard_NV36ads_A10_v5", Market.ON_DEMAND): 3.2,
        ("eastus", "Standard_NV6ads_A10_v5", Market.SPOT): 0.0908,
        ("eastus", "Standard_ND96isr_H100_v5", Market.ON_DEMAND): 98.32,
        ("eastus", "Standard_ND96isr_H100_v5", Market.SPOT): 39.328,
    }
    h100_spot = OfferKey(Cloud.AZURE, "eastus", "", "Standard_ND96isr_H100_v5", Market.SPOT)
    spot = next(p for p in result.points if p.key == h100_spot)
    assert spot.valid_from == datetime(2025, 4, 1, 12, 30, tzinfo=UTC)
    assert spot.source == "azure"
    assert spot.observed_at == NOW


def test_windows_low_priority_zero_price_and_unknown_sizes_are_skipped_and_counted(fake, caplog):
    with caplog.at_level(logging.INFO, logger="costopt.pricing.azure"):
        result = source(fake.url).fetch()
    # page 1: Low Priority + 2 Windows; page 2: unknown Standard_ND6s + retailPrice 0
    assert result.skipped == 5
    assert "Standard_ND6s" in caplog.text
    assert not any(p.key.instance_type == "Standard_ND6s" for p in result.points)


def test_bad_records_are_counted_with_reasons_and_the_rest_of_the_page_kept(fake):
    result = source(fake.url).fetch()
    assert result.bad_records == 3
    reasons = "\n".join(result.reasons)
    assert "page 2 item 3: retailPrice is not a number: 'n/a'" in reasons
    assert "page 2 item 4: unknown timestamp format: '15/09/2017'" in reasons
    assert "page 3 item 4: missing field armRegionName" in reasons
    assert ("westus2", "Standard_NC24ads_A100_v4", Market.SPOT) in by_key(result.points)


def test_instance_types_come_from_the_size_table_for_the_sizes_seen(fake):
    result = source(fake.url).fetch()
    types = {t.name: t for t in result.instance_types}
    assert set(types) == {p.key.instance_type for p in result.points}
    assert len(result.instance_types) == len(types)
    assert types["Standard_NC6s_v3"].accelerator == "v100"
    assert types["Standard_NC6s_v3"].gpu_count == 1
    assert types["Standard_NC6s_v3"].vcpus == 6
    assert types["Standard_NC6s_v3"].memory_gib == 112
    assert types["Standard_ND96isr_H100_v5"].gpu_count == 8
    assert math.isclose(types["Standard_NV6ads_A10_v5"].gpu_count, 1 / 6)
    assert all(t.cloud is Cloud.AZURE for t in result.instance_types)


def test_from_settings_uses_the_configured_url_regions_and_timeout(fake):
    settings = Settings(azure_retail_prices_url=fake.url, azure_regions=["westus2"], http_timeout_s=5.0)
    src = AzureRetailPriceSource.from_settings(settings, sleep=Sleeps())
    assert (src.base_url, src.regions, src.timeout_s) == (fake.url, ["westus2"], 5.0)
    assert src.fetch().pages == 3


# --- retries ------------------------------------------------------------------------------------


def test_429_with_retry_after_is_retried_after_the_advised_delay(fake):
    fake.faults[0] = [Fault(429, {"Retry-After": "7"})]
    sleeps = Sleeps()
    result = source(fake.url, sleeps).fetch()
    assert sleeps == [7.0]
    assert result.pages == 3
    assert not result.partial


def test_retry_after_is_bounded_by_max_backoff(fake):
    fake.faults[100] = [Fault(429, {"Retry-After": "3600"})]
    sleeps = Sleeps()
    result = source(fake.url, sleeps, max_backoff_s=30).fetch()
    assert sleeps == [30]
    assert not result.partial


def test_retry_after_as_an_http_date_is_honoured(fake):
    fake.faults[0] = [Fault(429, {"Retry-After": "Sun, 01 Jun 2025 12:00:12 GMT"})]
    sleeps = Sleeps()
    source(fake.url, sleeps).fetch()
    assert sleeps == [12.0]


def test_503_is_retried_with_exponential_backoff(fake):
    fake.faults[100] = [Fault(503), Fault(502), Fault(500)]
    sleeps = Sleeps()
    result = source(fake.url, sleeps, backoff_s=0.5).fetch()
    assert sleeps == [0.5, 1.0, 2.0]
    assert result.pages == 3
    assert not result.partial


def test_a_timeout_is_retried(fake):
    fake.faults[0] = [Fault(200, delay_s=1.0, body=json.dumps(load_page(1)))]
    sleeps = Sleeps()
    result = source(fake.url, sleeps, timeout_s=0.2).fetch()
    assert len(sleeps) == 1
    assert result.pages == 3


def test_client_errors_other_than_429_are_not_retried(fake):
    fake.faults[0] = [Fault(400, body='{"Error": "Invalid OData filter"}')]
    sleeps = Sleeps()
    with pytest.raises(SourceUnavailable, match="HTTP 400"):
        source(fake.url, sleeps).fetch()
    assert sleeps == []


# --- partial runs and unavailability ------------------------------------------------------------


def test_page_2_failing_after_all_retries_keeps_page_1_points_and_marks_the_run_partial(fake):
    fake.faults[100] = [Fault(503)] * 4
    sleeps = Sleeps()
    result = source(fake.url, sleeps, max_attempts=4).fetch()
    assert result.partial
    assert result.pages == 1
    assert len(sleeps) == 3
    assert ("eastus", "Standard_NC6s_v3", Market.SPOT) in by_key(result.points)
    assert len(result.points) == 4
    assert "page 2: HTTP 503" in result.errors[0]
    assert "gave up after 4 attempts" in result.errors[0]


def test_a_malformed_page_stops_the_run_as_partial(fake):
    fake.faults[100] = [Fault(200, body='{"items": "not the shape"}')]
    result = source(fake.url).fetch()
    assert result.partial
    assert result.pages == 1
    assert "page 2: not an Azure Retail Prices page" in result.errors[0]


def test_a_page_that_is_not_json_stops_the_run_as_partial(fake):
    fake.faults[200] = [Fault(200, body="<html>gateway</html>")]
    result = source(fake.url).fetch()
    assert result.partial
    assert result.pages == 2
    assert "page 3: response is not JSON" in result.errors[0]


def test_a_malformed_first_page_means_the_source_is_unavailable(fake):
    fake.faults[0] = [Fault(200, body="[]")]
    with pytest.raises(SourceUnavailable, match="no usable page"):
        source(fake.url).fetch()


def test_a_next_page_link_that_loops_back_stops_as_partial(fake):
    looping = load_page(1)
    looping["NextPageLink"] = REAL_PREFIX + "?$skip=0"
    fake.pages[0] = looping
    result = source(fake.url).fetch()
    assert result.partial
    assert "repeats an earlier page" in result.errors[0]
    assert result.pages == 2


def test_server_down_raises_source_unavailable_saying_what_to_check():
    sleeps = Sleeps()
    url = f"http://127.0.0.1:{free_port()}/api/retail/prices"
    with pytest.raises(SourceUnavailable) as info:
        source(url, sleeps, max_attempts=3).fetch()
    message = str(info.value)
    assert "connection failed" in message
    assert "COSTOPT_AZURE_RETAIL_PRICES_URL" in message
    assert len(sleeps) == 2


def test_an_injected_client_is_used_and_left_open(fake):
    import httpx

    with httpx.Client() as client:
        source(fake.url, client=client).fetch()
        assert not client.is_closed


# --- the pure page parser -----------------------------------------------------------------------


def good_item(**over: Any) -> dict[str, Any]:
    item = dict(load_page(1)["Items"][1])  # NC6s v3 Spot, eastus
    item.update(over)
    return item


def test_parse_retail_page_parses_a_recorded_page_without_network():
    page = parse_retail_page(load_page(3), source="azure", observed_at=NOW, where="page 3")
    assert len(page.points) == 4
    assert page.problems.bad == 1
    assert page.next_token is None
    assert {t.name for t in page.instance_types} == {
        "Standard_NV36ads_A10_v5",
        "Standard_NV6ads_A10_v5",
        "Standard_ND96isr_H100_v5",
    }


def test_parse_retail_page_returns_the_next_page_link_as_token():
    page = parse_retail_page(load_page(1), source="azure", observed_at=NOW, where="p1")
    assert page.next_token is not None
    assert page.next_token.startswith(REAL_PREFIX)
    assert page.next_token.endswith("$skip=100")


@pytest.mark.parametrize("page", [None, [], {"Items": None}, {"items": []}, "Items"])
def test_a_page_without_an_items_list_is_malformed_input(page):
    with pytest.raises(MalformedInput, match="no Items list"):
        parse_retail_page(page, source="azure", observed_at=NOW, where="recorded")


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({"retailPrice": float("nan")}, "not a number"),
        ({"retailPrice": -1.0}, "negative price"),
        ({"retailPrice": "0.3"}, "retailPrice is not a number"),
        ({"retailPrice": True}, "retailPrice is not a number"),
        ({"retailPrice": 5000.0}, "absurd price"),
        ({"currencyCode": "EUR"}, "currencyCode 'EUR' is not USD"),
        ({"unitOfMeasure": "1/Month"}, "is not '1 Hour'"),
        ({"effectiveStartDate": "yesterday"}, "unknown timestamp format"),
        ({"armSkuName": None}, "missing field armSkuName"),
        ({"skuName": ""}, "missing field skuName"),
    ],
)
def test_invalid_items_are_bad_records_with_a_clear_reason(over, reason):
    page = parse_retail_page({"Items": [good_item(**over), good_item()]}, source="azure", where="p")
    assert page.problems.bad == 1
    assert reason in page.problems.reasons[0]
    assert page.problems.reasons[0].startswith("p item 0: ")
    assert len(page.points) == 1


def test_a_non_object_item_is_a_bad_record():
    page = parse_retail_page({"Items": ["oops"]}, source="azure", where="p")
    assert page.problems.bad == 1


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({"productName": "Virtual Machines NCSv3 Series Windows"}, "Windows"),
        ({"skuName": "NC6s v3 Low Priority"}, "Low Priority"),
        ({"type": "DevTestConsumption"}, "not Consumption"),
        ({"isPrimaryMeterRegion": False}, "primary meter region"),
        ({"retailPrice": 0}, "not offered"),
        ({"armSkuName": "Standard_NV16as_v4"}, "unknown instance type Standard_NV16as_v4"),
    ],
)
def test_items_that_are_not_linux_gpu_offers_are_skipped_not_bad(over, why):
    result = parse_retail_item(good_item(**over), source="azure")
    assert isinstance(result, str)
    assert why in result


def test_spot_market_comes_from_the_sku_name_suffix_and_sizes_are_canonicalised():
    spot = parse_retail_item(good_item(armSkuName="standard_nc6s_v3"), source="azure")
    regular = parse_retail_item(good_item(skuName="NC6s v3"), source="azure")
    assert not isinstance(spot, str)
    assert not isinstance(regular, str)
    assert spot.key.market is Market.SPOT
    assert spot.key.instance_type == "Standard_NC6s_v3"
    assert regular.key.market is Market.ON_DEMAND


def test_retail_filter_without_regions_has_no_region_clause():
    assert "armRegionName" not in retail_filter()


def test_the_size_table_holds_only_known_accelerators_and_positive_shapes():
    from costopt.domain import KNOWN_ACCELERATORS

    for name, size in AZURE_GPU_SIZES.items():
        assert name.startswith("Standard_")
        assert size.accelerator in KNOWN_ACCELERATORS, name
        assert size.gpu_count > 0, name
        assert size.vcpus > 0, name
        assert size.memory_gib > 0, name
