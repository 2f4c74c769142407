"""The composition root builds what the settings ask for, and only that."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from api.wiring import build_hazards, build_sim_hazards, build_sources, source_intervals
from costopt.risk.hazard import HazardModel
from costopt.settings import Settings


def test_every_collector_is_built_with_a_schedule() -> None:
    settings = Settings()
    names = [s.name for s in build_sources(settings)]
    assert names == ["aws-spot", "aws-on-demand", "gcp", "azure", "aws-catalog"]
    intervals = source_intervals(settings)
    assert all(intervals[n] > 0 for n in names)


def test_azure_sku_discovery_is_scheduled_only_with_a_subscription() -> None:
    names = [s.name for s in build_sources(Settings(azure_subscription_id="sub-123"))]
    assert names[-1] == "azure-skus"


def test_asking_for_an_unknown_source_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="aws-spot"):
        build_sources(Settings(), ["nope"])


def _log(path: Path, lines: list[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"[{at}] {msg}\n" for at, msg in lines), encoding="utf-8")


def test_the_hazards_are_parsed_once_while_the_logs_are_unchanged_and_again_when_one_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import costopt.risk.availability as availability

    log = tmp_path / "logs" / "run1" / "availability" / "aws.out"
    created = ("2020-02-01T00:00:00Z", "Created instance i-1 with 1 GPU(s) of type v100 in zone us-east-1a")
    gone = ("2020-02-01T02:00:00Z", "Instance i-1 not running in zone us-east-1a")
    _log(log, [created, gone])  # one V100 preempted after 2 hours
    parses: list[int] = []
    real = availability.parse_availability_log

    def counting(*args: Any, **kw: Any) -> Any:
        parses.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(availability, "parse_availability_log", counting)
    settings = Settings(availability_logs_dir=tmp_path / "logs")
    first = build_hazards(settings)
    assert build_hazards(settings) is first and len(parses) == 1  # unchanged files: parsed once
    later = ("2020-02-01T12:00:00Z", "Instance i-1 not running in zone us-east-1a")
    _log(log, [created, later])  # now 12 hours before the preemption: a lower rate, and a new size
    again = build_hazards(settings)
    assert len(parses) == 2 and again is not first and again != first
    assert build_hazards(Settings(availability_logs_dir=tmp_path / "none")) == HazardModel()  # no logs: defaults


def test_the_simulated_clouds_reclaim_rate_is_its_setting_when_set_and_the_planners_hazards_otherwise(
    tmp_path: Path,
) -> None:
    from costopt.domain import Cloud, Market

    settings = Settings(availability_logs_dir=tmp_path / "none", sim_spot_hazard_per_hour=0.4)
    hazards = build_sim_hazards(settings)
    for cloud, zone, acc in (
        (Cloud.AWS, "us-east-1a", "v100"),
        (Cloud.GCP, "us-west1-b", "k80"),
        (Cloud.SIM, "", None),
    ):
        assert hazards.rate(cloud, zone[:-2] or "r", zone, acc, 1, Market.SPOT) == 0.4  # every spot offer alike
        assert hazards.rate(cloud, "r", zone, acc, 1, Market.ON_DEMAND) == 0.0
    assert build_hazards(settings) == HazardModel()  # the planner's hazards are not the simulated cloud's
    unset = Settings(availability_logs_dir=tmp_path / "none")
    assert build_sim_hazards(unset) == build_hazards(unset)
