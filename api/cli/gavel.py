"""``costopt gavel ...``: the built-in round-based scheduler's policies, simulated and benchmarked."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from api.cli.common import Exit, failures, settings_with
from api.cli.output import OutputFormat, emit, emit_object, note

if TYPE_CHECKING:
    from costopt.gavel.trace import Trace
    from costopt.gavel.workload import Workload

app = typer.Typer(help="The Gavel-style scheduler: policies, simulation, benchmarks.", no_args_is_help=True)


def parse_window(text: str) -> tuple[int, int]:
    """``"4000:5000"`` -> (4000, 5000): job ids first (inclusive) to end (exclusive)."""
    try:
        lo, hi = (int(p) for p in text.split(":"))
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not FIRST:END job ids, e.g. 4000:5000", param_hint="--window") from None
    if not 0 <= lo < hi:
        raise typer.BadParameter(f"need 0 <= FIRST < END, got {text!r}", param_hint="--window")
    return lo, hi


_UNIT_S = {"": 1.0, "s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?(?:e\d+)?)\s*(s|sec|min|m|h|d)?\s*$", re.IGNORECASE)


def parse_seconds(text: str, option: str) -> float:
    """'30s', '2min', '1.5h', '7d', '0' (seconds when no unit) or ISO 8601 'PT30S' -> seconds (>= 0)."""
    m = _DURATION.match(text)
    if m:
        seconds = float(m.group(1)) * _UNIT_S[(m.group(2) or "").lower()]
    else:
        import pandas as pd

        try:
            seconds = pd.Timedelta(text).total_seconds()
        except (ValueError, TypeError):
            raise typer.BadParameter(f"{text!r} is not a duration (e.g. 30s, 2min, 7d)", param_hint=option) from None
    if seconds < 0:
        raise typer.BadParameter("must not be negative", param_hint=option)
    return seconds


def _check_policy(policy: str) -> str:
    """The canonical name of ``policy`` (any case); a usage error listing the known names otherwise."""
    from costopt.gavel.errors import UnknownPolicy
    from costopt.gavel.policies import POLICIES

    try:
        return POLICIES.canonical(policy)
    except UnknownPolicy as exc:
        raise typer.BadParameter(str(exc), param_hint="--policy") from exc


def _workload(data: Path | None) -> Workload:
    from costopt.gavel.workload import load_workload
    from costopt.throughput.loaders import GAVEL_SIMULATION_FILE

    settings = settings_with(data)
    if settings.data_dir is None:
        raise typer.BadParameter(
            "Gavel's measured throughputs are needed: pass --data or set COSTOPT_DATA_DIR", param_hint="--data"
        )
    return load_workload(settings.data_dir / GAVEL_SIMULATION_FILE)


PolicyOpt = Annotated[str, typer.Option("--policy", "-p", help="A policy name (see `costopt gavel policies`).")]
DataOpt = Annotated[Path | None, typer.Option("--data", help="Real data folder (default ../shared/data).")]
FormatOpt = Annotated[OutputFormat, typer.Option("--format", "-f")]


@app.command("policies")
def policies(fmt: FormatOpt = OutputFormat.table) -> None:
    """The policy names (as in Gavel's code base; `_perf` = heterogeneity-aware) and their other names."""
    from costopt.gavel.policies import POLICIES, POLICY_NAMES

    aliases = POLICIES.aliases()
    rows = [
        {
            "policy": n,
            "heterogeneity_aware": "_perf" in n,
            "aliases": ", ".join(a for a, canonical in aliases.items() if canonical == n),
        }
        for n in POLICY_NAMES
    ]
    columns = [("policy", "policy", None), ("heterogeneity_aware", "aware", None), ("aliases", "also named", None)]
    emit(rows, columns, fmt, title="Policies")


@app.command("simulate")
def simulate(
    policy: PolicyOpt,
    cluster: Annotated[str, typer.Option(help="GPUs per type, V100:P100:K80.")] = "36:36:36",
    rate: Annotated[
        float | None, typer.Option(min=0.0, help="Poisson arrivals in jobs/hour; 0 = a static trace (default 5).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Trace seed (same seed, same trace; default 0).")] = None,
    window: Annotated[
        str | None,
        typer.Option(help="Job ids measured, FIRST:END (END exclusive; default 4000:5000, or every job of --trace)."),
    ] = None,
    multi_gpu: Annotated[bool, typer.Option("--multi-gpu", help="The paper's 1/2/4/8-GPU job mix.")] = False,
    space_sharing: Annotated[bool, typer.Option("--space-sharing", help="Co-locate job pairs.")] = False,
    restart_overhead: Annotated[
        str, typer.Option("--restart-overhead", help="Time lost per move, e.g. 30s (the paper charges 0).")
    ] = "0s",
    round_length: Annotated[str, typer.Option("--round", help="Round length, e.g. 360s.")] = "360s",
    slos: Annotated[bool, typer.Option("--slos", help="Draw SLOs (for the _SLOs policy).")] = False,
    cap: Annotated[
        str, typer.Option("--max-simulated", help="Stop after this much simulated time, e.g. 30d.")
    ] = "5e7s",
    trace_file: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            help="Run this recorded trace (JSON lines: job_id, arrival_s, job_type, scale_factor, total_steps, "
            "priority_weight, slo_s) instead of a generated one.",
        ),
    ] = None,
    dump_trace: Annotated[
        Path | None, typer.Option("--dump-trace", help="Write the trace simulated to this file (same format).")
    ] = None,
    data: DataOpt = None,
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """Simulate a policy on a generated or recorded trace and print average JCT, makespan, utilization
    and wall time.

    Exit 1 when --trace cannot be read (the message names the line), 3 when the window's jobs did not
    all finish by the simulation's cap (the JCT is then a lower bound)."""
    from costopt.gavel.policies import get_policy
    from costopt.gavel.simulator import generated_trace, parse_cluster, simulate_trace

    policy = _check_policy(policy)
    if trace_file is not None:
        for given, option in (
            (rate, "--rate"),
            (seed, "--seed"),
            (multi_gpu or None, "--multi-gpu"),
            (slos or None, "--slos"),
        ):
            if given is not None:
                raise typer.BadParameter(
                    f"{option} shapes a generated trace; it does not apply to --trace", param_hint=option
                )
    lo_hi = parse_window(window) if window is not None else None
    overhead_s = parse_seconds(restart_overhead, "--restart-overhead")
    round_s = parse_seconds(round_length, "--round")
    cap_s = parse_seconds(cap, "--max-simulated")
    if round_s <= 0 or overhead_s >= round_s:
        raise typer.BadParameter("need --round > 0 and --restart-overhead shorter than a round", param_hint="--round")
    try:
        capacity = parse_cluster(cluster)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--cluster") from None
    workload = _workload(data)
    rate_h = 5.0 if rate is None else rate
    seed_n = 0 if seed is None else seed
    with failures():
        if trace_file is not None:
            trace = _read_trace_file(trace_file, workload)
            _check_runnable(trace, workload, capacity, str(trace_file))
        else:
            lo_hi = lo_hi or (4000, 5000)
            trace = generated_trace(workload, rate_h if rate_h > 0 else None, seed_n, lo_hi, multi_gpu, slos=slos)
        if dump_trace is not None:
            _dump(trace, workload, dump_trace)
        result = simulate_trace(
            get_policy(policy),
            trace,
            workload,
            capacity,
            window=lo_hi,
            space_sharing=space_sharing,
            restart_overhead_s=overhead_s,
            round_s=round_s,
            max_simulated_s=cap_s,
            seed=seed_n,
            rate=None if trace_file is not None or rate_h <= 0 else rate_h,
            multi_gpu=multi_gpu,
            source=None if trace_file is None else str(trace_file),
        )
    record = result.as_dict()
    shown = record if fmt is OutputFormat.json else _shown_simulation(record)
    emit_object(shown, fmt, title=f"{policy} on {cluster}")
    if not result.window_complete:
        note(
            f"[yellow]only {result.jobs_completed} of {result.jobs_in_window} jobs of the window finished by "
            "the simulation's cap: the average JCT is a lower bound (the cluster is saturated at this rate)[/yellow]"
        )
        raise typer.Exit(Exit.PARTIAL)


def _read_trace_file(path: Path, workload: Workload) -> Trace:
    from costopt.gavel.errors import TraceFileError
    from costopt.gavel.trace import read_trace

    try:
        with path.open(encoding="utf-8") as f:
            return read_trace(f, workload, source=str(path))
    except OSError as exc:
        raise TraceFileError(str(path), 0, f"cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise TraceFileError(str(path), 0, "not UTF-8 text (a trace is JSON lines)") from None


def _check_runnable(trace: Trace, workload: Workload, capacity: tuple[int, ...], source: str) -> None:
    """Refuse a recorded job that no worker type of the cluster can run (it would never finish)."""
    import numpy as np

    from costopt.gavel.errors import TraceFileError

    cap = np.array(capacity)
    can = (workload.consolidated[trace.entry] > 0) & (cap[None, :] >= trace.scale_factor[:, None])
    stuck = np.nonzero(~can.any(axis=1))[0]
    if stuck.size:
        i = int(stuck[0])
        raise TraceFileError(
            source,
            0,
            f"job_id {int(trace.job_id[i])} ({workload.job_type_name(int(trace.entry[i]))}, "
            f"{int(trace.scale_factor[i])} GPUs) can run on no worker type of cluster "
            f"{':'.join(map(str, capacity))} ({stuck.size} such job(s)): "
            "give the cluster at least that many GPUs of a type",
        )


def _dump(trace: Trace, workload: Workload, path: Path) -> None:
    from costopt.gavel.errors import TraceFileError
    from costopt.gavel.trace import write_trace

    try:
        with path.open("w", encoding="utf-8") as f:
            lines = write_trace(trace, workload, f)
    except OSError as exc:
        raise TraceFileError(str(path), 0, f"cannot write it ({exc.strerror or exc})") from None
    note(f"wrote {lines} jobs to {path}")


def _shown_simulation(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "policy": r["policy"],
        "cluster (V100:P100:K80)": r["cluster"],
        "trace": r["trace"]
        or (
            f"generated, static (seed {r['seed']})"
            if r["rate_per_hour"] is None
            else f"generated, {r['rate_per_hour']:g} jobs/h (seed {r['seed']})"
        ),
        "window": f"job ids {r['window'][0]}-{r['window'][1] - 1} ({r['jobs_in_window']} jobs)",
        "average JCT": f"{r['avg_jct_s']:,.0f} s ({r['avg_jct_s'] / 3600:.2f} h)",
        "makespan": f"{r['makespan_s']:,.0f} s ({r['makespan_s'] / 3600:.1f} h)",
        "utilization": f"{r['utilization']:.1%}",
        "finish-time fairness rho (mean / max)": f"{r['ftf_rho_mean']:.2f} / {r['ftf_rho_max']:.2f}",
        "moves per job": f"{r['moves_per_job']:.1f}",
        "window complete": r["window_complete"],
        "solver time": f"{r['solve_s']:.2f} s in {r['solves']} solves",
        "wall time": f"{r['wall_s']:.2f} s",
    }


@app.command("bench")
def bench(
    policy: PolicyOpt,
    jobs: Annotated[int, typer.Option(min=1, help="Jobs in the benchmark state (n/4 GPUs of each type).")] = 2048,
    space_sharing: Annotated[bool, typer.Option("--space-sharing", help="Co-locate job pairs.")] = False,
    repeats: Annotated[int, typer.Option(min=1, help="States solved; the median time is reported.")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the first state.")] = 0,
    data: DataOpt = None,
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """Time one allocation on Gavel's benchmark state: solve seconds (median) and the process's peak memory."""
    from costopt.gavel.bench import bench_policy

    policy = _check_policy(policy)
    workload = _workload(data)
    with failures():
        result = bench_policy(policy, jobs, space_sharing, workload=workload, repeats=repeats, seed=seed)
    record = result.as_dict()
    shown = record if fmt is OutputFormat.json else _shown_bench(record)
    emit_object(shown, fmt, title="Allocation benchmark")


def _shown_bench(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "policy": r["policy"],
        "jobs": f"{r['jobs']:,}",
        "space sharing": r["space_sharing"],
        "solve time (median)": f"{r['solve_s'] * 1000:,.1f} ms",
        "peak memory (process)": f"{r['peak_mem_mb']:,.0f} MB",
        "objective": f"{r['objective']:.6g}",
    }


@app.command("validate")
def validate(
    provider: Annotated[
        str, typer.Option("--provider", help="Where the fleet's instances run: local (worker processes here).")
    ],
    jobs: Annotated[int, typer.Option(min=1, max=200, help="Jobs in the trace.")] = 24,
    policies: Annotated[
        str, typer.Option("--policies", help="Policies, comma-separated.")
    ] = "max_min_fairness,max_min_fairness_perf,finish_time_fairness_perf",
    seed: Annotated[int, typer.Option(help="Trace seed.")] = 0,
    round_length: Annotated[str, typer.Option("--round", help="Round length, e.g. 6s.")] = "6s",
    per_label: Annotated[
        int, typer.Option("--per-label", min=1, max=8, help="One-GPU instances of each label (K80, P100, V100).")
    ] = 2,
    sim_overhead: Annotated[
        str,
        typer.Option(
            "--sim-overhead",
            help="Restart overhead the simulator charges a move: 'measured' (the live mean) or a duration.",
        ),
    ] = "measured",
    sim_start: Annotated[
        str,
        typer.Option(
            "--sim-start",
            help="Seconds the simulator charges a job's first round: 'measured' (the live mean first start) "
            "or a duration (0s: Gavel's simulator, which charges none).",
        ),
    ] = "measured",
    workdir: Annotated[
        Path | None, typer.Option("--workdir", help="Keep each run's database, checkpoints and logs here.")
    ] = None,
    data: DataOpt = None,
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """Run a fleet live on this machine under each policy and the same trace through the simulator: average
    JCT and makespan live vs simulated, steps lost and repeated, round overhead (docs/gavel.md).

    Exit 1 when a job did not finish or a step was lost or repeated."""
    from api.fleet_validate import ValidationSetup
    from api.fleet_validate import validate as run_validation

    if provider.strip().lower() != "local":
        raise typer.BadParameter(
            f"only the local provider runs fleet workers on this machine, got {provider!r} (the simulated cloud "
            "runs no worker: use `costopt gavel simulate`)",
            param_hint="--provider",
        )
    names = tuple(_check_policy(p.strip()) for p in policies.split(",") if p.strip())
    if not names:
        raise typer.BadParameter("give at least one policy", param_hint="--policies")
    round_s = parse_seconds(round_length, "--round")
    overhead = None if sim_overhead.strip().lower() == "measured" else parse_seconds(sim_overhead, "--sim-overhead")
    if round_s < 1 or (overhead is not None and overhead >= round_s):
        raise typer.BadParameter("need --round >= 1s and --sim-overhead shorter than a round", param_hint="--round")
    start = None if sim_start.strip().lower() == "measured" else parse_seconds(sim_start, "--sim-start")
    if start is not None and start >= round_s:
        raise typer.BadParameter("--sim-start must be shorter than a round", param_hint="--sim-start")
    settings = settings_with(data)
    try:
        setup = ValidationSetup(jobs=jobs, policies=names, seed=seed, round_s=round_s, per_label=per_label)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    with failures():
        from rich.console import Console

        console = Console(stderr=True)
        with console.status("validating...") as status:

            def progress(message: str) -> None:
                status.update(message)
                if not message.startswith("{"):
                    console.log(message)

            results = run_validation(
                setup,
                settings=settings,
                workdir=workdir,
                sim_overhead_s=overhead,
                sim_start_s=start,
                progress=progress,
            )
    rows = [r.as_dict() for r in results]
    columns = [
        ("policy", "policy", None),
        ("live_avg_jct_s", "JCT live", "s"),
        ("sim_avg_jct_s", "JCT sim", "s"),
        ("jct_error", "JCT error", None),
        ("live_makespan_s", "makespan live", "s"),
        ("sim_makespan_s", "makespan sim", "s"),
        ("makespan_error", "makespan error", None),
        ("lost_steps", "lost", "steps"),
        ("repeated_steps", "repeated", "steps"),
        ("round_overhead_s", "round overhead", "s"),
        ("sim0_avg_jct_s", "JCT sim, no overhead", "s"),
    ]
    emit(rows, columns, fmt, title=f"fleet live vs simulated ({jobs} jobs, {round_s:g} s rounds)")
    if any(r.lost_steps or r.repeated_steps or r.jobs_done < r.jobs for r in results):
        raise typer.Exit(Exit.FAILED)
