"""Azure spot price sheets of the 2020 paper: the real files (read in place) and small bad copies."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from costopt.domain import Cloud, Market, OfferKey
from costopt.errors import BadRecord, MalformedInput, NotPriceData
from pricing.azure_sheets import (
    SHEET_REGIONS,
    load_instance_mapping,
    parse_azure_sheet,
    region_of_sheet,
    sheet_size_to_arm,
)

SHEETS = ("us_east.csv", "us_north_central.csv", "us_south_central.csv")
HEADER = "Date,NC6,NC6s v3\n"


@pytest.fixture(scope="module")
def azure_logs(shared_data: Path) -> Path:
    return shared_data / "raw" / "training_on_a_dime" / "logs" / "azure"


@pytest.fixture(scope="module")
def mapping(azure_logs: Path):
    return load_instance_mapping(azure_logs / "instance_mapping.csv")


@pytest.fixture(scope="module")
def sheets(azure_logs: Path, mapping):
    return {name: parse_azure_sheet(azure_logs / "cost" / name, mapping) for name in SHEETS}


def price(sheet, region: str, size: str, day: datetime):
    key = OfferKey(Cloud.AZURE, region, "", size, Market.SPOT)
    return next(p.usd_per_hour for p in sheet.points if p.key == key and p.valid_from == day)


# --- the real sheets ----------------------------------------------------------------------------


def test_the_three_sheets_hold_1044_cells_of_which_232_are_empty(sheets):
    assert sum(s.cells for s in sheets.values()) == 1044
    assert sum(s.problems.skipped for s in sheets.values()) == 232
    assert sum(len(s.points) for s in sheets.values()) == 1044 - 232
    assert all(s.problems.bad == 0 for s in sheets.values())


def test_known_prices_are_read_as_spot_points_of_that_utc_day(sheets):
    feb24 = datetime(2020, 2, 24, tzinfo=UTC)
    assert price(sheets["us_east.csv"], "eastus", "Standard_NC6", feb24) == 0.12276
    assert price(sheets["us_east.csv"], "eastus", "Standard_NC24rs_v3", feb24) == 2.65375
    assert price(sheets["us_north_central.csv"], "northcentralus", "Standard_NC24r", feb24) == 0.52312
    assert (
        price(sheets["us_south_central.csv"], "southcentralus", "Standard_NC6s_v2", datetime(2020, 3, 23, tzinfo=UTC))
        == 0.32416
    )
    point = sheets["us_east.csv"].points[0]
    assert point.key.market is Market.SPOT
    assert point.key.zone == ""
    assert point.source == "azure-sheet"
    assert point.observed_at is None
    assert point.valid_from.tzinfo is UTC


def test_the_region_comes_from_the_file_name(sheets):
    for name, sheet in sheets.items():
        assert {p.key.region for p in sheet.points} == {SHEET_REGIONS[name.removesuffix(".csv")]}


def test_sheets_cover_every_day_from_2020_02_24_to_2020_03_23(sheets):
    days = {p.valid_from for s in sheets.values() for p in s.points}
    assert min(days) == datetime(2020, 2, 24, tzinfo=UTC)
    assert max(days) == datetime(2020, 3, 23, tzinfo=UTC)
    assert len(days) == 29


def test_sizes_not_offered_in_north_central_are_skipped_not_priced(sheets):
    sizes = {p.key.instance_type for p in sheets["us_north_central.csv"].points}
    assert sizes == {"Standard_NC6", "Standard_NC12", "Standard_NC24", "Standard_NC24r"}


def test_the_south_central_nc24s_v2_quirk_is_kept_and_flagged_as_a_spike(azure_logs, mapping, caplog):
    with caplog.at_level(logging.WARNING, logger="costopt.pricing.azure_sheets"):
        sheet = parse_azure_sheet(azure_logs / "cost" / "us_south_central.csv", mapping)
    day = datetime(2020, 2, 26, tzinfo=UTC)
    assert price(sheet, "southcentralus", "Standard_NC24s_v2", day) == 9.936
    assert len(sheet.spikes) == 1
    spike = sheet.spikes[0]
    assert spike.key.instance_type == "Standard_NC24s_v2"
    assert spike.valid_from == day
    assert spike.previous_usd_per_hour == 1.42085
    assert spike.usd_per_hour == 9.936
    assert spike.next_usd_per_hour == 1.9872
    assert spike.where == "us_south_central.csv line 4 column 'NC24s v2'"
    assert "us_south_central.csv line 4 column 'NC24s v2'" in caplog.text
    assert "9.9360" in caplog.text


def test_no_other_sheet_has_a_spike(sheets):
    assert sheets["us_east.csv"].spikes == []
    assert sheets["us_north_central.csv"].spikes == []


def test_instance_types_carry_the_mapping_gpus_and_the_size_table_shape(sheets):
    types = {t.name: t for s in sheets.values() for t in s.instance_types}
    assert len(types) == 12
    nc6 = types["Standard_NC6"]
    assert (nc6.accelerator, nc6.gpu_count, nc6.vcpus, nc6.memory_gib, nc6.source) == ("k80", 1, 6, 56, "azure-sheet")
    assert types["Standard_NC24rs_v3"].accelerator == "v100"
    assert types["Standard_NC12s_v2"].accelerator == "p100"
    assert types["Standard_NC12s_v2"].gpu_count == 2


def test_north_central_lists_only_the_types_it_prices(sheets):
    assert {t.name for t in sheets["us_north_central.csv"].instance_types} == {
        "Standard_NC6",
        "Standard_NC12",
        "Standard_NC24",
        "Standard_NC24r",
    }


# --- naming -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sheet", "arm"),
    [
        ("NC6", "Standard_NC6"),
        ("NC24r", "Standard_NC24r"),
        ("NC6s v3", "Standard_NC6s_v3"),
        ("NC24rs  v2", "Standard_NC24rs_v2"),
    ],
)
def test_sheet_sizes_map_to_arm_size_names(sheet, arm):
    assert sheet_size_to_arm(sheet) == arm


def test_a_file_of_unknown_name_needs_an_explicit_region(tmp_path):
    with pytest.raises(NotPriceData, match="region="):
        region_of_sheet(tmp_path / "eu_west.csv")


# --- bad input ----------------------------------------------------------------------------------


def write(tmp_path: Path, text: str, name: str = "us_east.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_bad_cell_is_reported_with_its_line_and_column(tmp_path, mapping):
    path = write(tmp_path, HEADER + "2/24/2020,$0.12,$0.60\n2/25/2020,$0.12,abc\n2/26/2020,,$0.61\n")
    sheet = parse_azure_sheet(path, mapping)
    assert sheet.problems.bad == 1
    assert sheet.problems.reasons == ["us_east.csv line 3 column 'NC6s v3': price is not a dollar amount: 'abc'"]
    assert sheet.problems.skipped == 1
    assert len(sheet.points) == 4


def test_strict_mode_raises_at_the_first_bad_cell(tmp_path, mapping):
    path = write(tmp_path, HEADER + "2/24/2020,$0.12,$-0.60\n")
    with pytest.raises(BadRecord, match=r"us_east\.csv line 2 column 'NC6s v3'"):
        parse_azure_sheet(path, mapping, strict=True)


@pytest.mark.parametrize(
    ("row", "where", "why"),
    [
        ("2020-02-24,$0.12,$0.60", "line 2 column 'Date'", "Date is not M/D/YYYY"),
        ("2/24/2020,$0.12", "line 2", "expected 3 cells, got 2"),
        ("2/24/2020,$nan,$0.60", "line 2 column 'NC6'", "not a dollar amount"),
        ("2/24/2020,$5000,$0.60", "line 2 column 'NC6'", "absurd price"),
    ],
)
def test_bad_rows_and_cells_are_bad_records(tmp_path, mapping, row, where, why):
    sheet = parse_azure_sheet(write(tmp_path, HEADER + row + "\n"), mapping)
    assert sheet.problems.bad == 1
    assert where in sheet.problems.reasons[0]
    assert why in sheet.problems.reasons[0]


def test_a_repeated_day_is_a_bad_record(tmp_path, mapping):
    sheet = parse_azure_sheet(write(tmp_path, HEADER + "2/24/2020,$0.1,$0.6\n2/24/2020,$0.1,$0.6\n"), mapping)
    assert sheet.problems.reasons == ["us_east.csv line 3 column 'Date': 2/24/2020 repeats line 2"]


def test_a_size_missing_from_the_mapping_refuses_the_file(tmp_path, mapping):
    with pytest.raises(MalformedInput, match=r"instance_mapping\.csv"):
        parse_azure_sheet(write(tmp_path, "Date,NC6,ND40rs v2\n2/24/2020,$0.1,$9\n"), mapping)


def test_a_file_without_a_date_column_is_malformed(tmp_path, mapping):
    with pytest.raises(MalformedInput, match="'Date'"):
        parse_azure_sheet(write(tmp_path, "Day,NC6\n2/24/2020,$0.1\n"), mapping)


def test_an_explicit_region_overrides_the_file_name(tmp_path, mapping):
    path = write(tmp_path, HEADER + "2/24/2020,$0.1,$0.6\n", "x.csv")
    sheet = parse_azure_sheet(path, mapping, region="westeurope")
    assert {p.key.region for p in sheet.points} == {"westeurope"}


def test_a_bad_instance_mapping_row_is_refused_with_its_line(tmp_path):
    path = write(tmp_path, "Instance,GPU type,# GPUs\nNC6,K80,1\nNC12,K80,two\n", "instance_mapping.csv")
    with pytest.raises(BadRecord, match=r"instance_mapping\.csv line 3"):
        load_instance_mapping(path)
