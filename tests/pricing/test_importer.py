"""The importer: real recorded files of ../shared/data into the store (SQLite and PostgreSQL),
detection by content, all-or-nothing refusal of malformed and bad files, idempotent re-imports."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import Engine

from costopt.domain import Cloud, InstanceType, Market, OfferKey
from costopt.errors import BadRecord, MalformedInput, NotPriceData
from pricing.importer import (
    AWS_CSV,
    AWS_PAGE,
    AZURE_CSV,
    AZURE_PAGE,
    AZURE_SHEET,
    GCP_CSV,
    GCP_PAGE,
    LIST_PRICES,
    ImportReport,
    detect_kind,
    import_file,
    import_paths,
    seed_paths,
)
from pricing.store import PriceStore

PROJECT = Path(__file__).resolve().parents[2]
LIST_PRICES_CSV = PROJECT / "data" / "catalog" / "list_prices.csv"

AWS_CSV_NAME = "prices/aws_spot_price_history_2019-12_2020-03_p2_p3.csv"
AZURE_CSV_NAME = "prices/azure_spot_price_daily_2020-02_2020-03.csv"
GCP_CSV_NAME = "prices/gcp_gpu_vm_prices_history.csv"
PROBES_NAME = "prices/gcp_preemptible_price_probes_2020-02_2020-03.csv"
THROUGHPUT_NAME = "prices/gavel_oracle_throughputs_k80_p100_v100.json"
LOGS = "raw/training_on_a_dime/logs"
AWS_PAGES = f"{LOGS}/aws/cost"
AZURE_SHEETS = f"{LOGS}/azure/cost"
KEY = ["cloud", "region", "zone", "instance_type", "market"]


@pytest.fixture
def store(engine: Engine) -> PriceStore:
    return PriceStore(engine)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def change_points(frame: pd.DataFrame, key: list[str], time: str, price: str) -> pd.DataFrame:
    """The change points of event rows computed independently of the store: per key, by time, the
    rows whose price differs from the previous row's."""
    ordered = frame.sort_values([*key, time]).reset_index(drop=True)
    prev = ordered.groupby(key)[price].shift()
    return ordered[prev.isna() | (prev != ordered[price])].reset_index(drop=True)


def stored(store: PriceStore, cloud: Cloud) -> pd.DataFrame:
    """Every stored change point of ``cloud`` as (key..., valid_from, usd_per_hour), sorted."""
    frame = store.history(utc(2000, 1, 1), utc(2100, 1, 1), cloud=cloud)
    return frame[[*KEY, "valid_from", "usd_per_hour"]].sort_values([*KEY, "valid_from"]).reset_index(drop=True)


def aws_csv_change_points(shared_data: Path) -> pd.DataFrame:
    raw = pd.read_csv(shared_data / AWS_CSV_NAME)
    events = pd.DataFrame(
        {
            "cloud": "aws",
            "region": raw["region"],
            "zone": raw["availability_zone"],
            "instance_type": raw["instance_type"],
            "market": "spot",
            "valid_from": pd.to_datetime(raw["timestamp_utc"], utc=True),
            "usd_per_hour": raw["spot_usd_per_hour"].astype(float),
        }
    )
    return change_points(events, KEY, "valid_from", "usd_per_hour")


def step_function(points: pd.DataFrame) -> pd.DataFrame:
    """The change points of a set of points: consecutive repeats of a price per key dropped. (The
    store keeps a repeat that a late older point left behind, so arrival order may leave some.)"""
    points = points.sort_values([*KEY, "valid_from"]).reset_index(drop=True)
    same_key = (points[KEY].shift() == points[KEY]).all(axis=1)
    repeat = same_key & (points["usd_per_hour"].shift() == points["usd_per_hour"])
    return points[~repeat].reset_index(drop=True)


def assert_same_points(got: pd.DataFrame, want: pd.DataFrame) -> None:
    got = got.sort_values([*KEY, "valid_from"]).reset_index(drop=True)
    want = want.sort_values([*KEY, "valid_from"]).reset_index(drop=True)
    assert len(got) == len(want)
    assert (got[KEY].to_numpy() == want[KEY].to_numpy()).all()
    assert (got["valid_from"].to_numpy() == want["valid_from"].dt.as_unit(got["valid_from"].dt.unit).to_numpy()).all()
    assert got["usd_per_hour"].tolist() == pytest.approx(want["usd_per_hour"].tolist())


# --------------------------------------------------------------------------------------------- detection


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        (AWS_CSV_NAME, AWS_CSV),
        (AZURE_CSV_NAME, AZURE_CSV),
        (GCP_CSV_NAME, GCP_CSV),
        (f"{AWS_PAGES}/us-east-1/2020-03-05.p3.2xlarge.json", AWS_PAGE),
        (f"{AWS_PAGES}/us-west-1/p2.xlarge.json", AWS_PAGE),
        (f"{AZURE_SHEETS}/us_east.csv", AZURE_SHEET),
    ],
)
def test_real_price_files_are_told_apart_by_content(shared_data: Path, name: str, kind: str) -> None:
    assert detect_kind(shared_data / name) == kind


def test_the_curated_list_prices_are_a_price_file() -> None:
    assert detect_kind(LIST_PRICES_CSV) == LIST_PRICES


def test_kind_comes_from_content_not_from_the_file_name(tmp_path: Path) -> None:
    page = tmp_path / "recorded.txt"
    page.write_text(json.dumps({"SpotPriceHistory": [], "NextToken": ""}))
    daily = tmp_path / "whatever.dat"
    daily.write_text("date,region,vm_size,gpu_type,gpu_count,spot_usd_per_hour\n2020-02-24,eastus,NC6,k80,1,0.1\n")
    assert detect_kind(page) == AWS_PAGE
    assert detect_kind(daily) == AZURE_CSV


@pytest.mark.parametrize(
    ("name", "says"),
    [
        (PROBES_NAME, "formula"),
        ("prices/README.md", "Markdown document"),
        (THROUGHPUT_NAME, "throughput"),
        ("raw/training_on_a_dime/LICENSE", "license"),
        (f"{LOGS}/aws/availability/persistent_2020-03-15.out", "log file"),
        (f"{LOGS}/azure/instance_mapping.csv", "mapping"),
    ],
)
def test_files_that_are_not_prices_are_refused_naming_the_file_and_what_it_is(
    shared_data: Path, name: str, says: str
) -> None:
    with pytest.raises(NotPriceData) as err:
        detect_kind(shared_data / name)
    assert str(shared_data / name) in str(err.value)
    assert says in str(err.value)


def test_seed_paths_are_the_price_csvs_the_raw_aws_pages_the_azure_sheets_and_the_list_prices(
    shared_data: Path,
) -> None:
    paths = seed_paths(shared_data, PROJECT / "data" / "catalog")
    assert paths == [
        shared_data / AWS_CSV_NAME,
        shared_data / AZURE_CSV_NAME,
        shared_data / GCP_CSV_NAME,
        shared_data / AWS_PAGES,
        shared_data / AZURE_SHEETS / "us_east.csv",
        shared_data / AZURE_SHEETS / "us_north_central.csv",
        shared_data / AZURE_SHEETS / "us_south_central.csv",
        LIST_PRICES_CSV,
    ]


# --------------------------------------------------------------------------------------------- AWS


def test_aws_csv_stores_one_point_per_price_change(store: PriceStore, shared_data: Path) -> None:
    expected = aws_csv_change_points(shared_data)
    report = import_file(store, shared_data / AWS_CSV_NAME)
    assert (report.kind, report.status, report.points_read) == (AWS_CSV, "imported", 16_560)
    assert report.inserted == len(expected) == store.count_points()
    assert report.unchanged == 16_560 - len(expected)
    assert_same_points(stored(store, Cloud.AWS), expected)
    p3 = next(t for t in store.instance_types(Cloud.AWS) if t.name == "p3.8xlarge")
    assert (p3.accelerator, p3.gpu_count) == ("v100", 4.0)


def test_price_at_a_time_is_the_csv_price_in_effect_then(store: PriceStore, shared_data: Path) -> None:
    import_file(store, shared_data / AWS_CSV_NAME)
    raw = pd.read_csv(shared_data / AWS_CSV_NAME)
    rows = raw[(raw["availability_zone"] == "us-east-1b") & (raw["instance_type"] == "p3.2xlarge")]
    times = pd.to_datetime(rows["timestamp_utc"], utc=True)
    key = OfferKey(Cloud.AWS, "us-east-1", "us-east-1b", "p3.2xlarge", Market.SPOT)
    for at in (utc(2020, 1, 15, 12), utc(2020, 2, 20, 3, 30), utc(2020, 3, 23, 23)):
        in_effect = rows[times <= at].iloc[times[times <= at].argmax()]
        offer = store.price_at(key, at)
        assert offer is not None
        assert offer.usd_per_hour == pytest.approx(float(in_effect["spot_usd_per_hour"]))
        assert offer.source == "aws-spot"
    assert store.price_at(key, times.min() - pd.Timedelta(seconds=1)) is None


@pytest.mark.slow
# The two orders of the 270 raw AWS pages and the CSV (8-25 s each) run on one backend each: the CSV then the
# pages on SQLite, the pages then the CSV on PostgreSQL (both backends' import paths stay covered).
@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)
def test_raw_aws_pages_after_the_csv_insert_nothing(store: PriceStore, shared_data: Path) -> None:
    import_file(store, shared_data / AWS_CSV_NAME)
    before = store.count_points()
    reports = import_paths(store, [shared_data / AWS_PAGES])
    assert len(reports) == 270
    assert {r.status for r in reports} == {"imported", "partial"}
    assert sum(r.points_read for r in reports) == 16_973
    assert sum(r.inserted for r in reports) == 0
    assert store.count_points() == before


@pytest.mark.slow
@pytest.mark.parametrize("engine", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_raw_aws_pages_give_the_csv_points_and_the_csv_after_them_inserts_nothing(
    store: PriceStore, shared_data: Path
) -> None:
    import_paths(store, [shared_data / AWS_PAGES])
    # Pages are read in name order (weekly pulls first, the older first pull last): the step
    # function is the CSV's, a few repeats left behind by the late older pages are kept.
    assert_same_points(step_function(stored(store, Cloud.AWS)), aws_csv_change_points(shared_data))
    report = import_file(store, shared_data / AWS_CSV_NAME)
    assert (report.inserted, report.unchanged) == (0, 16_560)


def test_the_cut_p2_xlarge_page_is_imported_and_reported_partial(store: PriceStore, shared_data: Path) -> None:
    report = import_file(store, shared_data / AWS_PAGES / "us-east-1" / "p2.xlarge.json")
    assert (report.status, report.points_read) == ("partial", 1000)
    assert report.inserted > 0
    assert any("NextToken" in w for w in report.warnings)


def test_an_empty_aws_page_imports_zero_points(store: PriceStore, shared_data: Path) -> None:
    report = import_file(store, shared_data / AWS_PAGES / "us-west-1" / "p2.xlarge.json")
    assert (report.status, report.points_read, report.inserted, report.error) == ("imported", 0, 0, None)


# --------------------------------------------------------------------------------------------- Azure


def azure_csv_change_points(shared_data: Path) -> pd.DataFrame:
    raw = pd.read_csv(shared_data / AZURE_CSV_NAME).dropna(subset=["spot_usd_per_hour"])
    events = pd.DataFrame(
        {
            "cloud": "azure",
            "region": raw["region"],
            "zone": "",
            "instance_type": "Standard_" + raw["vm_size"].str.replace(" ", "_"),
            "market": "spot",
            "valid_from": pd.to_datetime(raw["date"], utc=True),
            "usd_per_hour": raw["spot_usd_per_hour"].astype(float),
        }
    )
    return change_points(events, KEY, "valid_from", "usd_per_hour")


def test_azure_raw_sheets_and_the_normalized_csv_give_the_same_points(store: PriceStore, shared_data: Path) -> None:
    sheets = import_paths(store, [shared_data / f"{LOGS}/azure"])
    assert [(r.path.name, r.status) for r in sheets] == [
        ("us_east.csv", "imported"),
        ("us_north_central.csv", "imported"),
        ("us_south_central.csv", "imported"),
        ("instance_mapping.csv", "skipped"),
    ]
    assert sum(r.skipped_records for r in sheets) == 232
    from_sheets = stored(store, Cloud.AZURE)
    assert_same_points(from_sheets, azure_csv_change_points(shared_data))
    report = import_file(store, shared_data / AZURE_CSV_NAME)
    assert (report.points_read, report.inserted, report.unchanged, report.skipped_records) == (812, 0, 812, 232)
    assert_same_points(stored(store, Cloud.AZURE), from_sheets)


def test_the_9_936_typo_of_the_south_central_sheet_is_kept_and_flagged(store: PriceStore, shared_data: Path) -> None:
    report = import_file(store, shared_data / AZURE_SHEETS / "us_south_central.csv")
    key = OfferKey(Cloud.AZURE, "southcentralus", "", "Standard_NC24s_v2", Market.SPOT)
    offer = store.price_at(key, utc(2020, 2, 26, 12))
    assert offer is not None
    assert offer.usd_per_hour == pytest.approx(9.936)
    assert any("9.936" in w and "Standard_NC24s_v2" in w for w in report.warnings)
    after = store.price_at(key, utc(2020, 2, 27, 12))
    assert after is not None
    assert after.usd_per_hour == pytest.approx(1.9872)


def test_learned_instance_types_never_overwrite_known_rows(store: PriceStore, shared_data: Path) -> None:
    richer = InstanceType(Cloud.AZURE, "Standard_NC6", "k80", 1, 6, 56.0, "tod-azure-mapping;hf-energy-cost")
    store.upsert_instance_types([richer])
    import_file(store, shared_data / AZURE_CSV_NAME)
    types = {t.name: t for t in store.instance_types(Cloud.AZURE)}
    assert types["Standard_NC6"] == richer
    assert len(types) == 12
    assert (types["Standard_NC24rs_v3"].accelerator, types["Standard_NC24rs_v3"].gpu_count) == ("v100", 4.0)
    assert types["Standard_NC24rs_v3"].source == "azure-sheet"


# --------------------------------------------------------------------------------------------- GCP


@pytest.mark.one_backend_each  # SQLite (the reimport test imports the file on PostgreSQL)
def test_gcp_history_imports_fractional_shapes_and_date_only_snapshots(store: PriceStore, shared_data: Path) -> None:
    raw = pd.read_csv(shared_data / GCP_CSV_NAME, dtype=str, keep_default_na=False)
    report = import_file(store, shared_data / GCP_CSV_NAME)
    with_spot = int((raw["spot_usd_per_hour"] != "").sum())
    assert (report.status, report.points_read) == ("imported", len(raw) + with_spot)
    assert report.skipped_records == len(raw) - with_spot == 811
    # A date-only snapshot holds from that UTC day's 00:00.
    key = OfferKey(Cloud.GCP, "asia-east1", "", "a2-highgpu-1g", Market.ON_DEMAND)
    offer = store.price_at(key, utc(2022, 2, 9))
    assert offer is not None
    assert offer.usd_per_hour == pytest.approx(3.65768)
    assert offer.valid_from == utc(2022, 2, 9)
    assert store.price_at(key, utc(2022, 2, 8, 23, 59)) is None
    # A shape with an empty gpu_count (a fraction of a GPU) still gets its prices, but no learned type.
    fractional = raw[(raw["gpu_count"] == "") & (raw["spot_usd_per_hour"] != "")].iloc[-1]
    spot = OfferKey(Cloud.GCP, fractional["region"], "", fractional["machine_type"], Market.SPOT)
    offer = store.price_at(spot, utc(2030, 1, 1))
    assert offer is not None
    assert offer.usd_per_hour == pytest.approx(float(fractional["spot_usd_per_hour"]))
    types = {t.name: t for t in store.instance_types(Cloud.GCP)}
    assert fractional["machine_type"] not in types
    assert types["a2-ultragpu-1g"].accelerator == "a100-80gb"  # the history's newest label wins
    assert types["g4-standard-48"].accelerator == "rtx-pro-6000"


# --------------------------------------------------------------------------------------------- idempotence


@pytest.mark.one_backend_each  # the backends in turn (tests/conftest.py): the two large CSVs on one each
@pytest.mark.parametrize(
    "name",
    [
        GCP_CSV_NAME,
        AWS_CSV_NAME,
        AZURE_CSV_NAME,
        f"{AWS_PAGES}/eu-west-1/2020-03-13.p3.2xlarge.json",
        f"{AZURE_SHEETS}/us_east.csv",
        "list_prices",
    ],
)
def test_reimporting_a_file_changes_nothing(store: PriceStore, shared_data: Path, name: str) -> None:
    path = LIST_PRICES_CSV if name == "list_prices" else shared_data / name
    first = import_file(store, path)
    count = store.count_points()
    again = import_file(store, path)
    assert first.inserted > 0
    assert (again.inserted, again.unchanged, again.points_read) == (0, first.points_read, first.points_read)
    assert store.count_points() == count


# --------------------------------------------------------------------------------------------- folders, refusals


def test_a_folder_import_skips_what_is_not_prices(store: PriceStore, shared_data: Path) -> None:
    seen: list[ImportReport] = []
    reports = import_paths(store, [shared_data / "prices"], progress=seen.append)
    assert seen == reports
    status = {r.path.name: r.status for r in reports}
    assert status == {
        "README.md": "skipped",
        "aws_spot_price_history_2019-12_2020-03_p2_p3.csv": "imported",
        "azure_spot_price_daily_2020-02_2020-03.csv": "imported",
        "gavel_oracle_throughputs_k80_p100_v100.json": "skipped",
        "gcp_gpu_vm_prices_history.csv": "imported",
        "gcp_preemptible_price_probes_2020-02_2020-03.csv": "skipped",
    }
    skipped = {r.path.name: r.error or "" for r in reports if r.status == "skipped"}
    assert "formula" in skipped["gcp_preemptible_price_probes_2020-02_2020-03.csv"]
    assert "throughput" in skipped["gavel_oracle_throughputs_k80_p100_v100.json"]
    assert store.count_points() == sum(r.inserted for r in reports)


@pytest.mark.parametrize(
    ("name", "says"), [(PROBES_NAME, "formula"), ("prices/README.md", "Markdown"), (THROUGHPUT_NAME, "throughput")]
)
def test_a_named_file_that_is_not_prices_is_refused_and_stores_nothing(
    store: PriceStore, shared_data: Path, name: str, says: str
) -> None:
    [report] = import_paths(store, [shared_data / name])
    assert report.status == "refused"
    assert report.error is not None
    assert name.split("/")[-1] in report.error
    assert says in report.error
    with pytest.raises(NotPriceData, match=says):
        import_file(store, shared_data / name)
    assert store.count_points() == 0


# --------------------------------------------------------------------------------------------- bad input

AWS_HEADER = (
    "timestamp_utc,region,availability_zone,instance_type,gpu_type,gpu_count,product_description,spot_usd_per_hour"
)


def aws_csv(path: Path, change: Callable[[list[str]], None] = lambda rows: None) -> Path:
    """A valid 8-row normalized AWS CSV (data on lines 2..9), edited by ``change`` (rows[i] is line i + 2)."""
    rows = [
        f"2020-01-0{d}T10:00:00Z,us-east-1,us-east-1b,p3.2xlarge,v100,1,Linux/UNIX,{0.9 + d / 100:.4f}"
        for d in range(1, 9)
    ]
    change(rows)
    path.write_text("\n".join([AWS_HEADER, *rows]) + "\n")
    return path


def aws_page(path: Path, change: Callable[[list[dict[str, str]]], None] = lambda recs: None) -> Path:
    records = [
        {
            "AvailabilityZone": "us-east-1b",
            "InstanceType": "p3.2xlarge",
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": f"{0.9 + i / 100:.6f}",
            "Timestamp": f"2020-01-0{i + 1}T10:00:00.000Z",
        }
        for i in range(5)
    ]
    change(records)
    path.write_text(json.dumps({"NextToken": "", "SpotPriceHistory": records}, indent=4))
    return path


def set_cell(row: int, column: int, value: str) -> Callable[[list[str]], None]:
    def change(rows: list[str]) -> None:
        cells = rows[row].split(",")
        cells[column] = value
        rows[row] = ",".join(cells)

    return change


def truncated_page(tmp_path: Path) -> Path:
    path = aws_page(tmp_path / "p3.2xlarge.json")
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    return path


def page_without_spot_price(tmp_path: Path) -> Path:
    def drop(records: list[dict[str, str]]) -> None:
        del records[2]["SpotPrice"]

    return aws_page(tmp_path / "p3.2xlarge.json", drop)


def csv_with_text_price_on_line_7(tmp_path: Path) -> Path:
    return aws_csv(tmp_path / "aws_spot_price_history_x.csv", set_cell(5, 7, "cheap"))


def csv_with_negative_price(tmp_path: Path) -> Path:
    return aws_csv(tmp_path / "aws_spot_price_history_x.csv", set_cell(3, 7, "-0.5"))


def csv_with_nan_price(tmp_path: Path) -> Path:
    return aws_csv(tmp_path / "aws_spot_price_history_x.csv", set_cell(3, 7, "NaN"))


def csv_with_absurd_price(tmp_path: Path) -> Path:
    return aws_csv(tmp_path / "aws_spot_price_history_x.csv", set_cell(3, 7, "4500"))


def csv_with_unknown_timestamp(tmp_path: Path) -> Path:
    return aws_csv(tmp_path / "aws_spot_price_history_x.csv", set_cell(2, 0, "01/04/2020 10:00"))


def csv_with_missing_zone(tmp_path: Path) -> Path:
    return aws_csv(tmp_path / "aws_spot_price_history_x.csv", set_cell(6, 2, ""))


def csv_with_a_short_row(tmp_path: Path) -> Path:
    def cut(rows: list[str]) -> None:
        rows[4] = rows[4].rsplit(",", 2)[0]

    return aws_csv(tmp_path / "aws_spot_price_history_x.csv", cut)


def csv_with_wrong_header(tmp_path: Path) -> Path:
    path = aws_csv(tmp_path / "aws_spot_price_history_x.csv")
    path.write_text(path.read_text().replace("spot_usd_per_hour", "price", 1))
    return path


def not_a_csv(tmp_path: Path) -> Path:
    path = tmp_path / "prices.csv"
    path.write_text("this is not a table\n")
    return path


def sheet_with_bad_cell(tmp_path: Path) -> Path:
    (tmp_path / "cost").mkdir()
    (tmp_path / "instance_mapping.csv").write_text("Instance,GPU type,# GPUs\nNC6,K80,1\nNC12,K80,2\n")
    path = tmp_path / "cost" / "us_east.csv"
    path.write_text("Date,NC12,NC6\n2/24/2020,$0.24552,$0.12276\n2/25/2020,$0.24552,about $0.12\n")
    return path


def sheet_without_mapping(tmp_path: Path) -> Path:
    (tmp_path / "cost").mkdir()
    path = tmp_path / "cost" / "us_east.csv"
    path.write_text("Date,NC12,NC6\n2/24/2020,$0.24552,$0.12276\n")
    return path


def gcp_with_bad_snapshot(tmp_path: Path) -> Path:
    path = tmp_path / "gcp_gpu_vm_prices_history.csv"
    path.write_text(
        "snapshot_utc,source_commit,machine_type,gpu_type,gpu_count,region,ondemand_usd_per_hour,spot_usd_per_hour\n"
        "2022-02-09,d4890e9,a2-highgpu-1g,a100,1,asia-east1,3.65768,\n"
        "Feb 10 2022,d4890e9,a2-highgpu-1g,a100,1,asia-east1,3.7,\n"
    )
    return path


@pytest.mark.one_backend_each  # refused before any write: each case on one backend, both in turn
@pytest.mark.parametrize(
    ("make", "error", "where", "says"),
    [
        (truncated_page, MalformedInput, "line", "truncated"),
        (page_without_spot_price, BadRecord, "record 2", "missing field SpotPrice"),
        (csv_with_text_price_on_line_7, BadRecord, "line 7", "not a number: 'cheap'"),
        (csv_with_negative_price, BadRecord, "line 5", "negative price"),
        (csv_with_nan_price, BadRecord, "line 5", "NaN"),
        (csv_with_absurd_price, BadRecord, "line 5", "absurd price"),
        (csv_with_unknown_timestamp, BadRecord, "line 4", "unknown timestamp format"),
        (csv_with_missing_zone, BadRecord, "line 8", "missing availability_zone"),
        (csv_with_a_short_row, BadRecord, "line 6", "expected 8 fields"),
        (csv_with_wrong_header, MalformedInput, "wrong header", "expected"),
        (not_a_csv, MalformedInput, "not a CSV", "first line"),
        (sheet_with_bad_cell, BadRecord, "line 3 column 'NC6'", "not a dollar amount"),
        (sheet_without_mapping, MalformedInput, "instance_mapping.csv", "expected"),
        (gcp_with_bad_snapshot, BadRecord, "line 3", "unknown timestamp format"),
    ],
)
def test_a_malformed_or_bad_file_raises_naming_file_and_place_and_stores_nothing(
    store: PriceStore,
    tmp_path: Path,
    make: Callable[[Path], Path],
    error: type[Exception],
    where: str,
    says: str,
) -> None:
    import_file(store, LIST_PRICES_CSV)
    before = store.count_points()
    path = make(tmp_path)
    with pytest.raises(error) as err:
        import_file(store, path)
    message = str(err.value)
    assert str(path) in message
    assert where in message
    assert says in message
    assert store.count_points() == before
    if path.name == "us_east.csv" and error is MalformedInput:
        assert str(tmp_path / "instance_mapping.csv") in message  # where the mapping is expected


def test_the_synthetic_files_are_valid_before_they_are_spoiled(store: PriceStore, tmp_path: Path) -> None:
    reports = import_paths(store, [aws_csv(tmp_path / "a.csv"), aws_page(tmp_path / "b.json")])
    assert [(r.kind, r.status, r.points_read) for r in reports] == [(AWS_CSV, "imported", 8), (AWS_PAGE, "imported", 5)]


def test_the_error_names_the_first_of_several_bad_lines(tmp_path: Path, store: PriceStore) -> None:
    def spoil(rows: list[str]) -> None:
        set_cell(5, 7, "x")(rows)
        set_cell(1, 0, "yesterday")(rows)

    with pytest.raises(BadRecord, match=r"line 3: unknown timestamp format .* \(first of 2 bad records\)") as caught:
        import_file(store, aws_csv(tmp_path / "two_bad.csv", spoil))
    assert caught.value.count == 2  # carried through the file-naming re-raise
    (status,) = store.sources()
    assert (status.last_bad_records, status.total_bad_records, status.total_refused_pages) == (2, 2, 1)


def test_two_prices_for_one_offer_at_one_time_are_a_bad_record(tmp_path: Path, store: PriceStore) -> None:
    def clash(rows: list[str]) -> None:
        rows[3] = rows[2].replace("0.9300", "0.9999")

    with pytest.raises(BadRecord, match=r"line 4 \(and line 5\): .*several prices \(0\.93, 0\.9999\)"):
        import_file(store, aws_csv(tmp_path / "clash.csv", clash))
    assert store.count_points() == 0


def test_a_bad_file_fails_alone_and_the_other_files_are_imported(store: PriceStore, tmp_path: Path) -> None:
    bad = csv_with_negative_price(tmp_path)
    good = aws_page(tmp_path / "good.json")
    reports = import_paths(store, [bad, good])
    assert [r.status for r in reports] == ["failed", "imported"]
    assert reports[0].error is not None
    assert "negative price" in reports[0].error
    assert store.count_points() == reports[1].inserted == 5


# --------------------------------------------------------------------------------------------- the kinds registry


def test_the_kinds_are_one_registry_and_an_unknown_kind_lists_them(tmp_path: Path) -> None:
    from pricing.importer import KINDS, PRICE_KINDS, UnknownFileKind

    assert KINDS.names() == (AWS_PAGE, AWS_CSV, AZURE_SHEET, AZURE_CSV, GCP_CSV, LIST_PRICES, GCP_PAGE, AZURE_PAGE)
    assert frozenset(KINDS.names()) == PRICE_KINDS
    with pytest.raises(UnknownFileKind) as info:
        KINDS.get("aws-spot-pages")
    assert info.value.close[0] == AWS_PAGE
    assert all(name in str(info.value) for name in KINDS.names())
    # every kind told by its header is detected from that header alone, in any column order
    for name, kind in KINDS.items():
        if kind.header is None:
            continue
        f = tmp_path / f"{name}.csv"
        f.write_text(",".join(reversed(kind.header)) + "\n")
        assert detect_kind(f) == name
