"""Bad price pages (issue 14): the corpus of tests/fixtures/bad_pages/ (MANIFEST.json says what is wrong
with each page) through every importer kind and every live collector. Required: no crash, no bad row
stored, nothing of a refused page stored, every rejection counted, logged with its source and shown by
``costopt prices sources``. The 10 MB pages and the next-page loops are made here.

Run the corpus alone: ``.venv/bin/pytest -q tests/pricing/test_bad_pages.py``.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine
from typer.testing import CliRunner

from costopt.domain import Cloud, InstanceType, Market
from costopt.errors import BadRecord, MalformedInput
from pricing.aws import AwsSpotSource
from pricing.aws_pages import parse_price_list_page
from pricing.azure import AzureRetailPriceSource, parse_retail_page
from pricing.catalog import load_instance_catalog
from pricing.collect import run_source
from pricing.gcp import GcpPriceSource, compose_prices, parse_skus_page
from pricing.importer import import_file, import_paths, import_source
from pricing.screen import gpu_counts, screen_frame
from pricing.store import PriceStore, points_frame

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
CORPUS = ROOT / "bad_pages"
MANIFEST: dict[str, dict[str, str]] = json.loads((CORPUS / "MANIFEST.json").read_text(encoding="utf-8"))
IMPORTED = {f: m for f, m in MANIFEST.items() if m["kind"] != "aws-price-list"}
CATALOG = Path(__file__).resolve().parents[2] / "data" / "catalog" / "instance_types.csv"
NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
TEN_MB = 10 * 1024 * 1024


def _store(engine: Engine) -> PriceStore:
    """A store knowing the curated instance catalog (GPU counts: the per-GPU-hour bound applies)."""
    store = PriceStore(engine, mirror_max_points=0)
    store.upsert_instance_types(load_instance_catalog(CATALOG))
    return store


def _page(name: str) -> Any:
    return json.loads((CORPUS / name).read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------------------- importer


def test_the_corpus_covers_every_importer_kind_and_defect() -> None:
    kinds = {m["kind"] for m in MANIFEST.values()}
    assert kinds >= {"aws-spot-page", "gcp-skus-page", "azure-retail-page", "aws-spot-csv", "gcp-history-csv"}
    assert kinds >= {"list-prices", "aws-price-list", "azure-sheet", "azure-daily-csv"}
    defects = " ".join(m["defect"] for m in MANIFEST.values()).lower()
    for word in ("truncated", "wrong type", "nan", "infinite", "negative", "zero", "absurd", "missing", "unknown"):
        assert word in defects, word
    for word in ("currency", "unit", "duplicated json key", "two prices", "future", "control character", "unicode"):
        assert word in defects, word


def test_every_bad_page_is_refused_whole_counted_and_shown(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    store = _store(engine)
    files = [CORPUS / f for f in sorted(IMPORTED)]
    with caplog.at_level(logging.ERROR, logger="costopt.pricing.importer"):
        reports = import_paths(store, files)

    assert len(reports) == len(files)
    wrong = []
    for report in reports:
        entry = IMPORTED[report.path.relative_to(CORPUS).as_posix()]
        if entry["expect"] == "refused":
            ok = report.status == "failed" and entry["reason"].lower() in (report.error or "").lower()
        else:  # the one record means "not offered": skipped, nothing stored
            ok = report.status == "imported" and report.points_read == 0 and report.skipped_records == 1
        if not ok:
            wrong.append(f"{report.path.name}: {report.status} {report.error}")
    assert wrong == []
    assert store.count_points() == 0  # every page holds good rows too: none of them was stored
    refused = [r for r in reports if r.status == "failed"]
    logged = caplog.text
    assert all(str(r.path) in logged for r in refused)  # each refusal logged naming its file
    by_name = {s.name: s for s in store.sources()}
    page_level = ("ends early", "not a list", "not text", "duplicated key", "not json", "expected 8 fields")
    for kind in {r.kind for r in refused}:
        mine = [r for r in refused if r.kind == kind]
        status = by_name[import_source(kind)]
        assert status.total_refused_pages == len(mine)
        assert status.last_rejection == mine[-1].error
        record_level = [r for r in mine if not any(w in (r.error or "").lower() for w in page_level)]
        if record_level:
            assert status.total_bad_records >= len(record_level), kind
        else:
            assert status.total_bad_records == 0, kind


@pytest.mark.parametrize(
    ("fixture", "kind", "points", "status"),
    [
        ("gcp/skus_page3.json", "gcp-skus-page", 37, "imported"),
        ("azure/retail_prices_page1.json", "azure-retail-page", 4, "partial"),  # it has a NextPageLink
    ],
)
def test_a_saved_collector_page_imports_as_the_collector_reads_it(
    engine: Engine, fixture: str, kind: str, points: int, status: str
) -> None:
    store = _store(engine)
    page = json.loads((ROOT / fixture).read_text(encoding="utf-8"))
    if kind == "gcp-skus-page":
        components, problems, _ = parse_skus_page(page)
        expected = compose_prices(components, None, None, problems)
    else:
        expected = parse_retail_page(page).points

    report = import_file(store, ROOT / fixture)

    assert (report.kind, report.status, report.points_read, report.inserted) == (kind, status, points, points)
    assert len(expected) == points
    for p in expected:
        stored = store.price_at(p.key, p.valid_from)
        assert stored is not None and stored.usd_per_hour == pytest.approx(p.usd_per_hour), p.key
    health = {s.name: s for s in store.sources()}[import_source(kind)]
    assert (health.last_points, health.total_refused_pages, health.consecutive_failures) == (points, 0, 0)


def _clean_gcp_listing(folder: Path) -> list[dict[str, Any]]:
    """The three fixture pages of one GCP listing without their two deliberately bad SKUs, saved in
    ``folder`` as the collector fetched them (page1.json ... page3.json)."""
    folder.mkdir()
    pages = []
    for n in (1, 2, 3):
        page = json.loads((ROOT / "gcp" / f"skus_page{n}.json").read_text(encoding="utf-8"))
        page["skus"] = [s for s in page["skus"] if s["skuId"] not in ("0BF4-7A31-2C6D", "6E2C-05BF-A4D9")]
        (folder / f"page{n}.json").write_text(json.dumps(page), encoding="utf-8")
        pages.append(page)
    return pages


def test_a_folder_of_saved_gcp_pages_is_one_listing_composed_as_the_collector_does(
    tmp_path: Path, engine: Engine
) -> None:
    store = _store(engine)
    folder = tmp_path / "listing"  # (the SQLite database lives in tmp_path)
    pages = _clean_gcp_listing(folder)
    live = _gcp_source(iter([_gcp_response(p, p["nextPageToken"]) for p in pages])).fetch(None)  # type: ignore[arg-type]
    expected = {(p.key, p.valid_from): p.usd_per_hour for p in live.points}
    alone = set()
    for n in (1, 2, 3):
        components, problems, _ = parse_skus_page(pages[n - 1])
        alone |= {p.key for p in compose_prices(components, None, None, problems)}

    reports = import_paths(store, [folder])

    assert [(r.path.name, r.status) for r in reports] == [(f"page{n}.json", "imported") for n in (1, 2, 3)]
    assert reports[0].points_read == len(expected) == reports[0].inserted
    history = store.history_points(datetime(2000, 1, 1, tzinfo=UTC), NOW)
    stored = {(p.key, p.valid_from): p.usd_per_hour for p in history}
    assert stored.keys() == expected.keys()
    assert all(stored[k] == pytest.approx(v) for k, v in expected.items())
    across = {k for k, _ in expected} - alone  # e.g. N1 core/RAM on page 1, the K80 on page 2
    assert any("k80" in k.instance_type for k in across)


def test_one_bad_page_refuses_the_whole_saved_gcp_listing(tmp_path: Path, engine: Engine) -> None:
    store = _store(engine)
    folder = tmp_path / "listing"
    _clean_gcp_listing(folder)
    (folder / "page2.json").write_text((ROOT / "gcp" / "skus_page2.json").read_text(encoding="utf-8"))

    reports = import_paths(store, [folder])

    assert [r.status for r in reports] == ["failed"] * 3
    assert all("negative unitPrice" in (r.error or "") and "page2.json" in (r.error or "") for r in reports)
    assert store.count_points() == 0
    (status,) = store.sources()
    assert (status.total_refused_pages, status.total_bad_records) == (3, 1)


@pytest.mark.parametrize("fixture", ["gcp/skus_page1.json", "azure/retail_prices_page2.json"])
def test_a_saved_collector_page_with_one_bad_record_stores_nothing(engine: Engine, fixture: str) -> None:
    store = _store(engine)
    with pytest.raises(BadRecord, match=r"unitPrice|not a number|timestamp"):
        import_file(store, ROOT / fixture)
    assert store.count_points() == 0
    assert store.sources()[0].total_refused_pages == 1


def _azure_ten_mb(last: dict[str, Any] | None) -> dict[str, Any]:
    page: dict[str, Any] = copy.deepcopy(_page("azure_retail/price_negative.json"))
    good = page["Items"][1]
    windows = {**good, "productName": "Virtual Machines NCSv3 Series Windows", "meterName": "x" * 200}
    count = TEN_MB // len(json.dumps(windows)) + 1
    page["Items"] = [good, *([windows] * count), *([last] if last is not None else [])]
    return page


def test_a_10_mb_page_is_read_whole_and_refused_whole_for_one_bad_item(tmp_path: Path, engine: Engine) -> None:
    store = _store(engine)
    bad_item = _page("azure_retail/price_negative.json")["Items"][0]
    big = tmp_path / "big.json"
    big.write_text(json.dumps(_azure_ten_mb(bad_item)), encoding="utf-8")
    cut = tmp_path / "big_cut.json"
    cut.write_bytes(big.read_bytes()[: TEN_MB // 2])
    clean = tmp_path / "big_clean.json"
    clean.write_text(json.dumps(_azure_ten_mb(None)), encoding="utf-8")
    assert big.stat().st_size > TEN_MB

    reports = import_paths(store, [big, cut, clean])

    assert [r.status for r in reports] == ["failed", "failed", "imported"]
    assert "negative price" in (reports[0].error or "") and "ends early" in (reports[1].error or "")
    assert reports[2].points_read == 1 and reports[2].skipped_records > 10_000
    assert store.count_points() == 1  # the clean page's one Linux meter, nothing of the others


# ----------------------------------------------------------------------------------------- live collectors


class _Pages:
    """An httpx transport serving Azure pages by ``$skip`` (page 0 without), counting requests."""

    def __init__(self, bodies: list[bytes]) -> None:
        self.bodies = bodies
        self.requests = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        skip = int(request.url.params.get("$skip", "0"))
        return httpx.Response(200, content=self.bodies[skip])


def _link(n: int) -> str:
    return f"https://prices.example/api/retail/prices?$skip={n}"


def _azure(bodies: list[bytes]) -> tuple[AzureRetailPriceSource, _Pages]:
    pages = _Pages(bodies)
    client = httpx.Client(transport=httpx.MockTransport(pages))
    source = AzureRetailPriceSource(base_url="https://prices.example/api/retail/prices", client=client, max_attempts=1)
    return source, pages


def _body(page: dict[str, Any], link: str | None) -> bytes:
    return json.dumps({**page, "NextPageLink": link}).encode()


def _item_level_bad_azure_items() -> list[dict[str, Any]]:
    """The defective item of every Azure page of the corpus whose defect is in one item, each moved to a
    time of its own (so that it shares no offer and time with the good items)."""
    items = []
    for n, (name, entry) in enumerate(sorted(MANIFEST.items())):
        if not name.startswith("azure_retail/") or entry["expect"] != "refused":
            continue
        if entry["reason"] in ("ends early", "not a list", "not text", "duplicated", "not JSON"):
            continue  # a page-level defect
        if "conflicting" in name:
            continue  # tested on its own below
        try:
            page = _page(name)
        except ValueError:
            continue  # not JSON at all: a page-level defect
        if not isinstance(page.get("Items"), list) or not isinstance(page.get("NextPageLink"), str | None):
            continue
        item = page["Items"][0]
        if isinstance(item.get("effectiveStartDate"), str) and item["effectiveStartDate"].startswith("2023"):
            item["effectiveStartDate"] = f"2024-{1 + n % 12:02d}-{1 + n // 12:02d}T00:00:00Z"
        items.append(item)
    return items


def test_the_azure_collector_stores_the_good_items_and_counts_every_bad_one(engine: Engine) -> None:
    store = _store(engine)
    good = _page("azure_retail/price_negative.json")["Items"][1]
    bad = _item_level_bad_azure_items()
    assert len(bad) >= 12
    source, _ = _azure([_body({"Items": [good, *bad]}, None)])

    outcome = run_source(store, source)

    assert outcome.ok and outcome.points == 1 and outcome.bad_records == len(bad)
    assert store.count_points() == 1
    status = store.sources()[0]
    assert (status.name, status.last_bad_records, status.total_bad_records) == ("azure", len(bad), len(bad))
    assert status.last_rejection


def test_the_azure_collector_refuses_both_prices_of_a_conflicting_meter(engine: Engine) -> None:
    store = _store(engine)
    page = _page("azure_retail/conflicting_items.json")
    source, _ = _azure([_body(page, None)])

    outcome = run_source(store, source)

    assert outcome.ok and (outcome.points, outcome.bad_records) == (1, 2)  # the spot item only
    assert store.count_points() == 1
    assert "several prices" in (store.sources()[0].last_rejection or "")  # the screen's rule, as for every source


@pytest.mark.parametrize("defect", ["truncated.json", "duplicated_key.json", "nan_literal.json", "items_not_list.json"])
def test_a_malformed_azure_page_after_the_first_is_refused_whole_and_the_run_is_partial(
    engine: Engine, defect: str
) -> None:
    store = _store(engine)
    first = _page("azure_retail/price_negative.json")
    first["Items"] = first["Items"][1:]
    bad = (CORPUS / "azure_retail" / defect).read_bytes()
    source, _ = _azure([_body(first, _link(1)), bad])

    outcome = run_source(store, source)

    assert outcome.ok and outcome.partial and outcome.points == 1
    status = store.sources()[0]
    assert (status.last_refused_pages, status.total_refused_pages, status.last_partial) == (1, 1, True)
    assert "page 2" in (status.last_rejection or "")
    assert store.count_points() == 1


def test_a_malformed_first_azure_page_fails_the_run_and_stores_nothing(engine: Engine) -> None:
    store = _store(engine)
    source, _ = _azure([(CORPUS / "azure_retail" / "truncated.json").read_bytes()])

    outcome = run_source(store, source)

    assert not outcome.ok and store.count_points() == 0
    status = store.sources()[0]
    assert (status.consecutive_failures, status.last_refused_pages, status.total_refused_pages) == (1, 1, 1)
    assert "ends early" in (status.last_rejection or "") or "not JSON" in (status.last_rejection or "")


def test_an_azure_next_page_link_that_loops_stops_the_run(engine: Engine) -> None:
    store = _store(engine)
    page = _page("azure_retail/price_negative.json")
    one = {**page, "Items": page["Items"][1:]}
    two = {**page, "Items": [{**page["Items"][1], "armRegionName": "westus2"}]}
    source, served = _azure([_body(one, _link(1)), _body(two, _link(1))])  # page 2 links to itself

    outcome = run_source(store, source)

    assert outcome.ok and outcome.partial and outcome.points == 2
    assert served.requests == 2  # page 2 is not fetched again
    assert "a loop" in (store.sources()[0].last_error or "")


def test_a_10_mb_azure_page_is_read_by_the_collector(engine: Engine) -> None:
    store = _store(engine)
    bad_item = _page("azure_retail/price_negative.json")["Items"][0]
    source, _ = _azure([_body(_azure_ten_mb(bad_item), None)])

    outcome = run_source(store, source)

    assert outcome.ok and (outcome.points, outcome.bad_records) == (1, 1) and outcome.skipped > 10_000


def _gcp_response(page: dict[str, Any], token: str) -> Any:
    from google.cloud import billing_v1

    return billing_v1.ListSkusResponse.from_json(
        json.dumps({**page, "nextPageToken": token}), ignore_unknown_fields=True
    )


def _gcp_source(pages: Iterator[Any]) -> GcpPriceSource:
    source = GcpPriceSource(regions=None, project=None)
    source._catalog_pages = lambda: pages  # type: ignore[method-assign]
    return source


def test_the_gcp_collector_keeps_the_good_skus_and_counts_the_bad_ones(engine: Engine) -> None:
    store = _store(engine)
    good = _page("gcp_skus/price_zero.json")
    good["skus"][2] = _page("gcp_skus/time_future.json")["skus"][2]
    good["skus"][2]["pricingInfo"][0]["effectiveTime"] = "2026-11-29T08:00:00Z"
    bad_skus = []
    for name in ("price_zero", "price_negative", "price_absurd", "currency_eur", "unit_month", "regions_missing"):
        sku = _page(f"gcp_skus/{name}.json")["skus"][2]
        sku["description"] = sku["description"].replace("L4", "Tesla T4")  # a GPU of its own: no conflict
        bad_skus.append(sku)
    pages = iter([_gcp_response(good, "t1"), _gcp_response({"skus": bad_skus}, "")])

    outcome = run_source(store, _gcp_source(pages))

    assert outcome.ok and not outcome.partial
    assert outcome.bad_records == len(bad_skus) and outcome.points > 0
    assert {p.key.instance_type.split("-")[0] for p in store.snapshot(include_stale=True)} == {"g2"}  # no T4 VM priced


def test_the_gcp_collector_refuses_composed_prices_in_the_future_or_an_unknown_region(engine: Engine) -> None:
    store = _store(engine)
    future = _page("gcp_skus/time_future.json")
    moon = _page("gcp_skus/region_unknown.json")

    outcome = run_source(store, _gcp_source(iter([_gcp_response(future, "")])))
    assert outcome.ok and outcome.points == 0 and outcome.bad_records == 8
    outcome = run_source(store, _gcp_source(iter([_gcp_response(moon, "")])))
    assert outcome.ok and outcome.points == 0 and outcome.bad_records == 8
    assert store.count_points() == 0
    assert store.sources()[0].total_bad_records == 16


def test_a_gcp_next_page_token_that_loops_stops_the_run() -> None:
    good = _page("gcp_skus/price_negative.json")
    good["skus"][2] = _page("gcp_skus/price_zero.json")["skus"][2]
    good["skus"][2]["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"]["nanos"] = 560040000

    def forever() -> Iterator[Any]:
        n = 0
        while True:  # a server that keeps answering the same token
            n += 1
            yield _gcp_response(good, "same-token")
            assert n < 10, "the collector followed a looping nextPageToken"

    result = _gcp_source(forever()).fetch(None)  # type: ignore[arg-type]

    assert result.partial and result.pages == 2 and "loop" in result.errors[0]
    assert len(result.points) > 0


def test_a_gcp_page_the_sdk_cannot_decode_is_refused_whole_and_the_run_is_partial(engine: Engine) -> None:
    from google.protobuf import json_format

    store = _store(engine)
    good = _page("gcp_skus/price_negative.json")
    good["skus"][2] = _page("gcp_skus/price_zero.json")["skus"][2]
    good["skus"][2]["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"]["nanos"] = 560040000

    def pages() -> Iterator[Any]:
        yield _gcp_response(good, "t1")
        raise json_format.ParseError("Failed to parse units field: invalid literal for int(): 'three'")

    outcome = run_source(store, _gcp_source(pages()))

    assert outcome.ok and outcome.partial and outcome.points > 0
    status = store.sources()[0]
    assert (status.last_refused_pages, status.total_refused_pages) == (1, 1)
    assert "page 2" in (status.last_rejection or "")


def test_instance_types_with_odd_names_or_no_gpus_are_refused_and_counted(engine: Engine) -> None:
    from pricing.base import FetchResult

    store = PriceStore(engine, mirror_max_points=0)
    good = InstanceType(Cloud.AWS, "p3.2xlarge", "v100", 1, source="aws-api")
    odd = [
        InstanceType(Cloud.AWS, "p3.2x\u0000large", "v100", 1, source="aws-api"),
        InstanceType(Cloud.AWS, "p3.16xlargе", "v100", 8, source="aws-api"),
        InstanceType(Cloud.AWS, "p9.xlarge", "v100", float("nan"), source="aws-api"),
    ]

    class _Catalog:
        name = "aws-catalog"

        def fetch(self, history: Any) -> FetchResult:
            return FetchResult(self.name, instance_types=[good, *odd])

    outcome = run_source(store, _Catalog())

    assert outcome.ok and outcome.bad_records == len(odd)
    assert [t.name for t in store.instance_types()] == ["p3.2xlarge"]


class _FakeEc2:
    """An EC2 client whose spot history paginator yields the given raw pages."""

    def __init__(self, pages: list[Any]) -> None:
        self.pages = pages

    def get_paginator(self, name: str) -> Any:
        pages = self.pages

        class _Paginator:
            def paginate(self, **_: Any) -> list[Any]:
                return pages

        return _Paginator()


def test_the_aws_spot_collector_stores_the_good_records_and_counts_every_bad_one(engine: Engine) -> None:
    store = _store(engine)
    names = [
        n
        for n, m in sorted(MANIFEST.items())
        if n.startswith("aws_spot/") and m["expect"] == "refused" and "record" not in m["defect"].lower()
    ]
    pages: list[Any] = []
    for name in names:
        try:
            page = _page(name)
        except ValueError:
            continue  # a page that is not JSON never reaches the collector: boto3 refuses it
        if isinstance(page.get("SpotPriceHistory"), list):
            pages.append(page)
    assert len(pages) >= 12
    source = AwsSpotSource(["us-east-1"], client_factory=lambda region: _FakeEc2(pages))

    outcome = run_source(store, source)

    assert outcome.ok
    stored = {(p.key.zone, p.key.instance_type, p.usd_per_hour) for p in store.snapshot(include_stale=True)}
    assert stored == {("us-east-1c", "p2.xlarge", 0.27)}  # the good record of the pages, never a bad one
    assert outcome.bad_records >= len(pages)


def test_a_looping_aws_next_token_is_stopped_by_botocore_and_the_region_is_partial(engine: Engine) -> None:
    import boto3
    from botocore.stub import Stubber

    store = _store(engine)
    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    page = _page("aws_spot/price_negative.json")["SpotPriceHistory"][1:]
    for rec in page:
        rec["Timestamp"] = datetime.fromisoformat(rec["Timestamp"].replace("Z", "+00:00"))
    for _ in range(3):
        stub.add_response("describe_spot_price_history", {"SpotPriceHistory": page, "NextToken": "again"})
    with stub:
        outcome = run_source(store, AwsSpotSource(["us-east-1"], client_factory=lambda region: client))

    assert outcome.ok and outcome.partial and outcome.points >= 1
    assert "same next token" in (store.sources()[0].last_error or "").lower()


@pytest.mark.parametrize("name", sorted(n for n in MANIFEST if n.startswith("aws_price_list/")))
def test_every_bad_price_list_page_leaves_no_point(name: str) -> None:
    """The on-demand collector's Price List pages (not imported): the parser and the screen the
    collector's run applies refuse every bad product; a $0.00 is skipped as not offered."""
    entry = MANIFEST[name]
    page = parse_price_list_page(_page(name), where=name)
    known = [*load_instance_catalog(CATALOG), *page.instance_types]
    screened = screen_frame(points_frame(page.points), gpus=gpu_counts(known), now=NOW)

    assert len(screened.frame) == 0
    if entry["expect"] == "refused":
        assert page.problems.bad + screened.refused == 1
        assert entry["reason"].lower() in " ".join(page.problems.reasons + screened.reasons).lower()
    else:
        assert (page.problems.skipped, page.problems.bad, screened.refused) == (1, 0, 0)


# ----------------------------------------------------------------------------------------- shown


def test_prices_sources_shows_the_rejections(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from api.cli.main import app
    from costopt.settings import get_settings

    monkeypatch.setenv("COSTOPT_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        result = runner.invoke(app, ["prices", "import", str(CORPUS / "azure_retail" / "price_negative.json")])
        assert result.exit_code != 0
        result = runner.invoke(app, ["prices", "sources", "-f", "json"])
        assert result.exit_code == 0
        rows = json.loads(result.stdout)
        table = runner.invoke(app, ["prices", "sources"])
    finally:
        get_settings.cache_clear()
    (row,) = rows
    assert row["name"] == "import:azure-retail-page"
    assert (row["total_refused_pages"], row["total_bad_records"]) == (1, 1)
    assert "negative price" in row["last_rejection"] and row["last_rejection_at"]
    assert row["stale"] is False  # an import is not a scheduled source
    assert "pages refused" in table.stdout and "import:azure-retail-page" in table.stdout


def test_prices_import_reads_saved_gcp_and_azure_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from api.cli.main import app
    from costopt.settings import get_settings

    monkeypatch.setenv("COSTOPT_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    folder = tmp_path / "skus"
    _clean_gcp_listing(folder)
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(
            app, ["prices", "import", str(folder), str(ROOT / "azure" / "retail_prices_page1.json"), "-f", "json"]
        )
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.stdout
    rows = json.loads(result.stdout)
    assert [(r["kind"], r["status"]) for r in rows] == [("gcp-skus-page", "imported")] * 3 + [
        ("azure-retail-page", "partial")
    ]
    assert rows[0]["inserted"] > 0 and rows[3]["inserted"] == 4


def test_zero_is_not_a_price_anywhere() -> None:
    from costopt.domain import OfferKey, PricePoint

    key = OfferKey(Cloud.AWS, "us-east-1", "", "p3.2xlarge", Market.ON_DEMAND)
    with pytest.raises(BadRecord, match="zero"):
        PricePoint(key, NOW, 0.0, "test")
    frame = points_frame([PricePoint(key, NOW, 1.0, "test")]).assign(usd_per_hour=0.0)
    assert screen_frame(frame, now=NOW).refused == 1
    with pytest.raises(MalformedInput):
        parse_retail_page({"Items": [], "NextPageLink": 3})
    shape = InstanceType(Cloud.AWS, "p3.2xlarge", "v100", 1)
    assert gpu_counts([shape]) == {("aws", "p3.2xlarge"): 1.0}


@pytest.mark.parametrize("price", [0.0, -1.0, float("nan"), float("inf"), 1e6])
def test_the_store_refuses_a_batch_holding_a_price_that_is_not_a_price(engine: Engine, price: float) -> None:
    """The last line of defence (pricing/ingest.py): a direct write is all or nothing."""
    from costopt.domain import OfferKey, PricePoint

    store = PriceStore(engine, mirror_max_points=0)
    key = OfferKey(Cloud.AWS, "us-east-1", "", "p3.2xlarge", Market.ON_DEMAND)
    frame = points_frame([PricePoint(key, NOW, 3.06, "test"), PricePoint(key, NOW.replace(hour=13), 3.1, "test")])
    frame.loc[1, "usd_per_hour"] = price

    with pytest.raises(BadRecord, match="invalid price"):
        store.write(frame)
    assert store.count_points() == 0


def test_the_vector_price_rule_agrees_with_check_price() -> None:
    """pricing.screen.price_faults (screen, importer CSVs, the store's last check) is check_price's rule."""
    import numpy as np

    from costopt.domain import MAX_SANE_USD_PER_HOUR, check_price
    from pricing.screen import price_faults

    values = [0.0, -0.0, -1.0, 1e-9, 3.06, MAX_SANE_USD_PER_HOUR, MAX_SANE_USD_PER_HOUR + 0.01]
    values += [float("nan"), float("inf"), float("-inf")]
    faults = price_faults(np.array(values))
    for value, fault in zip(values, faults, strict=True):
        try:
            check_price(value)
            passes = True
        except BadRecord:
            passes = False
        assert (fault == "") == passes, (value, fault)
    assert list(faults[:3]) == ["price of zero: not a price", "price of zero: not a price", "negative price"]


def test_a_page_walk_stops_at_a_loop_or_at_max_pages() -> None:
    """The guard the Azure and GCP collectors follow next pages through (pricing.base.PageWalk)."""
    from pricing.base import PageWalk

    walk = PageWalk(3, "NextPageLink", {"p0"})
    assert walk.why_stop(1, "p1") is None and walk.why_stop(2, "p2") is None
    assert "max_pages=3" in (walk.why_stop(3, "p3") or "")
    loop = PageWalk(10, "nextPageToken", {"p0"})
    assert loop.why_stop(1, "p1") is None
    assert "a loop" in (loop.why_stop(2, "p0") or "") and "a loop" in (loop.why_stop(2, "p1") or "")
