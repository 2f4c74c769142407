"""The soak's options (bench/soak.py): the submissions' share, the probes' summary."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.soak import WEIGHTS, probe_summary, weights_with


def test_the_submissions_share_is_given_and_the_other_routes_keep_their_proportions() -> None:
    got = dict(zip(WEIGHTS, weights_with(0.05), strict=True))
    assert math.isclose(sum(got.values()), 1.0) and got["submit"] == 0.05
    assert math.isclose(got["get"] / got["list"], WEIGHTS["get"] / WEIGHTS["list"])
    assert weights_with(WEIGHTS["submit"]) == pytest.approx(list(WEIGHTS.values()))
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="share"):
            weights_with(bad)


def test_the_probes_samples_are_read_per_worker(tmp_path: Path) -> None:
    (tmp_path / "123.rss").write_text("30 rss_mb=310.5 engine_held=4\n60 rss_mb=320.0 engine_held=6\n")
    got = probe_summary(tmp_path, 20.0, trace=False)
    assert got == {
        "123": {
            "samples": [
                {"t_s": "30", "rss_mb": "310.5", "engine_held": "4"},
                {"t_s": "60", "rss_mb": "320.0", "engine_held": "6"},
            ]
        }
    }


def test_a_route_s_weight_can_be_set_to_attribute_memory_to_it() -> None:
    got = dict(zip(WEIGHTS, weights_with(0.05, {"report": 0.0}), strict=True))
    assert got["report"] == 0.0 and got["submit"] == 0.05
    assert got["get"] == dict(zip(WEIGHTS, weights_with(0.05), strict=True))["get"]  # the others as they were
    with pytest.raises(ValueError, match="unknown route"):
        weights_with(0.05, {"reports": 0.0})
    with pytest.raises(ValueError, match=">= 0"):
        weights_with(0.05, {"report": -1.0})


def test_a_serving_replica_runs_none_of_the_background_work(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.api_load import SERVING_REPLICA_ENV
    from costopt.settings import Settings

    for name, value in SERVING_REPLICA_ENV.items():
        monkeypatch.setenv(name, value)
    replica = Settings()
    assert not replica.migration_jobs_enabled and not replica.collectors_enabled
    assert replica.fleet_executor_enabled is False  # not None: None follows the migration jobs


def test_growth_leaves_out_the_samples_taken_while_a_replica_was_being_replaced() -> None:
    from bench.soak import Sample, growth

    def at(t: float, rss: float, procs: int) -> Sample:
        return Sample(t, rss, rss, procs, 0.0)

    samples = [at(0, 800, 4), at(60, 900, 4), at(120, 1180, 5), at(180, 910, 4), at(240, 1200, 5)]
    got = growth(samples, 60)
    assert (got["warmup_rss_mb"], got["end_rss_mb"], got["growth_mb"]) == (900, 910, 10)
    assert got["replacing_samples"] == 2 and got["peak_rss_mb"] == 1200 and got["flat"] is True
    grown = growth([*samples, at(300, 990, 4)], 60)  # a steady sample that grew is judged as before
    assert grown["growth_mb"] == 90 and grown["flat"] is False
