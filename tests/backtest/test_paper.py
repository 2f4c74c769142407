"""The paper's method on the real 2020 data, checked against figures computed by hand from the CSVs."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from costopt.backtest.grid import BacktestError
from costopt.backtest.paper import (
    PAPER_POLICIES,
    PaperInputs,
    dynamic_benefit,
    first_list_prices,
    load_paper_inputs,
    paper_backtest,
    run_paper_backtest,
)
from costopt.domain import Cloud, Market

RESNET = "ResNet-50 (batch size 128)"
AWS_CSV = "prices/aws_spot_price_history_2019-12_2020-03_p2_p3.csv"


def end_of_day_prices(shared_data: Path, region: str, instance_type: str, day: date) -> pd.Series:
    """Per zone: the last price change before the end of ``day`` (read straight from the CSV)."""
    raw = pd.read_csv(shared_data / AWS_CSV)
    raw = raw[(raw["region"] == region) & (raw["instance_type"] == instance_type)]
    t = pd.to_datetime(raw["timestamp_utc"], utc=True)
    end = pd.Timestamp(datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1))
    before = raw[t < end].assign(t=t[t < end]).sort_values("t")
    return before.groupby("availability_zone")["spot_usd_per_hour"].last()


@pytest.fixture(scope="module")
def resnet_day(paper_inputs: PaperInputs):
    return paper_backtest(paper_inputs, regions=("us-east-1",), models=(RESNET,), job_days=(1.0,))


def test_start_days_are_the_35th_to_the_6th_latest_days_with_a_p3_2xlarge_price_change(resnet_day) -> None:
    days = resnet_day.start_days["us-east-1"]
    assert len(days) == 30
    assert days[0] == date(2020, 2, 18) and days[-1] == date(2020, 3, 18)
    assert resnet_day.data_end["us-east-1"] == datetime(2020, 3, 24, tzinfo=UTC)


def test_baseline_of_a_one_v100_day_job_is_24_hours_at_the_cheapest_zones_end_of_day_price(
    resnet_day, shared_data: Path
) -> None:
    costs = resnet_day.results["us-east-1"]["baseline"].cost
    for day, cost in zip(resnet_day.start_days["us-east-1"], costs, strict=True):
        cheapest = float(end_of_day_prices(shared_data, "us-east-1", "p3.2xlarge", day).min())
        assert cost == pytest.approx(24 * cheapest, rel=1e-12)
    cell = next(c for c in resnet_day.cells if c.policy == "baseline")
    assert float(cell.mean_cost_usd) == pytest.approx(float(np.mean(costs)))
    assert cell.cost_reduction == 1.0


def test_multi_cloud_takes_azure_v100_once_it_exists_and_aws_v100_before(resnet_day, shared_data: Path) -> None:
    res = resnet_day.results["us-east-1"]["multi_cloud"]
    for day, cost in zip(resnet_day.start_days["us-east-1"], res.cost, strict=True):
        if day >= date(2020, 2, 24):  # Azure eastus NC12s_v3 all month: $1.20625 / 2 GPUs (NC6s_v3: 0.60313)
            assert cost == pytest.approx(24 * 1.20625 / 2, rel=1e-12)
        else:  # no Azure price yet (nothing back-filled): the cheapest AWS V100 per GPU
            per_gpu = min(
                float(end_of_day_prices(shared_data, "us-east-1", t, day).min()) / g
                for t, g in (("p3.2xlarge", 1), ("p3.8xlarge", 4), ("p3.16xlarge", 8))
            )
            assert cost == pytest.approx(24 * per_gpu)
    # a one-day job never reaches a second daily decision: dynamic is multi-cloud
    assert resnet_day.results["us-east-1"]["dynamic"].cost.tolist() == res.cost.tolist()


def test_paper_rows_are_json_objects_with_the_policy_names(paper_inputs: PaperInputs) -> None:
    rows = run_paper_backtest(paper_inputs, regions=("us-west-2",), job_days=(4.0,))
    assert len(rows) == 6 * len(PAPER_POLICIES)
    assert {r.policy for r in rows} == set(PAPER_POLICIES)
    first = rows[0].as_dict()
    assert set(first) == {"region", "model", "policy", "job_days", "cost_reduction"}
    assert first["region"] == "us-west-2" and first["job_days"] == 4.0
    assert all(r.cost_reduction == 1.0 for r in rows if r.policy == "baseline")


def test_on_the_real_data_dynamic_beats_static_multi_cloud_on_average_and_jobs_outliving_the_data_are_counted(
    paper_inputs: PaperInputs,
) -> None:
    result = paper_backtest(paper_inputs, regions=("us-east-1",))
    benefit = dynamic_benefit(result)
    models = [c for c in benefit.columns if c not in ("region", "job_days", "mean", "max")]
    assert (benefit[models].to_numpy() >= 1 - 1e-12).all()
    assert benefit.loc[benefit["job_days"] == 8.0, "max"].iloc[0] > 1.3
    # an 8-V100-day baseline job runs exactly 8 days: only those starting on 03-17 and 03-18 end after
    # the data (2020-03-24 00:00)
    baseline_8 = [c for c in result.cells if c.policy == "baseline" and c.job_days == 8.0]
    assert baseline_8 and all(c.outlived == 2 for c in baseline_8)
    again = paper_backtest(paper_inputs, regions=("us-east-1",))
    assert [r.cost_reduction for r in again.rows] == [r.cost_reduction for r in result.rows]


class FakeStore:
    """Only the ``history`` method of the price store, serving frames filtered like the store."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame

    def history(
        self,
        start: datetime,
        end: datetime,
        *,
        cloud: Cloud | None = None,
        region: str | None = None,
        market: Market | None = None,
    ) -> pd.DataFrame:
        f = self.frame
        m = (f["valid_from"] >= start) & (f["valid_from"] <= end)
        if cloud is not None:
            m &= f["cloud"] == cloud.value
        if region is not None:
            m &= f["region"] == region
        if market is not None:
            m &= f["market"] == market.value
        return f[m].reset_index(drop=True)


def test_the_loader_reads_any_store_with_a_history_method(shared_data: Path) -> None:
    def row(cloud: str, region: str, zone: str, itype: str, market: str, when: str, usd: float) -> tuple[object, ...]:
        return (cloud, region, zone, itype, market, pd.Timestamp(when, tz="UTC"), usd, "t")

    frame = pd.DataFrame(
        [
            row("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "spot", "2020-01-05", 0.95),
            row("aws", "us-east-1", "us-east-1a", "g4dn.xlarge", "spot", "2020-01-05", 0.2),  # not the paper's
            row("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "spot", "2026-01-05", 0.5),  # after the window
            row("aws", "eu-west-1", "eu-west-1a", "p3.2xlarge", "spot", "2020-01-05", 1.0),  # another region
            row("azure", "eastus", "", "Standard_NC6s_v3", "spot", "2020-02-24", 0.60313),
            row("aws", "us-east-1", "", "p3.2xlarge", "on_demand", "2020-05-06", 3.06),
            row("aws", "us-east-1", "", "p3.2xlarge", "on_demand", "2026-05-06", 3.5),
        ],
        columns=["cloud", "region", "zone", "instance_type", "market", "valid_from", "usd_per_hour", "source"],
    )
    inputs = load_paper_inputs(
        FakeStore(frame), shared_data / "prices/gavel_oracle_throughputs_k80_p100_v100.json", regions=("us-east-1",)
    )
    assert sorted(inputs.spot["usd_per_hour"]) == [0.60313, 0.95]
    assert inputs.list_prices["usd_per_hour"].tolist() == [3.06]  # the earliest: the 2020 list price
    assert inputs.throughputs[RESNET]["v100"] == pytest.approx(2.8459812117650305)
    with pytest.raises(BacktestError, match="none of the paper's spot prices"):
        load_paper_inputs(FakeStore(frame.iloc[:0]), shared_data / "prices/gavel_oracle_throughputs_k80_p100_v100.json")
    assert first_list_prices(frame.iloc[:0]).empty
