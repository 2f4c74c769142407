"""GCP machine-shape table, SKU recognition and accelerator availability, without a server."""

from __future__ import annotations

import csv
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from google.cloud import billing_v1

from costopt.domain import Market
from costopt.errors import BadRecord
from pricing.base import Problems
from pricing.gcp import (
    MACHINE_SHAPES,
    SHAPES_BY_NAME,
    AcceleratorAvailability,
    ComponentPrices,
    gcp_region_of_zone,
    n1_gpu_instance_name,
    read_sku,
)

EFFECTIVE = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)


def make_sku(
    description: str,
    *,
    usage_type: str = "OnDemand",
    group: str = "GPU",
    regions: tuple[str, ...] = ("us-central1",),
    unit: str = "h",
    tiers: tuple[tuple[int, int], ...] = ((2, 480_000_000),),
    currency: str = "USD",
) -> billing_v1.Sku:
    return billing_v1.Sku(
        name="services/6F81-5844-456A/skus/TEST-0000-0001",
        sku_id="TEST-0000-0001",
        description=description,
        category=billing_v1.Category(resource_family="Compute", resource_group=group, usage_type=usage_type),
        service_regions=list(regions),
        pricing_info=[
            billing_v1.PricingInfo(
                effective_time=EFFECTIVE,
                pricing_expression=billing_v1.PricingExpression(
                    usage_unit=unit,
                    tiered_rates=[
                        {"start_usage_amount": i, "unit_price": {"currency_code": currency, "units": u, "nanos": n}}
                        for i, (u, n) in enumerate(tiers)
                    ],
                ),
            )
        ],
    )


def read(sku: billing_v1.Sku, regions: frozenset[str] | None = None) -> tuple[ComponentPrices, Problems]:
    components, problems = ComponentPrices(), Problems("gcp")
    read_sku(sku, components, problems, regions)
    return components, problems


# ------------------------------------------------------------------------------------------------
# Shapes
# ------------------------------------------------------------------------------------------------


def test_n1_gpu_shapes_are_named_machine_type_plus_gpu_times_count_with_8_vcpu_per_gpu() -> None:
    assert n1_gpu_instance_name("nvidia-tesla-v100", 1) == "n1-standard-8+v100x1"
    assert n1_gpu_instance_name("nvidia-tesla-t4", 4) == "n1-standard-32+t4x4"
    shape = SHAPES_BY_NAME["n1-standard-64+k80x8"]
    assert (shape.machine_type, shape.vcpus, shape.memory_gib, shape.gpu_count) == (
        "n1-standard-64",
        64,
        Decimal("240"),
        8,
    )


def test_n1_gpu_counts_are_the_ones_gcp_allows() -> None:
    n1 = {(s.accelerator, s.gpu_count) for s in MACHINE_SHAPES if s.family == "n1"}
    assert n1 == {
        ("k80", 1),
        ("k80", 2),
        ("k80", 4),
        ("k80", 8),
        ("v100", 1),
        ("v100", 2),
        ("v100", 4),
        ("v100", 8),
        ("p100", 1),
        ("p100", 2),
        ("p100", 4),
        ("t4", 1),
        ("t4", 2),
        ("t4", 4),
    }


def test_shape_names_are_unique() -> None:
    assert len(SHAPES_BY_NAME) == len(MACHINE_SHAPES)


def test_a2_a3_g2_shapes_match_machine_types_and_gpus_of_the_real_gcp_history(shared_data: Path) -> None:
    latest: dict[str, tuple[str, str]] = {}
    with (shared_data / "prices" / "gcp_gpu_vm_prices_history.csv").open(newline="") as f:
        for row in csv.DictReader(f):  # rows are in time order: the last one per machine type wins
            latest[row["machine_type"]] = (row["gpu_type"], row["gpu_count"])
    mine = [s for s in MACHINE_SHAPES if s.family in ("a2", "a3", "g2")]
    assert len(mine) == 21
    for shape in mine:
        assert shape.name in latest, f"{shape.name} is not a GCP machine type of the history file"
        gpu_type, gpu_count = latest[shape.name]
        assert (shape.accelerator, shape.gpu_count) == (gpu_type, int(gpu_count)), shape.name


# ------------------------------------------------------------------------------------------------
# SKU recognition
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("description", "usage_type", "expected"),
    [
        ("Nvidia Tesla V100 GPU running in Americas", "OnDemand", ("gpu", "nvidia-tesla-v100", Market.ON_DEMAND)),
        (
            "Spot Preemptible Nvidia Tesla V100 GPU running in Americas",
            "Preemptible",
            ("gpu", "nvidia-tesla-v100", Market.SPOT),
        ),
        (
            "Nvidia Tesla K80 GPU attached to Spot Preemptible VMs running in Warsaw",
            "Preemptible",
            ("gpu", "nvidia-tesla-k80", Market.SPOT),
        ),
        ("Preemptible Nvidia Tesla T4 GPU running in Americas", "Preemptible", ("gpu", "nvidia-tesla-t4", Market.SPOT)),
        ("NVIDIA A100 80GB GPU running in Americas", "OnDemand", ("gpu", "nvidia-a100-80gb", Market.ON_DEMAND)),
        ("Nvidia Tesla A100 80GB GPU running in Americas", "OnDemand", ("gpu", "nvidia-a100-80gb", Market.ON_DEMAND)),
        ("Nvidia H100 80GB GPU running in Americas", "OnDemand", ("gpu", "nvidia-h100-80gb", Market.ON_DEMAND)),
    ],
)
def test_gpu_sku_descriptions_map_to_accelerator_and_market(
    description: str, usage_type: str, expected: tuple[str, str, Market]
) -> None:
    components, problems = read(make_sku(description, usage_type=usage_type))
    assert (problems.skipped, problems.bad) == (0, 0)
    part, name, market = expected
    rate = components.rates[(part, name, market, "us-central1")]
    assert rate.usd == Decimal("2.48")
    assert rate.effective == EFFECTIVE


@pytest.mark.parametrize(
    "description",
    [
        "Nvidia Tesla A100 80GB GPU attached to DWS Defined Duration VMs running in Americas",
        "Commitment v1: Nvidia Tesla V100 GPU running in Americas",
        "Nvidia Tesla P4 GPU running in Americas",
        "Nvidia Tesla P100 Virtual Workstation GPU running in Americas",
        "Nvidia H100 80GB Mega GPU running in Americas",
    ],
)
def test_gpu_skus_of_no_priced_shape_are_skipped(description: str) -> None:
    components, problems = read(make_sku(description))
    assert (problems.skipped, problems.bad, components.rates) == (1, 0, {})


def test_commitment_usage_type_is_skipped() -> None:
    _, problems = read(make_sku("Nvidia Tesla V100 GPU running in Americas", usage_type="Commit1Yr"))
    assert (problems.skipped, problems.bad) == (1, 0)


def test_ram_sku_price_is_per_gib_hour_and_core_price_per_hour() -> None:
    ram = make_sku("A2 Instance Ram running in Americas", group="RAM", unit="GiBy.h", tiers=((0, 4_237_000),))
    core = make_sku(
        "Spot Preemptible G2 Instance Core running in Americas",
        group="CPU",
        usage_type="Preemptible",
        tiers=((0, 14_070_000),),
    )
    components, problems = read(ram)
    read_sku(core, components, problems)
    assert components.rates[("ram", "a2", Market.ON_DEMAND, "us-central1")].usd == Decimal("0.004237")
    assert components.rates[("core", "g2", Market.SPOT, "us-central1")].usd == Decimal("0.01407")
    assert problems.bad == 0


def test_the_last_pricing_tier_is_the_price() -> None:
    components, _ = read(make_sku("Nvidia L4 GPU running in Americas", tiers=((0, 0), (0, 560_040_000))))
    assert components.rates[("gpu", "nvidia-l4", Market.ON_DEMAND, "us-central1")].usd == Decimal("0.56004")


@pytest.mark.parametrize(
    ("sku", "reason"),
    [
        (make_sku("A2 Instance Ram running in Americas", group="RAM", unit="h"), "usageUnit"),
        (make_sku("Nvidia L4 GPU running in Americas", currency="EUR"), "not USD"),
        (make_sku("Nvidia L4 GPU running in Americas", tiers=((-1, 0),)), "negative"),
        (make_sku("Spot Preemptible Nvidia L4 GPU running in Americas", usage_type="OnDemand"), "disagree"),
    ],
)
def test_invalid_rates_are_bad_records(sku: billing_v1.Sku, reason: str) -> None:
    components, problems = read(sku)
    assert (problems.bad, components.rates) == (1, {})
    assert reason in problems.reasons[0]


def test_a_sku_outside_the_wanted_regions_is_skipped() -> None:
    sku = make_sku("Nvidia L4 GPU running in Americas", regions=("us-central1", "us-east1"))
    components, problems = read(sku, frozenset({"us-east1", "europe-west4"}))
    assert [k[3] for k in components.rates] == ["us-east1"]
    components, problems = read(sku, frozenset({"europe-west4"}))
    assert (problems.skipped, components.rates) == (1, {})


# ------------------------------------------------------------------------------------------------
# Availability
# ------------------------------------------------------------------------------------------------


def test_availability_needs_a_zone_with_enough_cards_per_vm() -> None:
    availability = AcceleratorAvailability(
        {
            "us-central1-a": {"nvidia-tesla-t4": 4, "nvidia-l4": 8},
            "us-central1-b": {"nvidia-tesla-t4": 2},
            "us-east1-c": {"nvidia-tesla-t4": 0},  # 0: maximumCardsPerInstance not stated
        }
    )
    assert availability.offers("us-central1", "nvidia-tesla-t4", 4)
    assert not availability.offers("us-central1", "nvidia-tesla-t4", 8)
    assert availability.zones_offering("nvidia-tesla-t4", 4) == ["us-central1-a", "us-east1-c"]
    assert not availability.offers("us-west1", "nvidia-tesla-t4")
    assert availability.by_region() == {"us-central1": frozenset({"t4", "l4"}), "us-east1": frozenset({"t4"})}


def test_region_of_a_zone_drops_the_zone_letter() -> None:
    assert gcp_region_of_zone("europe-west4-a") == "europe-west4"
    with pytest.raises(BadRecord):
        gcp_region_of_zone("uscentral1")
