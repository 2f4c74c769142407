"""``costopt gavel simulate|bench|policies``: the issue's json keys, agreement with the library, exit codes."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import app
from costopt.gavel.policies import POLICY_NAMES
from costopt.gavel.simulator import simulate
from costopt.gavel.workload import load_workload
from costopt.throughput.loaders import GAVEL_SIMULATION_FILE

runner = CliRunner()

SMALL = ["--cluster", "4:4:4", "--rate", "2", "--window", "0:40", "--seed", "3"]


def _invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["gavel", *args])
    return result.exit_code, result.stdout, result.stderr


def test_simulate_json_has_the_issue_keys_and_matches_the_library(shared_data: Path) -> None:
    code, out, _ = _invoke(
        "simulate", "--policy", "max_min_fairness_perf", *SMALL, "--data", str(shared_data), "-f", "json"
    )
    assert code == 0
    got = json.loads(out)
    assert {"policy", "avg_jct_s", "makespan_s", "utilization", "wall_s"} <= set(got)
    expected = simulate(
        "max_min_fairness_perf",
        cluster="4:4:4",
        rate=2.0,
        seed=3,
        window=(0, 40),
        workload=load_workload(shared_data / GAVEL_SIMULATION_FILE),
    ).as_dict()
    for key in ("avg_jct_s", "makespan_s", "utilization", "moves_per_job", "jobs_completed"):
        assert got[key] == expected[key], key
    assert got["policy"] == "max_min_fairness_perf" and got["window_complete"] is True
    assert got["avg_jct_s"] > 0 and 0 < got["utilization"] <= 1


@pytest.mark.slow
def test_simulate_options_reach_the_simulation(shared_data: Path) -> None:
    base = ["--policy", "max_min_fairness_perf", *SMALL, "--data", str(shared_data), "-f", "json"]
    _, plain, _ = _invoke("simulate", *base)
    _, costly, _ = _invoke("simulate", *base, "--restart-overhead", "2min")
    p, c = json.loads(plain), json.loads(costly)
    assert c["restart_overhead_s"] == 120.0 and p["restart_overhead_s"] == 0.0
    assert c["avg_jct_s"] > p["avg_jct_s"]  # moves now cost time
    # multi-GPU jobs on a lighter trace (at SMALL's rate it saturates the cluster: 16 s and a lower bound)
    light = ["--policy", "max_min_fairness_perf", "--cluster", "4:4:4", "--rate", "1", "--window", "0:20"]
    light += ["--seed", "3"]
    single = json.loads(_invoke("simulate", *light, "--data", str(shared_data), "-f", "json")[1])
    code, multi, _ = _invoke("simulate", *light, "--multi-gpu", "--data", str(shared_data), "-f", "json")
    m = json.loads(multi)
    assert code == 0 and m["jobs_completed"] == single["jobs_completed"] == 20
    assert m["multi_gpu"] is True and single["multi_gpu"] is False and m["avg_jct_s"] != single["avg_jct_s"]


def test_a_static_trace_is_rate_0(shared_data: Path) -> None:
    code, out, _ = _invoke(
        "simulate", "-p", "min_total_duration_perf", "--cluster", "2:2:2", "--rate", "0", "--window", "0:12",
        "--data", str(shared_data), "-f", "json",
    )  # fmt: skip
    assert code == 0
    got = json.loads(out)
    assert got["rate_per_hour"] is None and got["jobs_completed"] == 12


def test_simulate_exits_3_when_the_window_does_not_finish_by_the_cap(shared_data: Path) -> None:
    code, out, err = _invoke(
        "simulate", "-p", "fifo", "--cluster", "1:1:1", "--rate", "3", "--window", "0:60", "--max-simulated", "1d",
        "--data", str(shared_data), "-f", "csv",
    )  # fmt: skip
    assert code == 3
    rows = dict(csv.reader(io.StringIO(out)))
    assert rows["window complete"] in ("False", "no")
    assert "lower bound" in err


def test_bench_json_has_the_issue_keys(shared_data: Path) -> None:
    code, out, _ = _invoke(
        "bench", "--policy", "max_min_fairness_perf", "--jobs", "64", "--space-sharing", "--repeats", "1",
        "--data", str(shared_data), "--format", "json",
    )  # fmt: skip
    assert code == 0
    got = json.loads(out)
    assert set(got) >= {"policy", "jobs", "space_sharing", "solve_s", "peak_mem_mb", "objective"}
    assert got["jobs"] == 64 and got["space_sharing"] is True
    assert got["solve_s"] > 0 and got["peak_mem_mb"] > 0 and got["objective"] > 0


def test_bad_arguments_exit_2_with_what_to_fix(shared_data: Path) -> None:
    d = ["--data", str(shared_data)]
    for args, hint in (
        (["simulate", "-p", "nope", *d], "known:"),
        (["simulate", "-p", "fifo", "--cluster", "1:2", *d], "--cluster"),
        (["simulate", "-p", "fifo", "--window", "50:10", *d], "--window"),
        (["simulate", "-p", "fifo", "--restart-overhead", "soon", *d], "--restart-overhead"),
        (["simulate", "-p", "fifo", "--restart-overhead", "10min", *d], "--round"),
        (["bench", "-p", "fifo", "--jobs", "0", *d], "--jobs"),
    ):
        code, _, err = _invoke(*args)
        assert code == 2, args
        assert hint in err, (args, err)


def test_policies_lists_every_registered_name() -> None:
    code, out, _ = _invoke("policies", "-f", "json")
    assert code == 0
    rows = json.loads(out)
    assert [r["policy"] for r in rows] == list(POLICY_NAMES)
    assert {r["policy"] for r in rows if r["heterogeneity_aware"]} == {n for n in POLICY_NAMES if "_perf" in n}
    # named cases, not the rule the command itself applies
    aware = {r["policy"]: r["heterogeneity_aware"] for r in rows}
    assert aware["max_min_fairness_perf"] is True and aware["fifo_perf"] is True
    assert aware["max_min_fairness"] is False and aware["min_total_duration"] is False
    also = {r["policy"]: r["aliases"] for r in rows}
    assert also["max_min_fairness_perf"] == "max_min_fairness_pareto_perf" and also["fifo"] == ""
