"""Recorded traces: JSON lines in and out, refused lines named by number, `costopt gavel simulate
--trace/--dump-trace`, windows by job id and priority weights that reach the simulation."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from api.cli.main import app
from costopt.gavel.errors import InvalidState, TraceFileError
from costopt.gavel.policies import get_policy
from costopt.gavel.simulator import simulate_trace
from costopt.gavel.trace import TRACE_KEYS, Trace, generate_trace, read_trace, write_trace
from costopt.gavel.workload import Workload

runner = CliRunner()
RESNET = "ResNet-18 (batch size 16)"


def _line(**over: Any) -> str:
    row: dict[str, Any] = {
        "job_id": 0,
        "arrival_s": 0.0,
        "job_type": RESNET,
        "scale_factor": 1,
        "total_steps": 1000.0,
        "priority_weight": 1.0,
        "slo_s": None,
    }
    row.update(over)
    return json.dumps(row)


def _bad(**over: Any) -> str:
    """A line 4 (job 3 at 7 s) with ``over`` changed."""
    return _line(**{"job_id": 3, "arrival_s": 7.0, **over})


def _roundtrip(trace: Trace, workload: Workload) -> Trace:
    buf = io.StringIO()
    assert write_trace(trace, workload, buf) == trace.n_jobs
    return read_trace(io.StringIO(buf.getvalue()), workload)


def test_a_written_trace_reads_back_identical(workload: Workload) -> None:
    trace = generate_trace(workload, 300, rate_per_hour=5.0, seed=11, multi_gpu=True, slos=True)
    back = _roundtrip(trace, workload)
    for name in ("entry", "scale_factor", "arrival_s", "steps", "slo_s", "job_id", "weight"):
        assert np.array_equal(getattr(back, name), getattr(trace, name)), name
    assert np.allclose(back.duration_s, trace.duration_s, rtol=1e-12)
    assert set(trace.scale_factor.tolist()) == {1, 2, 4, 8}  # every GPU count went through the names


def test_lines_have_the_issue_keys_and_null_for_no_slo(workload: Workload) -> None:
    buf = io.StringIO()
    write_trace(generate_trace(workload, 3, rate_per_hour=5.0, seed=0), workload, buf)
    rows = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert [tuple(r) for r in rows] == [TRACE_KEYS] * 3
    assert rows[0]["job_type"] in {workload.job_type_name(e) for e in range(26)} and rows[0]["slo_s"] is None
    assert [r["job_id"] for r in rows] == [0, 1, 2]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        (_bad(job_type="ResNet-18 (batch size 17)"), "unknown job_type 'ResNet-18 (batch size 17)'; close: ResNet-18"),
        (_bad(job_type="A3C", scale_factor=2), "not measured at scale_factor 2 (measured at: [1])"),
        (_bad(job_type=7), "job_type must be a string"),
        (_bad(total_steps=-5), "total_steps must be a finite number > 0"),
        (_bad(total_steps="many"), "total_steps must be a number"),
        (_bad(priority_weight=0), "priority_weight must be a finite number > 0"),
        (_bad(slo_s=0), "slo_s must be a finite number > 0"),
        (_bad(scale_factor=True), "scale_factor must be an integer"),
        (_bad(scale_factor=1.5), "scale_factor must be an integer"),
        (_bad(job_id=-1), "job_id must be an integer >= 0"),
        (_bad(arrival_s=float("nan")), "arrival_s must be a finite number"),
        (json.dumps({"job_id": 5, "arrival_s": 9.0}), "missing job_type"),
        (_bad(arival_s=3.0), "unknown key(s) arival_s"),
        (_line(job_id=0, arrival_s=99.0), "job_id 0 repeats line 1"),
        (_line(job_id=9, arrival_s=1.0), "before the previous line's 5"),
    ],
)
def test_a_bad_line_is_refused_with_its_number(workload: Workload, line: str, problem: str) -> None:
    good = [_line(job_id=0, arrival_s=0.0), "", _line(job_id=1, arrival_s=5.0)]  # a blank line still counts
    with pytest.raises(TraceFileError) as err:
        read_trace([*good, line, _line(job_id=2, arrival_s=9.0)], workload, source="t.jsonl")
    assert err.value.line == 4
    assert str(err.value).startswith("t.jsonl line 4: ") and problem in str(err.value), str(err.value)


def test_an_empty_trace_is_refused(workload: Workload) -> None:
    with pytest.raises(TraceFileError, match="no jobs"):
        read_trace(["", "  "], workload)


def test_the_window_selects_job_ids_not_rows(workload: Workload) -> None:
    lines = [_line(job_id=100 + i, arrival_s=600.0 * i, total_steps=2.0e4 * (i + 1)) for i in range(12)]
    trace = read_trace(lines, workload)
    res = simulate_trace(get_policy("fifo_perf"), trace, workload, (2, 2, 2), window=(104, 108))
    assert res.jobs_in_window == 4 and res.window == (104, 108) and res.window_complete
    whole = simulate_trace(get_policy("fifo_perf"), trace, workload, (2, 2, 2))
    assert whole.jobs_in_window == 12 and whole.window == (100, 112)
    with pytest.raises(InvalidState, match="no job of the trace has an id in the window"):
        simulate_trace(get_policy("fifo_perf"), trace, workload, (2, 2, 2), window=(0, 100))


def test_priority_weights_reach_the_policy(workload: Workload) -> None:
    # two identical jobs share one V100: weight 4 for the first gives it 80% of the rounds
    def jct_of_first(weight: float) -> float:
        lines = [
            _line(job_id=0, total_steps=3.0e5, priority_weight=weight),
            _line(job_id=1, total_steps=3.0e5, priority_weight=1.0),
        ]
        trace = read_trace(lines, workload)
        res = simulate_trace(get_policy("max_min_fairness_perf"), trace, workload, (1, 0, 0), window=(0, 1))
        return res.avg_jct_s

    v100 = workload.worker_types.index("v100")
    alone_s = 3.0e5 / workload.consolidated[0, v100]
    equal, favoured = jct_of_first(1.0), jct_of_first(4.0)
    assert equal == pytest.approx(2 * alone_s, rel=0.05)  # time-shared half and half
    assert favoured == pytest.approx(alone_s / 0.8, rel=0.05)


def _cli(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["gavel", "simulate", *args])
    return result.exit_code, result.stdout, result.stderr


def _flat(text: str) -> str:
    """Console text without the error panel's borders and line breaks."""
    return " ".join(text.replace("│", " ").split())


def _metrics(out: str) -> dict[str, Any]:
    d = json.loads(out)
    return {k: v for k, v in d.items() if k not in ("wall_s", "solve_s", "rate_per_hour", "seed", "trace")}


def test_dump_then_simulate_the_file_gives_the_same_result(shared_data: Path, tmp_path: Path) -> None:
    dumped = tmp_path / "trace.jsonl"
    common = ["-p", "max_min_fairness_perf", "--cluster", "4:4:4", "--data", str(shared_data), "-f", "json"]
    code, generated, err = _cli(*common, "--rate", "2", "--seed", "3", "--window", "5:30", "--dump-trace", str(dumped))
    assert code == 0, err
    assert f"wrote 55 jobs to {dumped}" in err  # the window's end + as many more
    code, replayed, err = _cli(*common, "--trace", str(dumped), "--window", "5:30")
    assert code == 0, err
    assert _metrics(replayed) == _metrics(generated)
    assert json.loads(replayed)["trace"] == str(dumped) and json.loads(generated)["trace"] is None
    assert json.loads(replayed)["jobs_completed"] == 25


def test_a_bad_trace_file_exits_1_naming_the_line(shared_data: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(_line() + "\n" + _line(job_id=1, job_type="ResNet-81 (batch size 16)") + "\n")
    d = ["-p", "fifo", "--data", str(shared_data)]
    code, _, err = _cli(*d, "--trace", str(bad))
    assert code == 1
    assert "bad.jsonl line 2: unknown job_type 'ResNet-81 (batch size 16)'" in _flat(err)
    code, _, err = _cli(*d, "--trace", str(tmp_path / "missing.jsonl"))
    assert code == 1 and "cannot read it" in err
    good = tmp_path / "good.jsonl"
    good.write_text(_line() + "\n")
    code, _, err = _cli(*d, "--trace", str(good), "--window", "50:60")
    assert code == 1 and "no job of the trace has an id in the window [50, 60)" in _flat(err)


def test_a_recorded_job_the_cluster_cannot_run_is_refused(shared_data: Path, tmp_path: Path) -> None:
    big = tmp_path / "big.jsonl"
    big.write_text(_line() + "\n" + _line(job_id=7, arrival_s=1.0, scale_factor=8) + "\n")
    d = ["-p", "max_min_fairness_perf", "--trace", str(big), "--data", str(shared_data)]
    code, _, err = _cli(*d, "--cluster", "4:4:4")
    assert code == 1
    assert "job_id 7 (ResNet-18 (batch size 16), 8 GPUs) can run on no worker type of cluster 4:4:4" in _flat(err)
    code, out, err = _cli(*d, "--cluster", "0:8:0", "-f", "json")
    assert code == 0, err
    assert json.loads(out)["jobs_completed"] == 2


def test_generator_options_are_refused_with_a_trace(shared_data: Path, tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text(_line() + "\n")
    for extra, option in ((["--rate", "3"], "--rate"), (["--seed", "1"], "--seed"), (["--slos"], "--slos")):
        code, _, err = _cli("-p", "fifo", "--trace", str(good), *extra, "--data", str(shared_data))
        assert code == 2 and option in err and "does not apply to --trace" in _flat(err)
