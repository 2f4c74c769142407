"""The composition root builds what the settings ask for, and only that."""

from __future__ import annotations

import pytest

from api.wiring import build_sources, source_intervals
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
