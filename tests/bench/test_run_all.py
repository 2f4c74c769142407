"""bench/run_all.py's reading and judging of benchmark outputs (no benchmark runs here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.run_all import (
    ENTRIES,
    FIGURES,
    Figure,
    Run,
    exit_code,
    figures_of,
    flatten,
    last_json,
    main,
    read_offline,
    rows,
    verdict,
)


def test_every_figure_belongs_to_an_entry_and_every_default_entry_has_a_judged_figure() -> None:
    names = {e.name for e in ENTRIES}
    assert {f.entry for f in FIGURES} <= names
    judged = {f.entry for f in FIGURES if f.target is not None}
    assert {e.name for e in ENTRIES if not e.optional} <= judged
    assert [e.name for e in ENTRIES if e.optional] == ["soak"]


def test_verdict_compares_in_the_figures_direction_and_fails_a_missing_or_nan_value() -> None:
    at_least = Figure("api", "submit.req_per_s", "submissions", ">=", 300, "req/s")
    at_most = Figure("api", "submit.p99_ms", "p99", "<=", 100, "ms")
    assert [verdict(at_least, v) for v in (300.0, 299.9, None, float("nan"))] == ["pass", "FAIL", "FAIL", "FAIL"]
    assert [verdict(at_most, v) for v in (100.0, 100.1)] == ["pass", "FAIL"]
    assert verdict(Figure("soak", "req_per_s", "x", "", None, "req/s"), 1.0) == "-"


def test_json_outputs_are_flattened_and_the_last_json_line_is_read_after_other_lines() -> None:
    stdout = 'noise\n{"sqlite": {"ingest_points_per_s": 150000, "ok": true, "name": "x"}}\n'
    assert flatten(last_json(stdout)) == {"sqlite.ingest_points_per_s": 150000.0, "sqlite.ok": 1.0}
    indented = json.dumps({"results": [{"backend": "sqlite"}]}, indent=2)
    assert last_json(indented) == {"results": [{"backend": "sqlite"}]}
    # an indented document after other lines, holding a nested {} on a line of its own, with a line after it
    doc = {"routes": {"get": {"requests": 3}}, "samples": [{"t_s": 1}, {}]}
    noisy = "starting...\n{ not json\n" + json.dumps(doc, indent=1) + "\ndone\n"
    assert last_json(noisy) == doc
    with pytest.raises(ValueError, match="no JSON object"):
        last_json("Traceback (most recent call last):\n  ...\n")


def test_the_preemption_studys_printed_lines_are_read() -> None:
    out = (
        "126 runs of A3C in 40.2 s wall, 12.6 s CPU: 0.100 s of CPU per run\n"
        "full study (11,340 runs) on 2 processes at this rate: 9.4 min\n"
    )
    assert read_offline(out) == {
        "full_study_min": 9.4,
        "sample_runs": 126.0,
        "sample_wall_s": 40.2,
        "sample_cpu_s": 12.6,
    }
    assert read_offline("Traceback ...") == {}


def test_api_gavel_and_demo_figures_are_derived_and_judged() -> None:
    api = {
        "results": [
            {"backend": "sqlite", "phases": {"submit": {"req_per_s": 900.0}}, "integrity": {}},
            {
                "backend": "postgres",
                "phases": {
                    "submit": {"req_per_s": 320.0, "p99_ms": 140.0},
                    "get": {"req_per_s": 1100.0, "p99_ms": 40.0},
                },
                "integrity": {"missing": 0, "duplicated": 1, "unexpected": 0},
            },
        ]
    }
    got = figures_of("api", "json", json.dumps(api, indent=2), 10.0)
    assert got["submit.req_per_s"] == 320.0 and got["integrity_problems"] == 1.0  # PostgreSQL's, not SQLite's
    gavel = {
        "solver": [
            {"solve_s": 0.01, "target_s": 0.05, "jobs": 2048, "space_sharing": False, "peak_mem_mb": 3000.0},
            {"solve_s": 6.0, "target_s": 5.0, "jobs": 2048, "space_sharing": True, "peak_mem_mb": 78.0},
            {"solve_s": 0.5, "target_s": 1.0, "jobs": 512, "space_sharing": True, "peak_mem_mb": 2500.0},
        ]
    }
    g = figures_of("gavel", "json", json.dumps(gavel), 1.0)
    assert g["cases_over_target"] == 1.0 and g["worst_fraction_of_target"] == 1.2
    assert g["space_sharing_2048_peak_mb"] == 78.0  # the 2,048-job space-sharing case's, not another's
    assert figures_of("demo", "wall", "whatever", 95.5) == {"wall_s": 95.5}

    table = rows([Run("api", "ok", 30.0, 14.0, 15.0, got)])
    by_key = {r["key"]: r["verdict"] for r in table}
    assert by_key == {
        "submit.req_per_s": "pass",
        "submit.p99_ms": "FAIL",
        "get.req_per_s": "pass",
        "get.p99_ms": "pass",
        "integrity_problems": "FAIL",
    }
    assert table[0]["load_1m"] == [14.0, 15.0]


def test_the_exit_code_fails_on_a_missed_target_or_a_run_that_did_not_finish_unless_no_fail() -> None:
    good = [Run("demo", "ok", 50.0, figures={"wall_s": 50.0})]
    assert exit_code(rows(good), good, no_fail=False) == 0
    slow = [Run("demo", "ok", 150.0, figures={"wall_s": 150.0})]
    assert exit_code(rows(slow), slow, no_fail=False) == 1
    assert exit_code(rows(slow), slow, no_fail=True) == 0
    timed_out = [Run("demo", "timeout after 900 s")]
    table = rows(timed_out)
    assert [r["verdict"] for r in table] == ["FAIL"]
    assert exit_code(table, timed_out, no_fail=False) == 1


def test_a_saved_json_run_is_judged_again_from_its_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = {
        "quick": True,
        "logs": str(tmp_path),
        "runs": [vars(Run("demo", "ok", 130.0, 14.5, 16.0, {"wall_s": 130.0}))],
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(saved))
    assert main(["--from-json", str(path)]) == 1  # 130 s > the demo's 120 s
    assert main(["--from-json", str(path), "--no-fail"]) == 0
    out = capsys.readouterr().out
    assert "costopt demo --teams 3 --days 30 --seed 0" in out and "FAIL" in out and "14.5-16.0" in out


def test_the_soaks_figures_are_derived_and_memory_is_judged_in_percent_and_megabytes() -> None:
    soak = {
        "errors": 0,
        "server_log_errors": 0,
        "req_per_s": 42.0,
        "replicas_replaced": 3,
        "memory": {"growth_pct": 6.0, "growth_mb": 60.0, "flat": False},
        "routes": {"get": {"requests": 10, "p99_ms": 12.0}, "report": {"requests": 2, "p99_ms": 900.0}},
        "samples": [{"t_s": 0.0, "rss_mb": 1000.0}],
    }
    got = figures_of("soak", "json", json.dumps(soak, indent=1), 600.0)
    assert got["p99_ms_worst_route"] == 900.0 and "samples.t_s" not in got
    verdicts = {r["key"]: r["verdict"] for r in rows([Run("soak", "ok", 600.0, figures=got)])}
    assert verdicts == {
        "errors": "pass",
        "server_log_errors": "pass",
        "memory.growth_pct": "pass",
        "memory.growth_mb": "FAIL",  # 6% of a large server is still 60 MB: over the soak's 50 MB
        "req_per_s": "-",
        "replicas_replaced": "-",
        "p99_ms_worst_route": "-",
    }
    assert got["replicas_replaced"] == 3.0
