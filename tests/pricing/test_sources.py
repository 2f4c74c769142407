"""The price-source registry: names, intervals and requirements read by the scheduler and the CLI."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import app
from costopt.registry import UnknownName
from costopt.settings import Settings, get_settings
from pricing.sources import (
    SOURCES,
    SourceNotConfigured,
    UnknownSource,
    build_sources,
    configured,
    source_intervals,
)

ALL = ("aws-spot", "aws-on-demand", "gcp", "azure", "aws-catalog", "azure-skus")


def test_every_source_builds_under_its_registered_name_with_its_interval_setting() -> None:
    assert SOURCES.names() == ALL
    settings = Settings(
        azure_subscription_id="sub-123",
        aws_spot_interval=timedelta(minutes=7),
        aws_on_demand_interval=timedelta(hours=3),
        gcp_interval=timedelta(hours=5),
        azure_interval=timedelta(hours=2),
        catalog_interval=timedelta(days=2),
    )
    built = build_sources(settings)
    assert [s.name for s in built] == list(ALL)
    assert source_intervals(settings) == {
        "aws-spot": 420.0,
        "aws-on-demand": 3 * 3600.0,
        "gcp": 5 * 3600.0,
        "azure": 2 * 3600.0,
        "aws-catalog": 2 * 86400.0,
        "azure-skus": 2 * 86400.0,
    }


def test_a_source_missing_its_settings_is_left_out_and_refused_when_named() -> None:
    settings = Settings(azure_subscription_id=None)
    assert configured(settings) == list(ALL[:-1])
    assert SOURCES.get("azure-skus").missing(settings) == ["COSTOPT_AZURE_SUBSCRIPTION_ID"]
    with pytest.raises(SourceNotConfigured, match="azure-skus is not configured: set COSTOPT_AZURE_SUBSCRIPTION_ID"):
        build_sources(settings, ["azure-skus"])


def test_names_ignore_case_and_repeats_and_keep_the_order_given() -> None:
    built = build_sources(Settings(), ["GCP", "aws-spot", "gcp"])
    assert [s.name for s in built] == ["gcp", "aws-spot"]


def test_an_unknown_source_lists_the_known_ones_and_close_matches() -> None:
    with pytest.raises(UnknownSource) as info:
        build_sources(Settings(), ["aws-spto"])
    err = info.value
    assert isinstance(err, UnknownName) and isinstance(err, ValueError)
    assert err.close[0] == "aws-spot"
    assert all(name in str(err) for name in ALL)


def test_prices_collect_names_the_known_sources_for_an_unknown_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COSTOPT_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["prices", "collect", "--source", "gpc", "--once"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 2
    text = " ".join(re.sub("[│╭╮╰╯─]", " ", result.stderr).split())  # the usage box wraps lines
    assert "unknown price source 'gpc' (did you mean 'gcp'?); known: aws-spot, aws-on-demand" in text
