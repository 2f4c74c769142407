"""AWS on-demand collector and Price List parser: a hand-written GetProducts fixture in the API's wire
format, fed through botocore's Stubber and through a loopback HTTP endpoint (moto has no Price List
API)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from botocore.stub import Stubber

from costopt.domain import Cloud, InstanceType, Market, OfferKey
from costopt.errors import MalformedInput, SourceUnavailable
from costopt.settings import Settings
from pricing.aws import PRICE_LIST_REGION, AwsOnDemandSource
from pricing.aws_pages import parse_price_list_page
from tests.aws_support import fake_session
from tests.net_support import LoopbackServer, closed_port_url

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "aws" / "price_list_p3.json"
NOW = datetime(2025, 1, 15, 6, 0, tzinfo=UTC)
EFFECTIVE = datetime(2024, 11, 1, tzinfo=UTC)


def fixture_pages() -> dict[str, list[dict[str, Any]]]:
    pages: dict[str, list[dict[str, Any]]] = json.loads(FIXTURE.read_text())["pages"]
    return pages


class LoudHistory:
    """The on-demand collector re-reads list prices whole: asking the store anything is a bug."""

    def last_change(self, cloud: Cloud, **kwargs: Any) -> datetime | None:
        raise AssertionError(f"on-demand collector asked the store last_change({cloud!r}, {kwargs!r})")


class StubbedPricing:
    """A stubbed pricing client; records which region the collector created it for."""

    def __init__(self) -> None:
        self.client = fake_session().client("pricing", region_name=PRICE_LIST_REGION)
        self.stub = Stubber(self.client)
        self.stub.activate()
        self.regions_asked: list[str] = []

    def __call__(self, region: str) -> Any:
        self.regions_asked.append(region)
        return self.client

    def serve(self, instance_type: str, pages: Sequence[dict[str, Any]]) -> None:
        expected: dict[str, Any] = {
            "ServiceCode": "AmazonEC2",
            "FormatVersion": "aws_v1",
            "Filters": AwsOnDemandSource.filters(instance_type),
            "MaxResults": 100,
        }
        token: str | None = None
        for page in pages:
            self.stub.add_response("get_products", page, dict(expected, NextToken=token) if token else expected)
            token = page.get("NextToken") or None


def source(factory: Any, types: Sequence[str] = ("p3.2xlarge", "p2.xlarge"), **kw: Any) -> AwsOnDemandSource:
    return AwsOnDemandSource(types, client_factory=factory, clock=lambda: NOW, **kw)


def fetch_fixture(**kw: Any) -> tuple[Any, StubbedPricing]:
    pricing = StubbedPricing()
    pages = fixture_pages()
    pricing.serve("p3.2xlarge", pages["p3.2xlarge"])
    pricing.serve("p2.xlarge", pages["p2.xlarge"])
    result = source(pricing, **kw).fetch(LoudHistory())
    pricing.stub.assert_no_pending_responses()
    return result, pricing


def price(result: Any, region: str, instance_type: str) -> list[float]:
    key = OfferKey(Cloud.AWS, region, "", instance_type, Market.ON_DEMAND)
    return [p.usd_per_hour for p in result.points if p.key == key]


# --------------------------------------------------------------------------- the collector (Stubber)


def test_hourly_usd_list_prices_become_regional_on_demand_points() -> None:
    result, _ = fetch_fixture()

    assert price(result, "us-east-1", "p3.2xlarge") == [3.06]
    assert price(result, "us-east-1", "p2.xlarge") == [0.90]
    assert price(result, "eu-west-1", "p3.2xlarge") == [3.305]
    assert all(p.key.zone == "" and p.key.market is Market.ON_DEMAND for p in result.points)
    assert all(p.observed_at == NOW and p.source == "aws-on-demand" for p in result.points)
    assert (result.partial, result.errors) == (False, [])


def test_the_price_list_is_asked_in_us_east_1_for_shared_linux_on_demand_capacity() -> None:
    _, pricing = fetch_fixture()

    assert pricing.regions_asked == ["us-east-1"]
    sent = {f["Field"]: (f["Type"], f["Value"]) for f in AwsOnDemandSource.filters("p3.2xlarge")}
    assert sent == {
        "operatingSystem": ("TERM_MATCH", "Linux"),
        "tenancy": ("TERM_MATCH", "Shared"),
        "preInstalledSw": ("TERM_MATCH", "NA"),
        "capacitystatus": ("TERM_MATCH", "Used"),
        "instanceType": ("TERM_MATCH", "p3.2xlarge"),
    }


def test_pages_are_followed_through_next_token() -> None:
    result, _ = fetch_fixture()

    assert result.pages == 3  # p3.2xlarge: 2 pages, p2.xlarge: 1 page
    assert {p.key.region for p in result.points} == {"us-east-1", "eu-west-1", "us-west-2"}


def test_valid_from_is_the_terms_effective_date_in_utc_even_with_an_offset() -> None:
    result, _ = fetch_fixture()

    assert {p.valid_from for p in result.points} == {EFFECTIVE}
    assert all(p.valid_from.tzinfo is UTC for p in result.points)


def test_a_zero_price_means_not_offered_and_is_skipped_not_counted_bad() -> None:
    result, _ = fetch_fixture()

    assert price(result, "ap-northeast-3", "p3.2xlarge") == []
    assert result.skipped == 2  # ap-northeast-3 at $0.00 and the Los Angeles Local Zone


def test_a_non_numeric_price_is_a_bad_record_and_the_rest_are_kept() -> None:
    result, _ = fetch_fixture()

    assert result.bad_records == 1
    assert price(result, "sa-east-1", "p3.2xlarge") == []
    assert "pricePerUnit.USD is not a number: 'N/A'" in result.reasons[0]
    assert result.reasons[0].startswith("p3.2xlarge page 2 product 1 (p3.2xlarge)")
    assert len(result.points) == 4


def test_a_product_without_region_code_is_placed_by_its_location_name() -> None:
    result, _ = fetch_fixture()

    assert price(result, "us-west-2", "p3.2xlarge") == [3.06]


def test_local_zone_products_are_not_taken_for_their_parent_region() -> None:
    result, _ = fetch_fixture()

    assert not [p for p in result.points if "lax" in p.key.region]
    assert price(result, "us-west-2", "p3.2xlarge") == [3.06]


def test_gpu_shapes_come_from_product_attributes_with_the_family_accelerator() -> None:
    result, _ = fetch_fixture()

    assert sorted(result.instance_types, key=lambda t: t.name) == [
        InstanceType(Cloud.AWS, "p2.xlarge", "k80", 1.0, 4, 61.0, "aws-on-demand"),
        InstanceType(Cloud.AWS, "p3.2xlarge", "v100", 1.0, 8, 61.0, "aws-on-demand"),
    ]


def test_configured_regions_keep_only_their_points() -> None:
    result, _ = fetch_fixture(regions=["us-east-1"])

    assert {p.key.region for p in result.points} == {"us-east-1"}
    assert len(result.points) == 2


def test_one_failing_instance_type_does_not_stop_the_others() -> None:
    pricing = StubbedPricing()
    pricing.stub.add_client_error(
        "get_products", service_error_code="InvalidParameterException", service_message="bad filter"
    )
    pricing.serve("p2.xlarge", fixture_pages()["p2.xlarge"])

    result = source(pricing).fetch(LoudHistory())

    assert result.partial is True
    assert result.errors == ["p3.2xlarge: InvalidParameterException: bad filter"]
    assert price(result, "us-east-1", "p2.xlarge") == [0.90]


def test_when_no_page_can_be_fetched_the_source_is_unavailable() -> None:
    pricing = StubbedPricing()
    for _ in range(2):
        pricing.stub.add_client_error(
            "get_products",
            service_error_code="AccessDeniedException",
            service_message="not allowed",
            http_status_code=403,
        )

    with pytest.raises(SourceUnavailable, match=r"AccessDeniedException.*IAM.*pricing:GetProducts"):
        source(pricing).fetch(LoudHistory())


# --------------------------------------------------------------------------- over HTTP on loopback


class PriceListEndpoint:
    """A loopback Price List endpoint answering scripted (status, JSON body) pairs; records requests."""

    def __init__(self, answers: Sequence[tuple[int, dict[str, Any]]]) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[str, dict[str, Any]]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                owner.requests.append((self.headers.get("X-Amz-Target", ""), body))
                status, answer = owner.answers.pop(0)
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.http = LoopbackServer(Handler, poll_interval=0.05)
        self.url = self.http.url

    def close(self) -> None:
        self.http.close()


@pytest.fixture
def endpoints() -> Iterator[list[PriceListEndpoint]]:
    made: list[PriceListEndpoint] = []
    yield made
    for ep in made:
        ep.close()


THROTTLED = (400, {"__type": "ThrottlingException", "message": "Rate exceeded"})


def test_a_throttled_call_is_retried_and_pages_follow_over_http(endpoints: list[PriceListEndpoint]) -> None:
    p3 = fixture_pages()["p3.2xlarge"]
    ep = PriceListEndpoint([THROTTLED, (200, p3[0]), (503, {"__type": "ServiceUnavailable"}), (200, p3[1])])
    endpoints.append(ep)
    collector = AwsOnDemandSource(
        ["p3.2xlarge"], session=fake_session(), endpoint_url=ep.url, max_attempts=3, clock=lambda: NOW
    )

    result = collector.fetch(LoudHistory())

    assert (result.partial, result.errors) == (False, [])
    assert price(result, "us-east-1", "p3.2xlarge") == [3.06]
    assert len(ep.requests) == 4
    target, first = ep.requests[0]
    assert target == "AWSPriceListService.GetProducts"
    assert first["ServiceCode"] == "AmazonEC2"
    assert first["FormatVersion"] == "aws_v1"
    assert {"Type": "TERM_MATCH", "Field": "instanceType", "Value": "p3.2xlarge"} in first["Filters"]
    assert "NextToken" not in first
    assert ep.requests[3][1]["NextToken"] == "p3-page-2"


def test_an_unreachable_price_list_stops_at_once_and_makes_the_source_unavailable() -> None:
    closed = closed_port_url()
    collector = AwsOnDemandSource(
        ["p3.2xlarge", "p2.xlarge", "g5.xlarge"],
        session=fake_session(),
        endpoint_url=closed,
        connect_timeout=1.0,
        max_attempts=1,
        clock=lambda: NOW,
    )

    with pytest.raises(SourceUnavailable) as info:
        collector.fetch(LoudHistory())

    message = str(info.value)
    assert "p3.2xlarge: EndpointConnectionError" in message
    assert "p2.xlarge" not in message  # every further call would fail the same way
    assert "api.pricing.us-east-1.amazonaws.com" in message


# --------------------------------------------------------------------------- the parser


def test_a_page_that_is_not_a_price_list_is_malformed() -> None:
    with pytest.raises(MalformedInput, match="not a Price List GetProducts page"):
        parse_price_list_page({"Products": []}, where="test page")
    with pytest.raises(MalformedInput):
        parse_price_list_page(["not", "a", "page"])


def test_records_that_are_not_json_or_lack_fields_are_bad_and_counted() -> None:
    good = fixture_pages()["p2.xlarge"][0]["PriceList"][0]
    no_type = json.loads(good)
    del no_type["product"]["attributes"]["instanceType"]
    no_date = json.loads(good)
    for term in no_date["terms"]["OnDemand"].values():
        del term["effectiveDate"]
    bad_date = json.loads(good)
    for term in bad_date["terms"]["OnDemand"].values():
        term["effectiveDate"] = "01/11/2024"
    negative = json.loads(good)
    for term in negative["terms"]["OnDemand"].values():
        for dim in term["priceDimensions"].values():
            dim["pricePerUnit"]["USD"] = "-0.9"
    unknown_place = json.loads(good)
    del unknown_place["product"]["attributes"]["regionCode"]
    unknown_place["product"]["attributes"]["location"] = "Moon (Tranquility Base)"
    page = {
        "FormatVersion": "aws_v1",
        "PriceList": [
            good,
            "{truncated",
            *(json.dumps(r) for r in (no_type, no_date, bad_date, negative, unknown_place)),
        ],
    }

    parsed = parse_price_list_page(page, observed_at=NOW)

    assert len(parsed.points) == 1
    assert parsed.problems.bad == 6
    reasons = " | ".join(parsed.problems.reasons)
    for why in ("not JSON", "no instanceType", "no effectiveDate", "unknown timestamp format", "negative price",
                "unknown location"):  # fmt: skip
        assert why in reasons
    assert parsed.next_token is None


def test_reserved_only_products_are_skipped() -> None:
    rec = json.loads(fixture_pages()["p2.xlarge"][0]["PriceList"][0])
    rec["terms"] = {"Reserved": copy.deepcopy(rec["terms"]["OnDemand"])}

    parsed = parse_price_list_page({"PriceList": [json.dumps(rec)], "NextToken": "more"})

    assert (parsed.points, parsed.problems.skipped, parsed.problems.bad) == ([], 1, 0)
    assert parsed.next_token == "more"


def test_a_gpu_model_attribute_wins_over_the_family_table() -> None:
    rec = json.loads(fixture_pages()["p2.xlarge"][0]["PriceList"][0])
    rec["product"]["attributes"]["physicalGpu"] = "NVIDIA Tesla K80"
    rec["product"]["attributes"]["instanceType"] = "zz9.xlarge"  # a family costopt does not know

    parsed = parse_price_list_page({"PriceList": [json.dumps(rec)]})

    assert [t.accelerator for t in parsed.instance_types] == ["k80"]


def test_capacity_block_products_are_not_taken_for_on_demand_prices() -> None:
    rec = json.loads(fixture_pages()["p2.xlarge"][0]["PriceList"][0])
    rec["product"]["attributes"]["marketoption"] = "CapacityBlock"
    on_demand = json.loads(fixture_pages()["p2.xlarge"][0]["PriceList"][0])
    on_demand["product"]["attributes"]["marketoption"] = "OnDemand"

    parsed = parse_price_list_page({"PriceList": [json.dumps(rec), json.dumps(on_demand)]})

    assert [p.usd_per_hour for p in parsed.points] == [0.90]
    assert (parsed.problems.skipped, parsed.problems.bad) == (1, 0)


def test_settings_give_the_regions_kept_and_the_endpoint(endpoints: list[PriceListEndpoint]) -> None:
    ep = PriceListEndpoint([(200, page) for page in fixture_pages()["p3.2xlarge"]])
    endpoints.append(ep)
    settings = Settings(aws_regions=["eu-west-1"], aws_endpoint_url=ep.url)
    collector = AwsOnDemandSource.from_settings(
        settings, instance_types=["p3.2xlarge"], session=fake_session(), clock=lambda: NOW
    )

    result = collector.fetch(LoudHistory())

    assert [(p.key.region, p.usd_per_hour) for p in result.points] == [("eu-west-1", 3.305)]
