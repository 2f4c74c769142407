"""The curated catalog (data/catalog/) and its strict loaders."""

from __future__ import annotations

import csv
import re
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest

from costopt.domain import KNOWN_ACCELERATORS, Cloud, InstanceType, Market, normalize_accelerator
from costopt.errors import BadRecord, MalformedInput
from costopt.settings import PROJECT_ROOT
from pricing.catalog import (
    INSTANCE_COLUMNS,
    PRICE_COLUMNS,
    InstanceCatalog,
    load_catalog,
    load_instance_catalog,
    load_list_prices,
)

CATALOG_DIR = PROJECT_ROOT / "data" / "catalog"
INSTANCE_TYPES = CATALOG_DIR / "instance_types.csv"
LIST_PRICES = CATALOG_DIR / "list_prices.csv"

AWS_2020 = "prices/aws_spot_price_history_2019-12_2020-03_p2_p3.csv"
AZURE_2020 = "prices/azure_spot_price_daily_2020-02_2020-03.csv"
GCP_HISTORY = "prices/gcp_gpu_vm_prices_history.csv"


@pytest.fixture(scope="module")
def catalog() -> InstanceCatalog:
    return load_catalog(CATALOG_DIR)


@pytest.fixture(scope="module")
def list_prices() -> dict[tuple[Cloud, str, str], float]:
    return {(p.key.cloud, p.key.region, p.key.instance_type): p.usd_per_hour for p in load_list_prices(LIST_PRICES)}


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _azure_arm_name(sheet_size: str) -> str:
    return "Standard_" + sheet_size.replace(" ", "_")


# --------------------------------------------------------------------------------------------------
# The shipped files
# --------------------------------------------------------------------------------------------------


def test_shipped_instance_catalog_loads_with_every_real_cloud() -> None:
    types = load_instance_catalog(INSTANCE_TYPES)

    assert {t.cloud for t in types} == {Cloud.AWS, Cloud.GCP, Cloud.AZURE}
    assert all(t.accelerator in KNOWN_ACCELERATORS and t.gpu_count > 0 for t in types)


def test_shipped_list_prices_load_as_dated_on_demand_regional_points() -> None:
    points = load_list_prices(LIST_PRICES, source="catalog-test")

    assert points
    for p in points:
        assert p.key.market is Market.ON_DEMAND
        assert p.key.zone == ""
        assert p.source == "catalog-test"
        assert p.valid_from.tzinfo is UTC
        assert p.valid_from.hour == 0
        assert p.observed_at is not None
        assert p.observed_at >= p.valid_from


@pytest.mark.parametrize(
    ("cloud", "accelerator"),
    [
        *((Cloud.AWS, a) for a in ("k80", "v100", "t4", "a10g", "l4", "a100", "a100-80gb", "h100")),
        *((Cloud.GCP, a) for a in ("k80", "p100", "v100", "t4", "l4", "a100", "a100-80gb", "h100")),
        *((Cloud.AZURE, a) for a in ("k80", "p100", "v100", "t4", "a10", "a100", "a100-80gb", "h100")),
    ],
)
def test_every_required_accelerator_is_catalogued_for_each_cloud_selling_it(
    catalog: InstanceCatalog, cloud: Cloud, accelerator: str
) -> None:
    assert [t for t in catalog.by_accelerator(accelerator) if t.cloud is cloud]


def test_every_list_price_names_a_catalogued_instance_type(
    catalog: InstanceCatalog, list_prices: dict[tuple[Cloud, str, str], float]
) -> None:
    missing = sorted(f"{c.value}/{name}" for c, _, name in list_prices if catalog.get(c, name) is None)
    assert missing == []


def test_every_source_id_of_both_files_is_documented_in_sources_md() -> None:
    documented = set(re.findall(r"^\| `([a-z0-9-]+)` \|", (CATALOG_DIR / "SOURCES.md").read_text(), re.M))
    used = {part for path in (INSTANCE_TYPES, LIST_PRICES) for row in _read(path) for part in row["source"].split(";")}
    assert used - documented == set()


def test_instance_names_follow_each_clouds_convention(catalog: InstanceCatalog) -> None:
    for t in catalog:
        if t.cloud is Cloud.AZURE:
            assert re.fullmatch(r"Standard_[A-Za-z0-9_]+", t.name), t.name
        elif t.cloud is Cloud.AWS:
            assert re.fullmatch(r"[a-z0-9-]+\.[a-z0-9]+", t.name), t.name
        elif t.name.startswith("n1-"):
            m = re.fullmatch(r"n1-standard-(\d+)\+([a-z0-9-]+)x(\d+)", t.name)
            assert m, t.name
            assert (m[2], int(m[3]), int(m[1])) == (t.accelerator, t.gpu_count, 8 * t.gpu_count)


# --------------------------------------------------------------------------------------------------
# Agreement with the real data
# --------------------------------------------------------------------------------------------------


def test_every_machine_type_of_the_real_gcp_history_is_catalogued_with_its_gpus(
    catalog: InstanceCatalog, shared_data: Path
) -> None:
    # The newest snapshot's label of each machine type (early a2-ultragpu rows say "a100").
    newest: dict[str, dict[str, str]] = {}
    for row in _read(shared_data / GCP_HISTORY):
        if row["machine_type"] not in newest or row["snapshot_utc"] >= newest[row["machine_type"]]["snapshot_utc"]:
            newest[row["machine_type"]] = row
    assert newest

    for machine_type, row in newest.items():
        found = catalog.get(Cloud.GCP, machine_type)
        assert found is not None, machine_type
        assert found.accelerator == normalize_accelerator(row["gpu_type"]), machine_type
        if row["gpu_count"]:
            assert found.gpu_count == float(row["gpu_count"]), machine_type
        else:  # an empty count in the history file marks a shape with part of a GPU
            assert 0 < found.gpu_count < 1, machine_type


def test_every_aws_type_of_the_2020_spot_data_is_catalogued_with_its_gpus(
    catalog: InstanceCatalog, shared_data: Path
) -> None:
    seen = {(r["instance_type"], r["gpu_type"], r["gpu_count"]) for r in _read(shared_data / AWS_2020)}
    assert {name for name, _, _ in seen} == {
        "p2.xlarge",
        "p2.8xlarge",
        "p2.16xlarge",
        "p3.2xlarge",
        "p3.8xlarge",
        "p3.16xlarge",
    }
    for name, gpu, count in seen:
        found = catalog.get(Cloud.AWS, name)
        assert found is not None, name
        assert (found.accelerator, found.gpu_count) == (gpu, float(count)), name
        assert found.accelerator == {"p2": "k80", "p3": "v100"}[name.split(".")[0]]


def test_every_azure_size_of_the_2020_sheet_is_catalogued_with_its_gpus(
    catalog: InstanceCatalog, shared_data: Path
) -> None:
    seen = {(r["vm_size"], r["gpu_type"], r["gpu_count"]) for r in _read(shared_data / AZURE_2020)}
    assert len({size for size, _, _ in seen}) == 12
    family = {"": "k80", "v2": "p100", "v3": "v100"}
    for size, gpu, count in seen:
        found = catalog.get(Cloud.AZURE, _azure_arm_name(size))
        assert found is not None, size
        assert (found.accelerator, found.gpu_count) == (gpu, float(count)), size
        version = size.split(" ")[1] if " " in size else ""
        assert found.accelerator == family[version], size


def test_every_region_and_type_of_the_2020_aws_data_has_a_list_price(
    list_prices: dict[tuple[Cloud, str, str], float], shared_data: Path
) -> None:
    pairs = {(r["region"], r["instance_type"]) for r in _read(shared_data / AWS_2020)}
    assert sorted(p for p in pairs if (Cloud.AWS, *p) not in list_prices) == []


def test_2020_aws_spot_prices_never_exceed_the_list_price_of_the_same_type_and_region(
    list_prices: dict[tuple[Cloud, str, str], float], shared_data: Path
) -> None:
    # AWS capped spot at the on-demand price in 2020, so a spot record above the list price (beyond
    # rounding) would mean a wrong list price.
    highest: dict[tuple[str, str], float] = defaultdict(float)
    for r in _read(shared_data / AWS_2020):
        key = (r["region"], r["instance_type"])
        highest[key] = max(highest[key], float(r["spot_usd_per_hour"]))
    too_high = {
        k: (spot, list_prices[Cloud.AWS, *k]) for k, spot in highest.items() if spot > list_prices[Cloud.AWS, *k] * 1.01
    }
    assert too_high == {}


def test_2020_azure_spot_prices_never_exceed_the_list_price_where_one_is_listed(
    list_prices: dict[tuple[Cloud, str, str], float], shared_data: Path
) -> None:
    checked = 0
    for r in _read(shared_data / AZURE_2020):
        key = (Cloud.AZURE, r["region"], _azure_arm_name(r["vm_size"]))
        if r["spot_usd_per_hour"] and key in list_prices:
            checked += 1
            assert float(r["spot_usd_per_hour"]) <= list_prices[key] * 1.01, r
    assert checked > 500


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Standard_NC6", 0.90),
        ("Standard_NC6s_v2", 2.07),
        ("Standard_NC6s_v3", 3.06),
    ],
)
def test_azure_2020_eastus_list_prices_are_the_published_ones(
    list_prices: dict[tuple[Cloud, str, str], float], name: str, expected: float
) -> None:
    assert list_prices[Cloud.AZURE, "eastus", name] == pytest.approx(expected)


def test_gcp_n1_gpu_prices_compose_the_per_gpu_price_with_the_n1_host(
    catalog: InstanceCatalog, list_prices: dict[tuple[Cloud, str, str], float]
) -> None:
    per_gpu = {"k80": 0.45, "p100": 1.46, "v100": 2.48, "t4": 0.35}
    n1 = {k: v for k, v in list_prices.items() if k[0] is Cloud.GCP and k[2].startswith("n1-")}
    assert len(n1) == 14
    for (_, region, name), usd in n1.items():
        shape = catalog.get(Cloud.GCP, name)
        assert shape is not None, name
        assert shape.vcpus is not None, name
        assert shape.memory_gib is not None, name
        host = shape.vcpus * 0.031611 + shape.memory_gib * 0.004237
        assert region == "us-central1"
        assert usd == pytest.approx(per_gpu[shape.accelerator] * shape.gpu_count + host, abs=1e-6), name


def test_aws_us_east_1_2020_list_prices_are_the_published_ones(
    list_prices: dict[tuple[Cloud, str, str], float],
) -> None:
    published = {
        "p2.xlarge": 0.90,
        "p2.8xlarge": 7.20,
        "p2.16xlarge": 14.40,
        "p3.2xlarge": 3.06,
        "p3.8xlarge": 12.24,
        "p3.16xlarge": 24.48,
    }
    for name, usd in published.items():
        assert list_prices[Cloud.AWS, "us-east-1", name] == pytest.approx(usd), name


# --------------------------------------------------------------------------------------------------
# Lookup
# --------------------------------------------------------------------------------------------------


def test_catalog_lookup_answers_by_cloud_name_and_any_gpu_spelling(catalog: InstanceCatalog) -> None:
    p3 = catalog.get("aws", "p3.2xlarge")

    assert isinstance(p3, InstanceType)
    assert (p3.accelerator, p3.gpu_count, p3.vcpus) == ("v100", 1, 8)
    assert catalog.accelerator_of("Standard_NC6s_v3", Cloud.AZURE) == "v100"
    assert catalog.accelerator_of("n1-standard-16+v100x2", "gcp") == "v100"
    assert catalog.accelerator_of("p3.2xlarge", Cloud.GCP) is None
    assert catalog.get("no-such-cloud", "p3.2xlarge") is None
    v100s = catalog.by_accelerator("nvidia-tesla-v100")
    assert v100s == catalog.by_accelerator("V100")
    assert {t.cloud for t in v100s} == {Cloud.AWS, Cloud.GCP, Cloud.AZURE}


def test_catalog_is_immutable(catalog: InstanceCatalog) -> None:
    with pytest.raises(TypeError):
        catalog.types[Cloud.AWS, "x"] = catalog.types[Cloud.AWS, "p3.2xlarge"]  # type: ignore[index]


# --------------------------------------------------------------------------------------------------
# Strictness
# --------------------------------------------------------------------------------------------------

GOOD_TYPE = "aws,p3.2xlarge,v100,1,8,61,src"
GOOD_PRICE = "aws,us-east-1,p3.2xlarge,3.06,2020-05-06,2020-05-06,src"


def _write(tmp_path: Path, header: tuple[str, ...], *lines: str) -> Path:
    path = tmp_path / "catalog.csv"
    path.write_text("\n".join([",".join(header), *lines]) + "\n")
    return path


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("aws,p2.xlarge,K80,1,4,61,src", "not canonical"),
        ("aws,p2.xlarge,tpu-v4,1,4,61,src", "unknown accelerator"),
        ("aws,p2.xlarge,k80,1.5,4,61,src", "whole number"),
        ("aws,p2.xlarge,k80,0,4,61,src", "positive"),
        ("aws,p2.xlarge,k80,nan,4,61,src", "finite"),
        ("aws,p2.xlarge,k80,1,-4,61,src", "vcpus"),
        ("aws,p2.xlarge,k80,1,4,lots,src", "memory_gib"),
        ("oracle,p2.xlarge,k80,1,4,61,src", "unknown cloud"),
        ("aws,,k80,1,4,61,src", "instance_type is empty"),
        ("aws,p2.xlarge,k80,1,4,61,", "source"),
        ("aws,p2.xlarge,k80,1,4,61", "expected 7 fields"),
        ("aws,p3.2xlarge,v100,1,8,61,src", "duplicate"),
    ],
)
def test_a_bad_instance_row_raises_bad_record_naming_the_file_and_line(tmp_path: Path, row: str, reason: str) -> None:
    path = _write(tmp_path, INSTANCE_COLUMNS, GOOD_TYPE, row)

    with pytest.raises(BadRecord) as info:
        load_instance_catalog(path)

    assert f"{path}:3:" in str(info.value)
    assert reason in str(info.value)


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("aws,us-east-1,p2.xlarge,-0.9,2020-05-06,2020-05-06,src", "negative"),
        ("aws,us-east-1,p2.xlarge,0,2020-05-06,2020-05-06,src", "price of zero"),
        ("aws,us-east-1,p2.xlarge,1e6,2020-05-06,2020-05-06,src", "absurd"),
        ("aws,us-east-1,p2.xlarge,free,2020-05-06,2020-05-06,src", "not a number"),
        ("aws,us-east-1,p2.xlarge,0.9,05/06/2020,2020-05-06,src", "ISO date"),
        ("aws,us-east-1,p2.xlarge,0.9,2020-05-06T00:00,2020-05-06,src", "ISO date"),
        ("aws,us-east-1,p2.xlarge,0.9,2020-05-06,2020-05-01,src", "before valid_from"),
        ("aws,,p2.xlarge,0.9,2020-05-06,2020-05-06,src", "region is empty"),
        ("aws,us-east-1,p3.2xlarge,3.1,2020-05-06,2020-06-01,src", "duplicate"),
    ],
)
def test_a_bad_price_row_raises_bad_record_naming_the_file_and_line(tmp_path: Path, row: str, reason: str) -> None:
    path = _write(tmp_path, PRICE_COLUMNS, GOOD_PRICE, row)

    with pytest.raises(BadRecord) as info:
        load_list_prices(path)

    assert f"{path}:3:" in str(info.value)
    assert reason in str(info.value)


@pytest.mark.parametrize("loader", [load_instance_catalog, load_list_prices])
def test_a_wrong_or_missing_header_is_malformed_input(tmp_path: Path, loader: object) -> None:
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("cloud,name,gpu\naws,p3.2xlarge,v100\n")
    empty = tmp_path / "empty.csv"
    empty.write_text("")

    for path in (wrong, empty, tmp_path / "absent.csv"):
        with pytest.raises(MalformedInput, match=re.escape(str(path))):
            loader(path)  # type: ignore[operator]


def test_blank_lines_are_skipped_and_fractional_gpus_below_one_are_kept(tmp_path: Path) -> None:
    path = _write(tmp_path, INSTANCE_COLUMNS, "", "gcp,g4-standard-6,rtx-pro-6000,0.125,,,a;b", "")

    (only,) = load_instance_catalog(path)

    assert (only.gpu_count, only.vcpus, only.memory_gib, only.source) == (0.125, None, None, "a;b")


def test_a_price_row_becomes_a_point_from_valid_from_confirmed_at_confirmed_at(tmp_path: Path) -> None:
    path = _write(tmp_path, PRICE_COLUMNS, "azure,eastus,Standard_NC6,0.9,2020-01-02,2020-05-06,src")

    (point,) = load_list_prices(path, source="list-price")

    assert point.valid_from == datetime(2020, 1, 2, tzinfo=UTC)
    assert point.observed_at == datetime(2020, 5, 6, tzinfo=UTC)
    assert (point.key.cloud, point.key.region, point.key.zone) == (Cloud.AZURE, "eastus", "")
    assert (point.usd_per_hour, point.source) == (0.9, "list-price")
