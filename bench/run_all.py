"""Every benchmark of the project in one table (issue 14): ``make bench``.

Runs each benchmark script as a subprocess with a time cap (``--json`` where the script has it; the
preemption study's bench is read from its printed lines; the demo is timed), collects its figures,
compares each with its target and prints one table: benchmark, figure, target, measured, pass/fail, the
machine's 1-minute load average before and after the benchmark, and its wall time. The figures and
their targets are the table :data:`FIGURES` below (from docs/benchmarks.md and the issues).

    .venv/bin/python bench/run_all.py                 # everything at the documented sizes (~15-30 min)
    .venv/bin/python bench/run_all.py --quick         # smaller sizes where a bench has them
    .venv/bin/python bench/run_all.py --only store,api --json
    .venv/bin/python bench/run_all.py --only soak     # the 10-minute soak (optional: not in the default run)

Exit status 1 when a figure misses its target, a figure is missing or a benchmark failed or ran out of
time (``--no-fail``: always 0, the table only reports).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


# -- what runs ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One benchmark: its command (``full`` and ``quick`` arguments after the script), its time cap in
    seconds, how its output is read, and whether it runs by default (``optional``: only with --only)."""

    name: str
    script: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    cap_s: float
    reader: str = "json"  # json: the last stdout line that parses as JSON; offline: the study's lines; wall
    optional: bool = False


API = ("--json", "--backend", "postgres", "--workers", "2")
SOAK = ("--json", "--workers", "3", "--private-job-work", "--max-rss-mb", "320")
"""The soak as the service is best run over the simulated cloud: a job-work process with no traffic and two
serving replicas recycled past 320 MB (docs/reliability.md, Soak: runs X4, X5)."""
ENTRIES: tuple[Entry, ...] = (
    Entry(
        "store",
        "bench/store_bench.py",
        ("--json",),
        ("--json", "--points", "200000", "--keys", "2000", "--repeats", "7"),
        1800,
    ),
    Entry("import", "bench/import_bench.py", ("--json",), ("--json",), 600),
    Entry("planner", "bench/plan_bench.py", ("--json",), ("--json", "--repeats", "11"), 600),
    Entry("collection", "bench/plan_collection_bench.py", ("--json",), ("--json",), 600),
    Entry("gavel", "bench/gavel_bench.py", ("--json",), ("--json", "--merge-sizes", "16"), 1200),
    Entry("backtest", "bench/backtest_bench.py", ("--json",), ("--json", "--repeats", "1"), 1200),
    Entry("preemption", "bench/offline_jobs_bench.py", (), (), 900, reader="offline"),
    Entry(
        "api",
        "bench/api_load.py",
        (*API, "--requests", "1500", "--reads", "4000", "--pages", "200", "--max-seconds", "30"),
        (*API, "--requests", "600", "--reads", "1500", "--pages", "50", "--floor", "0", "--max-seconds", "15"),
        900,
    ),
    Entry("demo", "costopt", ("demo", "--teams", "3", "--days", "30", "--seed", "0"), (), 900, reader="wall"),
    Entry("soak", "bench/soak.py", (*SOAK, "--minutes", "10"), (*SOAK, "--minutes", "2"), 1500, optional=True),
)


# -- the figures and their targets ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """A figure of an entry's flattened output (``key``), its target (``op`` ``target``; None: reported,
    not judged) and the unit it is shown in."""

    entry: str
    key: str
    label: str
    op: str
    target: float | None
    unit: str


FIGURES: tuple[Figure, ...] = (
    # docs/benchmarks.md "Price store" (issue 2): 1,000,000 points over 10,000 keys
    Figure("store", "sqlite.ingest_points_per_s", "SQLite ingest", ">=", 100_000, "points/s"),
    Figure("store", "postgresql.ingest_points_per_s", "PostgreSQL ingest", ">=", 200_000, "points/s"),
    Figure("store", "sqlite.ratio_to_plain", "SQLite ingest / plain bulk load", ">=", 0.5, "x"),
    Figure("store", "postgresql.ratio_to_plain", "PostgreSQL ingest / plain bulk load", ">=", 0.5, "x"),
    Figure("store", "sqlite.snapshot_now_median_ms", "SQLite current snapshot, median", "<=", 20, "ms"),
    Figure("store", "postgresql.snapshot_now_median_ms", "PostgreSQL current snapshot, median", "<=", 20, "ms"),
    Figure("store", "sqlite.snapshot_asof_median_ms", "SQLite as-of snapshot, median", "<=", 50, "ms"),
    Figure("store", "postgresql.snapshot_asof_median_ms", "PostgreSQL as-of snapshot, median", "<=", 50, "ms"),
    # "Importing the real data" (issue 2)
    Figure("import", "sqlite.first_import_s", "SQLite first import of the data", "<=", 10, "s"),
    Figure("import", "postgresql.first_import_s", "PostgreSQL first import of the data", "<=", 10, "s"),
    # "Planner" (issue 3)
    Figure("planner", "one_job_median_ms", "one job over 10,000 offers, median", "<=", 5, "ms"),
    Figure("planner", "replan_min-cost_median_ms", "re-plan 10,000 jobs (min-cost)", "<=", 1000, "ms"),
    Figure("planner", "replan_min-time_median_ms", "re-plan 10,000 jobs (min-time)", "<=", 1000, "ms"),
    Figure("collection", "sweep_total_s", "1,000 jobs / 500 offers / 23 quotas to optimality", "<=", 10, "s"),
    # "Gavel scheduler" (issue 4): each solver case against its own target (bench/gavel_bench.py)
    Figure("gavel", "cases_over_target", "solver cases over their target", "<=", 0, "cases"),
    Figure("gavel", "worst_fraction_of_target", "slowest case / its target", "<=", 1.0, "x"),
    Figure("gavel", "space_sharing_2048_peak_mb", "2,048 jobs with space sharing, peak memory", "<=", 2048, "MB"),
    # "Backtest" (issue 5)
    Figure("backtest", "paper_table_median_s", "the paper's full table", "<=", 120, "s"),
    Figure("backtest", "hourly_sweep_s", "the hourly sweep", "<=", 600, "s"),
    # the preemption study (issue 11): 11,340 runs on 2 processes, estimated from a sample's CPU per run
    Figure("preemption", "full_study_min", "preemption study, full (estimate)", "<=", 10, "min"),
    # "REST API" (issue 10), PostgreSQL, 2 workers
    Figure("api", "submit.req_per_s", "POST /v1/jobs", ">=", 300, "req/s"),
    Figure("api", "submit.p99_ms", "POST /v1/jobs p99", "<=", 100, "ms"),
    Figure("api", "get.req_per_s", "GET /v1/jobs/{id}", ">=", 1000, "req/s"),
    Figure("api", "get.p99_ms", "GET /v1/jobs/{id} p99", "<=", 100, "ms"),
    Figure("api", "integrity_problems", "jobs missing, duplicated or unexpected", "<=", 0, "jobs"),
    # the demo (issue 12): `costopt demo --teams 3 --days 30 --seed 0` on a temporary SQLite database
    Figure("demo", "wall_s", "costopt demo --teams 3 --days 30 --seed 0", "<=", 120, "s"),
    # the soak (issue 14), optional
    Figure("soak", "errors", "soak: errors", "<=", 0, "requests"),
    Figure("soak", "server_log_errors", "soak: server log error lines", "<=", 0, "lines"),
    Figure("soak", "memory.growth_pct", "soak: RSS growth after warm-up", "<=", 10, "%"),
    Figure("soak", "memory.growth_mb", "soak: RSS growth after warm-up, MB", "<=", 50, "MB"),
    Figure("soak", "req_per_s", "soak: throughput, all routes", "", None, "req/s"),
    Figure("soak", "replicas_replaced", "soak: replicas replaced over the memory limit", "", None, "replicas"),
    Figure("soak", "p99_ms_worst_route", "soak: p99 of the slowest route", "", None, "ms"),
)


# -- reading an entry's output ---------------------------------------------------------------------------------


def flatten(doc: Any, prefix: str = "") -> dict[str, float]:
    """Numbers of a JSON document by dotted path (``{"a": {"b": 1}}`` -> ``{"a.b": 1.0}``); booleans as 0/1,
    lists and strings left out."""
    out: dict[str, float] = {}
    if isinstance(doc, Mapping):
        for k, v in doc.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(doc, int | float):  # bool is an int: 0/1
        out[prefix[:-1]] = float(doc)
    return out


def last_json(stdout: str) -> Any:
    """The last JSON object of ``stdout`` that starts a line: on one line, or indented over many
    (bench/api_load.py and bench/soak.py indent theirs), with other lines before or after it. A line inside
    an object already read (a nested ``{}``) never starts one. Raises ValueError when there is none."""
    decoder = json.JSONDecoder()
    found: list[Any] = []
    end = 0
    for m in re.finditer(r"^[ \t]*\{", stdout, re.MULTILINE):
        if m.start() < end:
            continue  # inside the object read last
        try:
            doc, end = decoder.raw_decode(stdout, m.end() - 1)
        except ValueError:
            continue
        found.append(doc)
    if not found:
        raise ValueError(f"no JSON object in the output: {stdout[-200:]!r}")
    return found[-1]


OFFLINE_RE = re.compile(r"full study \((?P<runs>[\d,]+) runs\) on 2 processes at this rate: (?P<min>[\d.]+) min")
OFFLINE_RUN_RE = re.compile(r"(?P<n>\d+) runs of \S+ in (?P<wall>[\d.]+) s wall, (?P<cpu>[\d.]+) s CPU")


def read_offline(stdout: str) -> dict[str, float]:
    """bench/offline_jobs_bench.py's printed figures (it has no --json)."""
    out: dict[str, float] = {}
    m = OFFLINE_RE.search(stdout)
    if m:
        out["full_study_min"] = float(m["min"])
    m = OFFLINE_RUN_RE.search(stdout)
    if m:
        out.update(sample_runs=float(m["n"]), sample_wall_s=float(m["wall"]), sample_cpu_s=float(m["cpu"]))
    return out


def derive_gavel(doc: Mapping[str, Any]) -> dict[str, float]:
    rows = doc.get("solver", [])
    if not rows:
        return {}
    fractions = [r["solve_s"] / r["target_s"] for r in rows]
    out = {
        "cases": float(len(rows)),
        "cases_over_target": float(sum(f > 1 for f in fractions)),
        "worst_fraction_of_target": max(fractions),
    }
    peaks = [r["peak_mem_mb"] for r in rows if r.get("space_sharing") and r.get("jobs") == 2048]
    if peaks:  # the one memory target (bench/gavel_bench.py): <= 2 GB
        out["space_sharing_2048_peak_mb"] = float(max(peaks))
    return out


def derive_api(doc: Mapping[str, Any]) -> dict[str, float]:
    results = [r for r in doc.get("results", []) if r.get("backend") == "postgres"]
    if not results:
        return {}
    r = results[0]
    out = flatten(r["phases"])
    v = r["integrity"]
    out["integrity_problems"] = float(v["missing"] + v["duplicated"] + v["unexpected"])
    return out


def derive_soak(doc: Mapping[str, Any]) -> dict[str, float]:
    out = flatten({k: v for k, v in doc.items() if k not in ("samples", "routes")})
    p99 = [r["p99_ms"] for r in doc.get("routes", {}).values() if r.get("requests")]
    if p99:
        out["p99_ms_worst_route"] = max(p99)
    return out


DERIVE: dict[str, Callable[[Any], dict[str, float]]] = {
    "gavel": derive_gavel,
    "api": derive_api,
    "soak": derive_soak,
}


def figures_of(entry: str, reader: str, stdout: str, wall_s: float) -> dict[str, float]:
    """The flattened figures of ``entry``'s output."""
    if reader == "wall":
        return {"wall_s": wall_s}
    if reader == "offline":
        return read_offline(stdout)
    doc = last_json(stdout)
    return DERIVE[entry](doc) if entry in DERIVE else flatten(doc)


# -- judging ---------------------------------------------------------------------------------------------------


def verdict(figure: Figure, measured: float | None) -> str:
    """'pass', 'FAIL' (target missed or not measured), or '-' (no target)."""
    if figure.target is None:
        return "-"
    if measured is None or measured != measured:  # missing or NaN
        return "FAIL"
    ok = measured >= figure.target if figure.op == ">=" else measured <= figure.target
    return "pass" if ok else "FAIL"


@dataclass
class Run:
    """One entry's run: status ('ok', 'failed (rc N)', 'timeout after N s', 'skipped'), figures, load."""

    entry: str
    status: str
    wall_s: float = 0.0
    load_before: float = 0.0
    load_after: float = 0.0
    figures: dict[str, float] = field(default_factory=dict)
    note: str = ""


def rows(runs: list[Run]) -> list[dict[str, Any]]:
    """One row per figure of every run entry: its target, measured value and verdict."""
    out = []
    for run in runs:
        for f in (f for f in FIGURES if f.entry == run.entry):
            measured = run.figures.get(f.key)
            out.append(
                {
                    "benchmark": run.entry,
                    "figure": f.label,
                    "key": f.key,
                    "target": None if f.target is None else f"{f.op} {f.target:,g} {f.unit}",
                    "measured": measured,
                    "unit": f.unit,
                    "verdict": verdict(f, measured) if run.status == "ok" or measured is not None else "FAIL",
                    "status": run.status,
                    "load_1m": [round(run.load_before, 2), round(run.load_after, 2)],
                    "wall_s": round(run.wall_s, 1),
                }
            )
    return out


def exit_code(table: list[dict[str, Any]], runs: list[Run], no_fail: bool) -> int:
    if no_fail:
        return 0
    failed = any(r["verdict"] == "FAIL" for r in table) or any(run.status != "ok" for run in runs)
    return 1 if failed else 0


# -- running ---------------------------------------------------------------------------------------------------


def command(entry: Entry, quick: bool) -> list[str]:
    args = entry.quick if quick and entry.quick else entry.full
    if entry.script == "costopt":  # the CLI's console script, next to this interpreter
        return [str(Path(PY).parent / "costopt"), *args]
    return [PY, str(ROOT / entry.script), *args]


def run_entry(entry: Entry, quick: bool, log_dir: Path) -> Run:
    """Run ``entry`` in its own process group, killed at its cap; the demo on a temporary SQLite database."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    tmp = tempfile.TemporaryDirectory(prefix=f"costopt-bench-{entry.name}-")
    if entry.name == "demo":
        env["COSTOPT_DATABASE_URL"] = f"sqlite:///{tmp.name}/demo.db"
    cmd = command(entry, quick)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    err_path = log_dir / f"{entry.name}.stderr"
    with err_path.open("wb") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=entry.cap_s)
            status = "ok" if proc.returncode == 0 else f"failed (rc {proc.returncode})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own group: the bench's servers and children too
            out, _ = proc.communicate()
            status = f"timeout after {entry.cap_s:.0f} s"
    wall = time.perf_counter() - t0
    run = Run(entry.name, status, wall, load_before, os.getloadavg()[0])
    stdout = out.decode(errors="replace")
    (log_dir / f"{entry.name}.stdout").write_text(stdout)
    # api_load and soak exit 1 on a failed integrity check but still print their figures: read them
    if not status.startswith("timeout"):
        try:
            run.figures = figures_of(entry.name, entry.reader, stdout, wall)
        except (ValueError, KeyError, TypeError) as exc:
            run.note = f"output not read: {type(exc).__name__}: {exc}"
    if status != "ok" and not run.note:
        run.note = err_path.read_text(errors="replace")[-300:].strip()
    tmp.cleanup()
    return run


def render(table: list[dict[str, Any]], runs: list[Run], quick: bool, log_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"costopt benchmarks ({'--quick' if quick else 'full sizes'}; load = 1-min load average)")
    for col in ("benchmark", "figure", "target", "measured", "result", "load before-after", "wall s"):
        t.add_column(col, justify="right" if col in ("measured", "wall s") else "left")
    for r in table:
        m = r["measured"]
        shown = "-" if m is None else (f"{m:,.0f}" if abs(m) >= 1000 else f"{m:.3g}")
        result = r["verdict"] if r["status"] == "ok" else f"{r['verdict']} ({r['status']})"
        style = "red" if r["verdict"] == "FAIL" else None
        t.add_row(
            r["benchmark"],
            r["figure"],
            r["target"] or "-",
            f"{shown} {r['unit']}",
            result,
            f"{r['load_1m'][0]:.1f}-{r['load_1m'][1]:.1f}",
            f"{r['wall_s']:.0f}",
            style=style,
        )
    console = Console(width=200)
    console.print(t)
    for run in runs:
        if run.note:
            console.print(f"{run.entry}: {run.note}")
    console.print(f"each benchmark's output: {log_dir}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="smaller sizes where a benchmark has them")
    ap.add_argument("--only", default="", help="comma-separated benchmarks (soak runs only when named here)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    ap.add_argument("--no-fail", action="store_true", help="exit 0 even when a figure misses its target")
    ap.add_argument("--logs", type=Path, default=None, help="folder for each benchmark's output (default: temp)")
    ap.add_argument("--from-json", type=Path, default=None, help="print the table of a saved --json run (nothing runs)")
    args = ap.parse_args(argv)
    if args.from_json is not None:
        saved = json.loads(args.from_json.read_text())
        runs = [Run(**r) for r in saved["runs"]]
        table = rows(runs)
        render(table, runs, bool(saved["quick"]), Path(saved["logs"]))
        return exit_code(table, runs, args.no_fail)
    known = {e.name: e for e in ENTRIES}
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}: choose from {', '.join(known)}")
    chosen = [known[n] for n in names] if names else [e for e in ENTRIES if not e.optional]
    log_dir = args.logs or Path(tempfile.mkdtemp(prefix="costopt-bench-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    for entry in chosen:
        if not args.json:
            print(f"running {entry.name}: {' '.join(command(entry, args.quick))}", file=sys.stderr, flush=True)
        runs.append(run_entry(entry, args.quick, log_dir))
    table = rows(runs)
    if args.json:
        doc = {
            "quick": args.quick,
            "rows": table,
            "runs": [vars(r) for r in runs],
            "logs": str(log_dir),
        }
        print(json.dumps(doc, indent=1))
    else:
        render(table, runs, args.quick, log_dir)
    return exit_code(table, runs, args.no_fail)


if __name__ == "__main__":
    raise SystemExit(main())
