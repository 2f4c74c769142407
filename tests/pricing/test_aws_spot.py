"""AWS spot collector: moto's EC2 server on loopback for regions, endpoints, failures and retries;
botocore's Stubber replaying the real recorded ``describe-spot-price-history`` pages of
../shared/data (moto's spot history is a constant fake)."""

from __future__ import annotations

import copy
import http.client
import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from botocore.stub import Stubber

from costopt.aws_clients import aws_client_config, boto3_client_factory
from costopt.domain import Cloud, Market, OfferKey
from costopt.errors import SourceUnavailable
from costopt.settings import Settings
from pricing.aws import AWS_GPU_FAMILIES, AWS_GPU_INSTANCE_TYPES, SPOT_LOOKBACK, AwsSpotSource
from pricing.aws_pages import ACCELERATOR_BY_FAMILY, family_of
from tests.aws_support import fake_session
from tests.net_support import LoopbackServer, closed_port_url

NOW = datetime(2020, 3, 24, tzinfo=UTC)
"""The fetch time of these tests: just after the last recorded weekly pull (2020-03-23)."""

P3_WEEKS = ("2020-02-27", "2020-03-05", "2020-03-13", "2020-03-23")


# --------------------------------------------------------------------------- environment


# --------------------------------------------------------------------------- fakes


@dataclass
class StrictHistory:
    """A PriceHistoryView that answers only the questions the spot collector should ask."""

    last: dict[str, datetime | None]
    instance_types: Sequence[str] = AWS_GPU_INSTANCE_TYPES
    asked: list[str] = field(default_factory=list)

    def last_change(
        self,
        cloud: Cloud,
        *,
        region: str | None = None,
        market: Market | None = None,
        instance_types: Sequence[str] | None = None,
    ) -> datetime | None:
        assert cloud is Cloud.AWS, f"unexpected cloud {cloud!r}"
        assert market is Market.SPOT, f"unexpected market {market!r}"
        assert region in self.last, f"unexpected region {region!r}"
        assert instance_types is not None, "the collector should name the instance types it polls"
        assert tuple(instance_types) == tuple(self.instance_types), f"unexpected instance types {instance_types!r}"
        self.asked.append(region)
        return self.last[region]


def nothing_stored(*regions: str, instance_types: Sequence[str] = AWS_GPU_INSTANCE_TYPES) -> StrictHistory:
    return StrictHistory(dict.fromkeys(regions), instance_types)


class StubbedEc2:
    """One stubbed EC2 client per region, handed to the collector as its client factory."""

    def __init__(self) -> None:
        self.session = fake_session()
        self.clients: dict[str, Any] = {}
        self.stubs: dict[str, Stubber] = {}

    def stub(self, region: str) -> Stubber:
        if region not in self.stubs:
            client = self.session.client("ec2", region_name=region)
            self.clients[region] = client
            self.stubs[region] = Stubber(client)
            self.stubs[region].activate()
        return self.stubs[region]

    def __call__(self, region: str) -> Any:
        return self.clients[region]

    def serve(self, region: str, pages: Sequence[dict[str, Any]], expected: dict[str, Any]) -> None:
        """Queue ``pages`` as successive answers, each request checked against ``expected`` (+NextToken)."""
        stub = self.stub(region)
        token: str | None = None
        for page in pages:
            params = dict(expected, NextToken=token) if token else dict(expected)
            stub.add_response("describe_spot_price_history", page, params)
            token = page.get("NextToken") or None

    def verify(self) -> None:
        for stub in self.stubs.values():
            stub.assert_no_pending_responses()


def expected_request(start: datetime, instance_types: Sequence[str] = AWS_GPU_INSTANCE_TYPES) -> dict[str, Any]:
    return {
        "InstanceTypes": list(instance_types),
        "ProductDescriptions": ["Linux/UNIX"],
        "StartTime": start,
        "MaxResults": 1000,
    }


def recorded(shared_data: Path, region: str, name: str) -> dict[str, Any]:
    path = shared_data / "raw" / "training_on_a_dime" / "logs" / "aws" / "cost" / region / f"{name}.json"
    page: dict[str, Any] = json.loads(path.read_text())
    return page


def chained(pages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``pages`` linked by NextToken (the last one ends the listing with "")."""
    out = [copy.deepcopy(p) for p in pages]
    for i, page in enumerate(out):
        page["NextToken"] = f"page-{i + 2}" if i + 1 < len(out) else ""
    return out


def weekly_p3_pages(shared_data: Path) -> list[dict[str, Any]]:
    return chained([recorded(shared_data, "us-east-1", f"{week}.p3.2xlarge") for week in P3_WEEKS])


def spot_source(factory: Any, regions: Sequence[str], **kw: Any) -> AwsSpotSource:
    return AwsSpotSource(regions, client_factory=factory, clock=lambda: NOW, **kw)


# --------------------------------------------------------------------------- a scriptable loopback endpoint


class ScriptedEndpoint:
    """A loopback HTTP endpoint: answers from a script of faults, then forwards to ``upstream``.

    A fault ``"hang"`` keeps the request open without answering (until the endpoint is closed).
    """

    def __init__(self, upstream: str | None = None, faults: Sequence[tuple[int, str] | str] = ()) -> None:
        self.faults = list(faults)
        self.requests = 0
        self.upstream = upstream
        self.release = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                owner.requests += 1
                fault = owner.faults.pop(0) if owner.faults else None
                if fault == "hang" or (fault is None and owner.upstream is None):
                    owner.release.wait(10)
                    return
                if isinstance(fault, tuple):
                    status, text = fault
                    self._answer(status, {"Content-Type": "text/xml"}, text.encode())
                    return
                assert owner.upstream is not None
                host, port = owner.upstream.removeprefix("http://").split(":")
                conn = http.client.HTTPConnection(host, int(port), timeout=10)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                conn.request("POST", self.path, body=body, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                passed = {k: v for k, v in resp.getheaders() if k.lower() in ("content-type", "x-amzn-requestid")}
                conn.close()
                self._answer(resp.status, passed, payload)

            def _answer(self, status: int, headers: dict[str, str], payload: bytes) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.http = LoopbackServer(Handler, poll_interval=0.05)
        self.url = self.http.url

    def close(self) -> None:
        self.release.set()
        self.http.close()


@pytest.fixture
def endpoints() -> Iterator[list[ScriptedEndpoint]]:
    made: list[ScriptedEndpoint] = []
    yield made
    for ep in made:
        ep.close()


EC2_UNAVAILABLE = (
    503,
    "<?xml version='1.0' encoding='UTF-8'?><Response><Errors><Error><Code>Unavailable</Code>"
    "<Message>The server is overloaded and can't handle the request.</Message></Error></Errors>"
    "<RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>",
)
EC2_THROTTLED = (
    503,
    "<?xml version='1.0' encoding='UTF-8'?><Response><Errors><Error><Code>RequestLimitExceeded</Code>"
    "<Message>Request limit exceeded.</Message></Error></Errors>"
    "<RequestID>00000000-0000-0000-0000-000000000001</RequestID></Response>",
)
NOT_XML = (200, "<html>proxy error")


def moto_spot_offer_count(moto_url: str, region: str, instance_types: Sequence[str]) -> int:
    """How many zone offerings moto knows for these types in ``region`` (its spot history has one each)."""
    ec2 = fake_session().client("ec2", region_name=region, endpoint_url=moto_url)
    offers = ec2.describe_instance_type_offerings(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": list(instance_types)}]
    )["InstanceTypeOfferings"]
    return len(offers)


# --------------------------------------------------------------------------- defaults and configuration


def test_default_instance_types_cover_every_known_gpu_family_and_nothing_else() -> None:
    families = {family_of(t) for t in AWS_GPU_INSTANCE_TYPES}
    assert families == set(ACCELERATOR_BY_FAMILY) == set(AWS_GPU_FAMILIES)
    assert len(set(AWS_GPU_INSTANCE_TYPES)) == len(AWS_GPU_INSTANCE_TYPES)
    assert {"p3.2xlarge", "p4d.24xlarge", "p5.48xlarge", "g5.xlarge", "g6e.48xlarge", "gr6.8xlarge"} <= set(
        AWS_GPU_INSTANCE_TYPES
    )


def test_clients_use_standard_retries_timeouts_and_the_configured_endpoint() -> None:
    config = aws_client_config(connect_timeout=3.0, read_timeout=7.0, max_attempts=4)
    client = boto3_client_factory("ec2", session=fake_session(), endpoint_url="http://127.0.0.1:9", config=config)(
        "eu-west-1"
    )
    assert client.meta.config.retries == {"mode": "standard", "total_max_attempts": 4}
    assert (client.meta.config.connect_timeout, client.meta.config.read_timeout) == (3.0, 7.0)
    assert client.meta.region_name == "eu-west-1"
    assert client.meta.endpoint_url == "http://127.0.0.1:9"
    assert aws_client_config().retries == {"mode": "standard", "total_max_attempts": 5}


def test_a_source_needs_regions_and_instance_types() -> None:
    with pytest.raises(ValueError, match="region"):
        AwsSpotSource([])
    with pytest.raises(ValueError, match="instance type"):
        AwsSpotSource(["us-east-1"], [])


# --------------------------------------------------------------------------- recorded pages (Stubber)


def test_recorded_weekly_pages_are_followed_through_next_token_and_every_point_kept(shared_data: Path) -> None:
    ec2 = StubbedEc2()
    pages = weekly_p3_pages(shared_data)
    ec2.serve("us-east-1", pages, expected_request(NOW - SPOT_LOOKBACK))

    result = spot_source(ec2, ["us-east-1"]).fetch(nothing_stored("us-east-1"))

    ec2.verify()
    assert result.source == "aws-spot"
    assert result.pages == 4
    assert len(result.points) == sum(len(p["SpotPriceHistory"]) for p in pages) == 112 + 115 + 114 + 166
    assert (result.bad_records, result.skipped, result.partial, result.errors) == (0, 0, False, [])
    key = OfferKey(Cloud.AWS, "us-east-1", "us-east-1b", "p3.2xlarge", Market.SPOT)
    at = datetime(2020, 2, 27, 17, 42, 36, tzinfo=UTC)
    # The weekly pulls overlap, so this record comes twice; the store merges duplicates.
    assert {p.usd_per_hour for p in result.points if p.key == key and p.valid_from == at} == {1.1409}
    assert {p.key.zone for p in result.points} == {"us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f"}
    assert all(p.observed_at == NOW and p.source == "aws-spot" for p in result.points)
    assert all(p.key.market is Market.SPOT and p.key.region == "us-east-1" for p in result.points)


def test_start_time_is_each_regions_last_stored_change_or_the_default_lookback(shared_data: Path) -> None:
    last_us_east = datetime(2020, 3, 13, 15, 1, 7, tzinfo=UTC)
    history = StrictHistory({"us-east-1": last_us_east, "us-west-2": None})
    ec2 = StubbedEc2()
    ec2.serve(
        "us-east-1", [recorded(shared_data, "us-east-1", "2020-03-23.p3.2xlarge")], expected_request(last_us_east)
    )
    ec2.serve(
        "us-west-2",
        [recorded(shared_data, "us-west-2", "2020-03-23.p3.2xlarge")],
        expected_request(NOW - SPOT_LOOKBACK),
    )

    result = spot_source(ec2, ["us-east-1", "us-west-2"]).fetch(history)

    ec2.verify()
    assert history.asked == ["us-east-1", "us-west-2"]
    assert {p.key.region for p in result.points} == {"us-east-1", "us-west-2"}


def test_a_stored_change_in_the_future_does_not_push_the_start_past_now() -> None:
    source = AwsSpotSource(["us-east-1"], client_factory=lambda region: None, clock=lambda: NOW)
    history = StrictHistory({"us-east-1": NOW + timedelta(hours=3)})
    assert source.start_time(history, "us-east-1", NOW) == NOW


def test_boto3_datetime_timestamps_are_read_as_utc(shared_data: Path) -> None:
    page = recorded(shared_data, "us-east-1", "2020-02-27.p3.2xlarge")
    for rec in page["SpotPriceHistory"]:
        rec["Timestamp"] = datetime.fromisoformat(rec["Timestamp"].replace("Z", "+00:00"))
    ec2 = StubbedEc2()
    ec2.serve("us-east-1", [page], expected_request(NOW - SPOT_LOOKBACK))

    result = spot_source(ec2, ["us-east-1"]).fetch(nothing_stored("us-east-1"))

    assert len(result.points) == 112
    assert result.points[0].valid_from == datetime(2020, 2, 27, 17, 42, 36, tzinfo=UTC)


def test_bad_records_are_counted_and_the_good_ones_kept(shared_data: Path) -> None:
    page = recorded(shared_data, "us-east-1", "2020-02-27.p3.2xlarge")
    recs = page["SpotPriceHistory"]
    recs[0]["SpotPrice"] = "not-a-price"
    recs[1]["SpotPrice"] = "-1.0"
    recs[2]["SpotPrice"] = "NaN"
    del recs[3]["AvailabilityZone"]
    recs[4]["Timestamp"] = "Thu Feb 27 17:42:36 2020"
    ec2 = StubbedEc2()
    ec2.serve("us-east-1", [page], expected_request(NOW - SPOT_LOOKBACK))

    result = spot_source(ec2, ["us-east-1"]).fetch(nothing_stored("us-east-1"))

    assert len(result.points) == 112 - 5
    assert result.bad_records == 5
    assert result.partial is False
    reasons = " | ".join(result.reasons)
    for why in ("not a number", "negative", "AvailabilityZone", "unknown timestamp format"):
        assert why in reasons
    assert all(r.startswith("us-east-1 page 1 record ") for r in result.reasons)


def test_duplicates_and_out_of_order_timestamps_are_kept_for_the_store_to_merge(shared_data: Path) -> None:
    first = recorded(shared_data, "us-east-1", "2020-02-27.p3.2xlarge")
    second = copy.deepcopy(first)
    second["SpotPriceHistory"] = list(reversed(second["SpotPriceHistory"])) + second["SpotPriceHistory"][:3]
    ec2 = StubbedEc2()
    ec2.serve("us-east-1", chained([first, second]), expected_request(NOW - SPOT_LOOKBACK))

    result = spot_source(ec2, ["us-east-1"]).fetch(nothing_stored("us-east-1"))

    assert len(result.points) == 112 + 112 + 3
    assert result.bad_records == 0
    assert len({(p.key, p.valid_from) for p in result.points}) == 112


def test_empty_pages_are_not_an_error_and_pagination_goes_on(shared_data: Path) -> None:
    empty_region = recorded(shared_data, "eu-north-1", "2020-03-23.p3.2xlarge")
    assert empty_region["SpotPriceHistory"] == []
    ec2 = StubbedEc2()
    ec2.serve("eu-north-1", [empty_region], expected_request(NOW - SPOT_LOOKBACK))
    first_empty = chained([{"SpotPriceHistory": []}, recorded(shared_data, "us-east-1", "2020-03-23.p3.2xlarge")])
    ec2.serve("us-east-1", first_empty, expected_request(NOW - SPOT_LOOKBACK))

    result = spot_source(ec2, ["eu-north-1", "us-east-1"]).fetch(nothing_stored("eu-north-1", "us-east-1"))

    ec2.verify()
    assert result.pages == 3
    assert len(result.points) == 166
    assert (result.partial, result.errors, result.bad_records) == (False, [], 0)


def test_a_failure_mid_pagination_keeps_the_earlier_pages_and_marks_the_fetch_partial(shared_data: Path) -> None:
    pages = weekly_p3_pages(shared_data)
    ec2 = StubbedEc2()
    ec2.serve("us-east-1", pages[:1], expected_request(NOW - SPOT_LOOKBACK))
    ec2.stub("us-east-1").add_client_error(
        "describe_spot_price_history",
        service_error_code="UnauthorizedOperation",
        service_message="You are not authorized to perform this operation.",
        http_status_code=403,
    )
    ec2.serve(
        "us-west-2",
        [recorded(shared_data, "us-west-2", "2020-03-23.p3.2xlarge")],
        expected_request(NOW - SPOT_LOOKBACK),
    )

    result = spot_source(ec2, ["us-east-1", "us-west-2"]).fetch(nothing_stored("us-east-1", "us-west-2"))

    ec2.verify()
    assert result.partial is True
    assert len(result.errors) == 1
    assert result.errors[0].startswith("us-east-1: UnauthorizedOperation")
    assert "IAM" in result.errors[0]
    assert sum(p.key.region == "us-east-1" for p in result.points) == 112
    assert sum(p.key.region == "us-west-2" for p in result.points) == 119


def test_a_page_of_the_wrong_shape_fails_only_its_region(shared_data: Path) -> None:
    ec2 = StubbedEc2()
    ec2.stub("us-east-1").add_response("describe_spot_price_history", {"NextToken": ""})
    ec2.serve(
        "us-west-2",
        [recorded(shared_data, "us-west-2", "2020-03-23.p3.2xlarge")],
        expected_request(NOW - SPOT_LOOKBACK),
    )

    result = spot_source(ec2, ["us-east-1", "us-west-2"]).fetch(nothing_stored("us-east-1", "us-west-2"))

    assert result.partial is True
    assert result.errors[0].startswith("us-east-1: MalformedInput")
    assert len(result.points) == 119


# --------------------------------------------------------------------------- moto server on loopback


def test_every_configured_region_is_fetched_from_the_ec2_endpoint(moto_url: str) -> None:
    regions = ["us-east-1", "us-west-2"]
    types = ["g4dn.xlarge", "g5.xlarge", "p4d.24xlarge"]
    source = AwsSpotSource(
        regions, types, session=fake_session(), endpoint_url=moto_url, clock=lambda: NOW, max_attempts=2
    )

    result = source.fetch(nothing_stored(*regions, instance_types=types))

    assert (result.partial, result.errors) == (False, [])
    for region in regions:
        got = [p for p in result.points if p.key.region == region]
        assert len(got) == moto_spot_offer_count(moto_url, region, types) > 0
        assert all(p.key.zone.startswith(region) and p.key.instance_type in types for p in got)


def test_a_region_that_fails_does_not_stop_the_others(moto_url: str) -> None:
    regions = ["us-east-1", "eu-west-1", "us-west-2"]
    types = ["g4dn.xlarge", "g5.xlarge"]
    config = aws_client_config(connect_timeout=1.0, read_timeout=5.0, max_attempts=2)
    good = boto3_client_factory("ec2", session=fake_session(), endpoint_url=moto_url, config=config)
    down = boto3_client_factory("ec2", session=fake_session(), endpoint_url=closed_port_url(), config=config)
    source = AwsSpotSource(
        regions, types, client_factory=lambda r: down(r) if r == "eu-west-1" else good(r), clock=lambda: NOW
    )

    result = source.fetch(nothing_stored(*regions, instance_types=types))

    assert result.partial is True
    assert len(result.errors) == 1
    assert result.errors[0].startswith("eu-west-1: EndpointConnectionError")
    assert {p.key.region for p in result.points} == {"us-east-1", "us-west-2"}
    assert len(result.points) == sum(moto_spot_offer_count(moto_url, r, types) for r in ("us-east-1", "us-west-2"))


def test_when_every_region_fails_the_source_is_unavailable_and_says_what_to_check() -> None:
    source = AwsSpotSource(
        ["us-east-1", "us-west-2"],
        session=fake_session(),
        endpoint_url=closed_port_url(),
        connect_timeout=1.0,
        max_attempts=1,
        clock=lambda: NOW,
    )

    with pytest.raises(SourceUnavailable) as info:
        source.fetch(nothing_stored("us-east-1", "us-west-2"))

    message = str(info.value)
    assert "every region failed" in message
    assert "us-east-1: EndpointConnectionError" in message
    assert "us-west-2: EndpointConnectionError" in message
    assert "Check network access" in message
    assert "ec2:DescribeSpotPriceHistory" in message


def test_missing_credentials_make_the_source_unavailable_with_a_hint(moto_url: str) -> None:
    source = AwsSpotSource(["us-east-1"], endpoint_url=moto_url, max_attempts=1, clock=lambda: NOW)

    with pytest.raises(SourceUnavailable, match=r"NoCredentialsError.*configure an AWS profile"):
        source.fetch(nothing_stored("us-east-1"))


def test_throttling_and_server_errors_are_retried_until_the_call_succeeds(
    moto_url: str, endpoints: list[ScriptedEndpoint]
) -> None:
    flaky = ScriptedEndpoint(moto_url, faults=[EC2_THROTTLED, EC2_UNAVAILABLE])
    endpoints.append(flaky)
    types = ["g4dn.xlarge"]
    source = AwsSpotSource(
        ["us-east-1"], types, session=fake_session(), endpoint_url=flaky.url, max_attempts=3, clock=lambda: NOW
    )

    result = source.fetch(nothing_stored("us-east-1", instance_types=types))

    assert flaky.requests == 3
    assert (result.partial, result.errors) == (False, [])
    assert len(result.points) == moto_spot_offer_count(moto_url, "us-east-1", types)


def test_retries_give_up_after_max_attempts_and_only_that_region_is_lost(
    moto_url: str, endpoints: list[ScriptedEndpoint]
) -> None:
    failing = ScriptedEndpoint(moto_url, faults=[EC2_UNAVAILABLE] * 2)
    endpoints.append(failing)
    config = aws_client_config(max_attempts=2)
    bad = boto3_client_factory("ec2", session=fake_session(), endpoint_url=failing.url, config=config)
    good = boto3_client_factory("ec2", session=fake_session(), endpoint_url=moto_url, config=config)
    types = ["g5.xlarge"]
    source = AwsSpotSource(
        ["us-east-1", "us-west-2"],
        types,
        client_factory=lambda r: bad(r) if r == "us-east-1" else good(r),
        clock=lambda: NOW,
    )

    result = source.fetch(nothing_stored("us-east-1", "us-west-2", instance_types=types))

    assert failing.requests == 2
    assert result.partial is True
    assert result.errors == ["us-east-1: Unavailable: The server is overloaded and can't handle the request."]
    assert {p.key.region for p in result.points} == {"us-west-2"}


def test_an_answer_that_cannot_be_parsed_fails_only_its_region(
    moto_url: str, endpoints: list[ScriptedEndpoint]
) -> None:
    garbled = ScriptedEndpoint(moto_url, faults=[NOT_XML] * 3)
    endpoints.append(garbled)
    config = aws_client_config(max_attempts=3)
    bad = boto3_client_factory("ec2", session=fake_session(), endpoint_url=garbled.url, config=config)
    good = boto3_client_factory("ec2", session=fake_session(), endpoint_url=moto_url, config=config)
    types = ["g5.xlarge"]
    source = AwsSpotSource(
        ["us-east-1", "us-west-2"],
        types,
        client_factory=lambda r: bad(r) if r == "us-east-1" else good(r),
        clock=lambda: NOW,
    )

    result = source.fetch(nothing_stored("us-east-1", "us-west-2", instance_types=types))

    assert result.partial is True
    assert len(result.errors) == 1
    assert result.errors[0].startswith("us-east-1: ResponseParserError")
    assert {p.key.region for p in result.points} == {"us-west-2"}


def test_a_region_that_times_out_is_reported_and_the_others_kept(
    moto_url: str, endpoints: list[ScriptedEndpoint]
) -> None:
    silent = ScriptedEndpoint(upstream=None)
    endpoints.append(silent)
    config = aws_client_config(connect_timeout=1.0, read_timeout=0.3, max_attempts=2)
    slow = boto3_client_factory("ec2", session=fake_session(), endpoint_url=silent.url, config=config)
    good = boto3_client_factory("ec2", session=fake_session(), endpoint_url=moto_url, config=config)
    types = ["g5.xlarge"]
    source = AwsSpotSource(
        ["ap-northeast-1", "us-west-2"],
        types,
        client_factory=lambda r: slow(r) if r == "ap-northeast-1" else good(r),
        clock=lambda: NOW,
    )

    result = source.fetch(nothing_stored("ap-northeast-1", "us-west-2", instance_types=types))

    assert silent.requests == 2
    assert result.partial is True
    assert len(result.errors) == 1
    assert result.errors[0].startswith("ap-northeast-1: ReadTimeoutError")
    assert {p.key.region for p in result.points} == {"us-west-2"}


def test_settings_give_the_regions_endpoint_and_read_timeout(moto_url: str) -> None:
    settings = Settings(aws_regions=["us-west-2"], aws_endpoint_url=moto_url, http_timeout_s=12.5)
    types = ["g5.xlarge"]
    source = AwsSpotSource.from_settings(settings, instance_types=types, session=fake_session(), clock=lambda: NOW)

    result = source.fetch(nothing_stored("us-west-2", instance_types=types))

    assert source.regions == ("us-west-2",)
    assert {p.key.region for p in result.points} == {"us-west-2"}
    assert len(result.points) == moto_spot_offer_count(moto_url, "us-west-2", types)
