"""GcpPriceSource through the real google-cloud-billing / google-cloud-compute REST clients, pointed at a
loopback fake serving the documented wire formats from tests/fixtures/gcp/."""

from __future__ import annotations

import csv
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from google.auth.credentials import AnonymousCredentials

from costopt.domain import Cloud, Market, OfferKey, PricePoint
from costopt.errors import SourceUnavailable
from pricing.gcp import COMPUTE_ENGINE_SERVICE, MACHINE_SHAPES, GcpFetchResult, GcpPriceSource
from tests.net_support import LoopbackServer, closed_port_url

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gcp"
FETCHED_AT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
PROJECT = "costopt-demo"
SKU_PATH = f"/v1/{COMPUTE_ENGINE_SERVICE}/skus"
ACCELERATORS_PATH = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/aggregated/acceleratorTypes$")
HTTP_STATUS_NAMES = {429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE", 403: "PERMISSION_DENIED"}


def _load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------------------------
# The fake GCP endpoints
# ------------------------------------------------------------------------------------------------


@dataclass
class FakeGcp:
    """Serves ``skus`` pages keyed by page token ("" = first page) and the aggregated accelerator list.

    ``fail_first[route]`` lists HTTP statuses answered (one per request) before the real body;
    ``fail_always[route]`` answers that status forever; ``delay_first[route]`` sleeps before answering.
    Routes: ``skus:<pageToken>`` and ``accelerators``.
    """

    sku_pages: dict[str, dict[str, Any]]
    accelerators: dict[str, Any]
    url: str = ""
    seen: list[str] = field(default_factory=list)
    fail_first: dict[str, list[int]] = field(default_factory=dict)
    fail_always: dict[str, int] = field(default_factory=dict)
    delay_first: dict[str, list[float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, method: str, target: str) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(target)
        query = parse_qs(parts.query)
        if method != "GET":
            return 405, _error(405, "method not allowed")
        if parts.path == SKU_PATH:
            token = query.get("pageToken", [""])[0]
            route, body = f"skus:{token}", self.sku_pages.get(token)
        elif ACCELERATORS_PATH.match(parts.path):
            route, body = "accelerators", self.accelerators
        else:
            return 404, _error(404, f"no such resource {parts.path}")
        with self.lock:
            self.seen.append(route)
            delays = self.delay_first.get(route)
            delay = delays.pop(0) if delays else 0.0
            failures = self.fail_first.get(route)
            status = failures.pop(0) if failures else self.fail_always.get(route, 200)
        if delay:
            time.sleep(delay)
        if status != 200:
            return status, _error(status, "injected failure")
        if body is None:
            return 400, _error(400, f"invalid page token {route}")
        return 200, body


def _error(code: int, message: str) -> dict[str, Any]:
    """Google's JSON error body (https://cloud.google.com/apis/design/errors#http_mapping)."""
    return {"error": {"code": code, "message": message, "status": HTTP_STATUS_NAMES.get(code, "UNKNOWN")}}


def _handler(fake: FakeGcp) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = fake.answer("GET", self.path)
            data = json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client timed out first
                pass

        def log_message(self, format: str, *args: Any) -> None:
            logging.getLogger("fake-gcp").debug(format, *args)

    return Handler


@pytest.fixture
def fake() -> Iterator[FakeGcp]:
    pages = [_load(f"skus_page{i}.json") for i in (1, 2, 3)]
    by_token = {"": pages[0], pages[0]["nextPageToken"]: pages[1], pages[1]["nextPageToken"]: pages[2]}
    state = FakeGcp(by_token, _load("accelerator_types_aggregated.json"))
    with LoopbackServer(_handler(state)) as server:
        state.url = server.url
        yield state


class NoHistory:
    def last_change(self, cloud: Cloud, *, region=None, market=None, instance_types=None) -> datetime | None:
        return None


def make_source(url: str, **overrides: Any) -> GcpPriceSource:
    kwargs: dict[str, Any] = {
        "billing_endpoint": url,
        "compute_endpoint": url,
        "credentials": AnonymousCredentials(),  # type: ignore[no-untyped-call]
        "timeout_s": 5.0,
        "retry_deadline_s": 3.0,
        "retry_initial_s": 0.01,
        "retry_maximum_s": 0.05,
        "clock": lambda: FETCHED_AT,
    }
    kwargs.update(overrides)
    return GcpPriceSource(**kwargs)


def fetch(url: str, **overrides: Any) -> GcpFetchResult:
    return make_source(url, **overrides).fetch(NoHistory())


def prices(result: GcpFetchResult) -> dict[tuple[str, str, Market], PricePoint]:
    out = {}
    for p in result.points:
        key = (p.key.instance_type, p.key.region, p.key.market)
        assert key not in out, f"duplicate price point for {key}"
        out[key] = p
    return out


# ------------------------------------------------------------------------------------------------
# Catalog reading and composition
# ------------------------------------------------------------------------------------------------


def test_every_catalog_page_is_read_by_following_next_page_token(fake: FakeGcp) -> None:
    result = fetch(fake.url)
    tokens = [r.removeprefix("skus:") for r in fake.seen if r.startswith("skus:")]
    page1, page2 = fake.sku_pages[""], fake.sku_pages[fake.sku_pages[""]["nextPageToken"]]
    assert tokens == ["", page1["nextPageToken"], page2["nextPageToken"]]
    assert result.pages == 3
    assert not result.partial
    assert result.errors == []


def test_n1_v100_vm_price_is_the_exact_sum_of_core_ram_and_gpu_skus(fake: FakeGcp) -> None:
    got = prices(fetch(fake.url))
    # n1-standard-8 (8 vCPU, 30 GiB) + 1 V100 in us-central1, by hand:
    # on-demand 8 * 0.031611 + 30 * 0.004237 + 2.48 = 0.252888 + 0.12711 + 2.48
    assert got[("n1-standard-8+v100x1", "us-central1", Market.ON_DEMAND)].usd_per_hour == 2.859998
    # spot 8 * 0.006655 + 30 * 0.000892 + 0.74 = 0.05324 + 0.02676 + 0.74
    assert got[("n1-standard-8+v100x1", "us-central1", Market.SPOT)].usd_per_hour == 0.82
    # n1-standard-64 (64 vCPU, 240 GiB) + 8 V100 in europe-west4 on-demand:
    # 64 * 0.034806 + 240 * 0.004664 + 8 * 2.55 = 2.227584 + 1.11936 + 20.4
    assert got[("n1-standard-64+v100x8", "europe-west4", Market.ON_DEMAND)].usd_per_hour == 23.746944


def test_accelerator_optimized_vm_prices_are_exact_sums_of_their_family_skus(fake: FakeGcp) -> None:
    got = prices(fetch(fake.url))
    # a2-highgpu-2g: 24 vCPU, 170 GiB, 2 A100 -> 24*0.031611 + 170*0.004237 + 2*2.933908
    assert got[("a2-highgpu-2g", "us-central1", Market.ON_DEMAND)].usd_per_hour == 7.346770
    # a2-ultragpu-1g: 12 vCPU, 170 GiB, 1 A100 80GB -> 0.379332 + 0.72029 + 3.96917589
    assert got[("a2-ultragpu-1g", "us-central1", Market.ON_DEMAND)].usd_per_hour == 5.06879789
    # g2-standard-24: 24 vCPU, 96 GiB, 2 L4 -> 24*0.024988 + 96*0.002927 + 2*0.56004
    assert got[("g2-standard-24", "us-east1", Market.ON_DEMAND)].usd_per_hour == 2.000784
    # g2-standard-24 spot: 24*0.01407 + 96*0.001641 + 2*0.3148
    assert got[("g2-standard-24", "us-east1", Market.SPOT)].usd_per_hour == 1.124816
    # a3-highgpu-8g: 208 vCPU, 1872 GiB, 8 H100 -> 6.864 + 8.27424 + 73.351759904
    assert got[("a3-highgpu-8g", "us-central1", Market.ON_DEMAND)].usd_per_hour == 88.489999904
    # a3-highgpu-8g spot: 208*0.01485 + 1872*0.00199 + 8*2.25
    assert got[("a3-highgpu-8g", "us-central1", Market.SPOT)].usd_per_hour == 24.81408


def test_spot_prices_come_from_preemptible_skus_and_on_demand_from_ondemand_skus(fake: FakeGcp) -> None:
    got = prices(fetch(fake.url))
    pairs = 0
    for (name, region, market), point in got.items():
        assert point.key == OfferKey(Cloud.GCP, region, "", name, market)
        if market is Market.SPOT and (name, region, Market.ON_DEMAND) in got:
            assert point.usd_per_hour < got[(name, region, Market.ON_DEMAND)].usd_per_hour
            pairs += 1
    assert pairs > 20
    assert {m for (_, _, m) in got} == {Market.SPOT, Market.ON_DEMAND}


def test_a3_highgpu_below_8g_is_priced_as_spot_only(fake: FakeGcp) -> None:
    got = prices(fetch(fake.url))
    assert ("a3-highgpu-1g", "us-central1", Market.SPOT) in got
    assert ("a3-highgpu-1g", "us-central1", Market.ON_DEMAND) not in got


def test_valid_from_is_the_latest_effective_time_of_the_parts_and_observed_at_the_fetch_time(
    fake: FakeGcp,
) -> None:
    got = prices(fetch(fake.url))
    v100 = got[("n1-standard-8+v100x1", "us-central1", Market.ON_DEMAND)]
    # core/RAM SKUs are effective 08:00; the V100 SKU 09:30:00.250.
    assert v100.valid_from == datetime(2026, 11, 29, 9, 30, 0, 250000, tzinfo=UTC)
    assert type(v100.valid_from) is datetime
    t4 = got[("n1-standard-8+t4x1", "us-central1", Market.ON_DEMAND)]
    assert t4.valid_from == datetime(2026, 11, 29, 8, 0, tzinfo=UTC)
    assert all(p.observed_at == FETCHED_AT for p in got.values())
    assert all(p.source == "gcp" for p in got.values())


def test_bad_rates_are_counted_and_every_other_sku_is_kept(fake: FakeGcp) -> None:
    result = fetch(fake.url)
    got = prices(result)
    assert result.bad_records == 2
    assert any("0BF4-7A31-2C6D" in r and "no unitPrice" in r for r in result.reasons)
    assert any("6E2C-05BF-A4D9" in r and "negative" in r for r in result.reasons)
    # On-demand P100 had no rate: no on-demand P100 VM, but spot P100 VMs are priced.
    assert not any(n.endswith("+p100x1") and m is Market.ON_DEMAND for (n, _, m) in got)
    assert ("n1-standard-8+p100x1", "us-central1", Market.SPOT) in got
    # The negative Netherlands spot T4 is dropped; the on-demand one has no SKU at all.
    assert not any(n.startswith("n1-") and "+t4" in n and r == "europe-west4" for (n, r, _) in got)
    assert ("n1-standard-8+t4x1", "us-central1", Market.SPOT) in got


def test_unknown_gpu_skus_and_unneeded_skus_are_skipped_not_failed(fake: FakeGcp) -> None:
    result = fetch(fake.url)
    # Skipped: E2 core, 1-year commitment, network egress (page 1); P4, H100 Mega, DWS A100 (page 2).
    assert result.skipped == 6
    assert result.bad_records == 2
    names = {p.key.instance_type for p in result.points}
    assert not any("+p4x" in n for n in names)
    assert {it.accelerator for it in result.instance_types} == {
        "k80",
        "p100",
        "v100",
        "t4",
        "a100",
        "a100-80gb",
        "h100",
        "l4",
    }


def test_instance_types_describe_every_shape_with_canonical_accelerators(fake: FakeGcp) -> None:
    result = fetch(fake.url)
    by_name = {it.name: it for it in result.instance_types}
    assert set(by_name) == {s.name for s in MACHINE_SHAPES}
    v100x4 = by_name["n1-standard-32+v100x4"]
    assert (v100x4.cloud, v100x4.accelerator, v100x4.gpu_count, v100x4.vcpus, v100x4.memory_gib) == (
        Cloud.GCP,
        "v100",
        4.0,
        32,
        120.0,
    )
    ultra = by_name["a2-ultragpu-8g"]
    assert (ultra.accelerator, ultra.gpu_count, ultra.vcpus, ultra.memory_gib) == ("a100-80gb", 8.0, 96, 1360.0)
    assert by_name["g2-standard-48"].accelerator == "l4"
    assert by_name["a3-highgpu-8g"].accelerator == "h100"
    # Every priced point names one of these instance types.
    assert {p.key.instance_type for p in result.points} <= set(by_name)


def test_regions_filter_limits_prices_to_the_listed_regions(fake: FakeGcp) -> None:
    result = fetch(fake.url, regions=["europe-west4"])
    assert result.points
    assert {p.key.region for p in result.points} == {"europe-west4"}
    # Americas-only SKUs are skipped as "no wanted region", not counted as bad.
    assert result.bad_records == 1  # only the Netherlands spot T4


def test_composed_a2_price_matches_the_real_gcp_vm_price_history(fake: FakeGcp, shared_data: Path) -> None:
    """Cross-check: core/RAM/GPU composition of a2-highgpu-1g in us-central1 with the public list
    prices of the fixture equals the whole-VM price in the real history file."""
    got = prices(fetch(fake.url))
    mine = got[("a2-highgpu-1g", "us-central1", Market.ON_DEMAND)].usd_per_hour
    assert mine == 3.673385  # 12 * 0.031611 + 85 * 0.004237 + 2.933908
    with (shared_data / "prices" / "gcp_gpu_vm_prices_history.csv").open(newline="") as f:
        history = {
            round(float(row["ondemand_usd_per_hour"]), 6)
            for row in csv.DictReader(f)
            if row["machine_type"] == "a2-highgpu-1g"
            and row["region"] == "us-central1"
            and row["ondemand_usd_per_hour"]
        }
    assert mine in history


# ------------------------------------------------------------------------------------------------
# Accelerator availability
# ------------------------------------------------------------------------------------------------


def test_with_a_project_vm_prices_exist_only_where_a_zone_offers_the_accelerator(fake: FakeGcp) -> None:
    result = fetch(fake.url, project=PROJECT)
    got = prices(result)
    assert "accelerators" in fake.seen
    assert result.availability is not None
    by_region = result.availability.by_region()
    assert "v100" in by_region["us-central1"]
    assert "v100" not in by_region["us-east1"]
    # The catalog prices V100 in us-east1 ("running in Americas"), but no us-east1 zone offers it.
    assert ("n1-standard-8+v100x1", "us-central1", Market.ON_DEMAND) in got
    assert not any("+v100" in n and r == "us-east1" for (n, r, _) in got)
    # K80 is OBSOLETE in every zone: no K80 VM at all.
    assert "k80" not in set().union(*by_region.values())
    assert not any("+k80" in n for (n, _, _) in got)
    # us-east1 offers T4 and A100, so those stay.
    assert ("n1-standard-8+t4x1", "us-east1", Market.SPOT) in got
    assert ("a2-highgpu-1g", "us-east1", Market.ON_DEMAND) in got


def test_without_a_project_availability_is_skipped_with_a_log_line_and_every_catalog_region_is_priced(
    fake: FakeGcp, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="costopt.pricing.gcp"):
        result = fetch(fake.url, project=None)
    assert result.availability is None
    assert "accelerators" not in fake.seen
    assert any("no project set" in r.message for r in caplog.records)
    got = prices(result)
    assert ("n1-standard-8+v100x1", "us-east1", Market.ON_DEMAND) in got
    assert ("n1-standard-8+k80x1", "us-west1", Market.SPOT) in got


def test_failing_accelerator_lookup_keeps_the_prices_and_records_the_error(fake: FakeGcp) -> None:
    fake.fail_always["accelerators"] = 403
    result = fetch(fake.url, project=PROJECT)
    assert result.availability is None
    assert not result.partial
    assert any("acceleratorTypes.aggregatedList" in e and "Compute Engine API" in e for e in result.errors)
    assert ("n1-standard-8+v100x1", "us-east1", Market.ON_DEMAND) in prices(result)


# ------------------------------------------------------------------------------------------------
# Errors, retries, partial fetches
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 500, 503])
def test_transient_http_errors_are_retried_until_the_page_is_served(fake: FakeGcp, status: int) -> None:
    second = fake.sku_pages[""]["nextPageToken"]
    fake.fail_first[f"skus:{second}"] = [status, status]
    result = fetch(fake.url)
    assert fake.seen.count(f"skus:{second}") == 3
    assert result.pages == 3
    assert not result.partial
    assert ("a2-highgpu-1g", "us-central1", Market.ON_DEMAND) in prices(result)


def test_a_503_on_the_first_page_is_retried(fake: FakeGcp) -> None:
    fake.fail_first["skus:"] = [503]
    result = fetch(fake.url)
    assert fake.seen[:2] == ["skus:", "skus:"]
    assert result.pages == 3


def test_a_request_timing_out_is_retried(fake: FakeGcp) -> None:
    fake.delay_first["skus:"] = [1.0]
    result = fetch(fake.url, timeout_s=0.3)
    assert fake.seen.count("skus:") == 2
    assert result.pages == 3


def test_server_down_raises_source_unavailable_saying_what_to_check() -> None:
    url = closed_port_url()
    with pytest.raises(SourceUnavailable) as excinfo:
        fetch(url, retry_deadline_s=0.3)
    message = str(excinfo.value)
    assert url in message
    assert "Application Default Credentials" in message
    assert "Cloud Billing API" in message


def test_permission_denied_is_not_retried_and_raises_source_unavailable(fake: FakeGcp) -> None:
    fake.fail_always["skus:"] = 403
    with pytest.raises(SourceUnavailable, match="Cloud Billing API is enabled"):
        fetch(fake.url)
    assert fake.seen == ["skus:"]


def test_missing_application_default_credentials_raise_source_unavailable(
    fake: FakeGcp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    with pytest.raises(SourceUnavailable, match="gcloud auth application-default login"):
        fetch(fake.url, credentials=None)
    assert fake.seen == []


def test_failure_on_page_two_keeps_page_one_prices_and_marks_the_fetch_partial(fake: FakeGcp) -> None:
    second = fake.sku_pages[""]["nextPageToken"]
    fake.fail_always[f"skus:{second}"] = 500
    result = fetch(fake.url, retry_deadline_s=0.3)
    got = prices(result)
    assert result.partial
    assert result.pages == 1
    assert len(result.errors) == 1
    assert "after 1 page(s)" in result.errors[0]
    # Page 1 holds N1 core/RAM and V100/T4: those VMs are priced; A2/G2/A3 (pages 2-3) are not.
    assert got[("n1-standard-8+v100x1", "us-central1", Market.ON_DEMAND)].usd_per_hour == 2.859998
    assert ("n1-standard-16+t4x2", "us-west1", Market.SPOT) in got
    assert not any(n.startswith(("a2-", "a3-", "g2-")) for (n, _, _) in got)
    assert result.bad_records == 1  # page 1's P100 only


def test_from_settings_takes_regions_project_and_endpoints() -> None:
    from costopt.settings import Settings

    settings = Settings(
        gcp_regions=["us-central1"],
        gcp_project="p",
        gcp_billing_endpoint="http://127.0.0.1:1",
        gcp_compute_endpoint="http://127.0.0.1:2",
        http_timeout_s=7.0,
    )
    source = GcpPriceSource.from_settings(settings)
    assert source.regions == frozenset({"us-central1"})
    assert (source.project, source.billing_endpoint, source.compute_endpoint, source.timeout_s) == (
        "p",
        "http://127.0.0.1:1",
        "http://127.0.0.1:2",
        7.0,
    )
    assert source.name == "gcp"
