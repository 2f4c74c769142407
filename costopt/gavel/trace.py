"""Synthetic job traces as in Gavel's evaluation, deterministic per seed.

* Job type: uniform over the workload's single-GPU entries (26 for Gavel's file). With ``multi_gpu``,
  the GPU count is drawn first (1, 2, 4, 8 GPUs with probability 0.70, 0.10, 0.15, 0.05), then the
  type uniformly among the entries measured at that count.
* Duration on a V100 (alone, consolidated): ``60 * 10**U(1.5, 3)`` s for 80% of jobs and
  ``60 * 10**U(3, 4)`` s for the other 20%; total steps = duration x the entry's V100 throughput.
* SLO (optional): duration x a factor drawn from {1.2, 2, 10}.
* Arrivals: Poisson at ``rate_per_hour`` (the first job at t = 0), or all at t = 0 (static trace).

Every attribute comes from its own random stream, so the first ``k`` jobs of a trace do not depend
on how many jobs are generated.

Recorded traces (:func:`read_trace`, :func:`write_trace`) are JSON lines, one job per line in arrival
order: ``job_id`` (int >= 0, unique), ``arrival_s`` (seconds >= 0, not decreasing), ``job_type`` (a job
type of the throughput catalog, e.g. ``"ResNet-18 (batch size 16)"``), ``scale_factor`` (GPUs, a count
the catalog measured for that type on every worker type), ``total_steps`` (> 0), ``priority_weight``
(> 0) and ``slo_s`` (seconds allowed from arrival, > 0, or null for none). A line that breaks any of
this is refused with its line number (:class:`~costopt.gavel.errors.TraceFileError`); blank lines are
skipped.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from costopt.gavel.errors import InvalidState, TraceFileError
from costopt.gavel.state import FloatArray, IntArray
from costopt.gavel.workload import Workload

TRACE_KEYS: tuple[str, ...] = (
    "job_id",
    "arrival_s",
    "job_type",
    "scale_factor",
    "total_steps",
    "priority_weight",
    "slo_s",
)
"""The keys of a recorded trace's lines, in the order :func:`write_trace` writes them."""

SHORT_LOG10_MINUTES = (1.5, 3.0)
LONG_LOG10_MINUTES = (3.0, 4.0)
LONG_FRACTION = 0.2
MULTI_GPU_MIX: tuple[tuple[int, float], ...] = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))
SLO_FACTORS: tuple[float, ...] = (1.2, 2.0, 10.0)


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """Jobs in arrival order, one row each. ``entry``: workload row; ``duration_s``: time alone on a
    V100; ``steps``: total steps; ``slo_s``: time allowed from arrival (inf = none); ``job_id``: the
    jobs' ids (default: the row numbers; windows select by id); ``weight``: priority weights
    (default 1)."""

    entry: IntArray
    scale_factor: IntArray
    arrival_s: FloatArray
    duration_s: FloatArray
    steps: FloatArray
    slo_s: FloatArray
    job_id: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    weight: FloatArray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        n = self.entry.shape[0]
        if self.job_id.shape[0] == 0 and n:
            object.__setattr__(self, "job_id", np.arange(n, dtype=np.int64))
        if self.weight.shape[0] == 0 and n:
            object.__setattr__(self, "weight", np.ones(n))
        for name in ("scale_factor", "arrival_s", "duration_s", "steps", "slo_s", "job_id", "weight"):
            if getattr(self, name).shape != (n,):
                raise InvalidState(f"trace column {name} must have one value per job ({n})")

    @property
    def n_jobs(self) -> int:
        return int(self.entry.shape[0])

    def window_mask(self, window: tuple[int, int] | None) -> npt.NDArray[np.bool_]:
        """Rows whose job id is in ``[first, end)`` (every row for ``None``)."""
        if window is None:
            return np.ones(self.n_jobs, dtype=bool)
        lo, hi = window
        out: npt.NDArray[np.bool_] = (self.job_id >= lo) & (self.job_id < hi)
        return out


def generate_trace(
    workload: Workload,
    n_jobs: int,
    *,
    rate_per_hour: float | None,
    seed: int,
    multi_gpu: bool = False,
    slos: bool = False,
) -> Trace:
    """A trace of ``n_jobs`` jobs; ``rate_per_hour=None`` gives a static trace (all arrive at 0)."""
    if n_jobs < 0:
        raise InvalidState(f"n_jobs must be >= 0, got {n_jobs}")
    if rate_per_hour is not None and not rate_per_hour > 0:
        raise InvalidState(f"rate_per_hour must be > 0 jobs/hour (None for a static trace), got {rate_per_hour}")
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(7)]
    counts = np.array([c for c, _ in MULTI_GPU_MIX])
    if multi_gpu:
        probs = np.array([p for _, p in MULTI_GPU_MIX])
        sf = counts[np.searchsorted(np.cumsum(probs), streams[0].random(n_jobs), side="right").clip(0, len(counts) - 1)]
    else:
        sf = np.ones(n_jobs, dtype=np.int64)
    u_type = streams[1].random(n_jobs)
    entry = np.zeros(n_jobs, dtype=np.int64)
    for c in np.unique(sf).tolist():
        cands = workload.entries_with_scale_factor(int(c))
        if cands.size == 0:
            raise InvalidState(f"the workload has no job type measured at {c} GPUs")
        rows = sf == c
        entry[rows] = cands[np.minimum((u_type[rows] * cands.size).astype(np.int64), cands.size - 1)]
    long = streams[2].random(n_jobs) < LONG_FRACTION
    u = streams[3].random(n_jobs)
    lo = np.where(long, LONG_LOG10_MINUTES[0], SHORT_LOG10_MINUTES[0])
    hi = np.where(long, LONG_LOG10_MINUTES[1], SHORT_LOG10_MINUTES[1])
    duration = 60.0 * 10.0 ** (lo + (hi - lo) * u)
    steps = duration * workload.consolidated[entry, workload.reference_type()]
    if rate_per_hour is None:
        arrival = np.zeros(n_jobs)
    else:
        gaps = streams[4].exponential(3600.0 / rate_per_hour, n_jobs)
        arrival = np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if n_jobs else np.zeros(0)
    factors = np.array(SLO_FACTORS)[streams[5].integers(0, len(SLO_FACTORS), n_jobs)]
    slo = duration * factors if slos else np.full(n_jobs, np.inf)
    return Trace(
        entry=entry, scale_factor=sf.astype(np.int64), arrival_s=arrival, duration_s=duration, steps=steps, slo_s=slo
    )


def write_trace(trace: Trace, workload: Workload, out: IO[str]) -> int:
    """Write ``trace`` as JSON lines (see the module docstring); returns the number of lines. Floats are
    written exactly (shortest repr), so :func:`read_trace` gives the same trace back."""
    names = [workload.job_type_name(int(e)) for e in range(workload.n_entries)]
    for i in range(trace.n_jobs):
        slo = float(trace.slo_s[i])
        row = {
            "job_id": int(trace.job_id[i]),
            "arrival_s": float(trace.arrival_s[i]),
            "job_type": names[int(trace.entry[i])],
            "scale_factor": int(trace.scale_factor[i]),
            "total_steps": float(trace.steps[i]),
            "priority_weight": float(trace.weight[i]),
            "slo_s": slo if math.isfinite(slo) else None,
        }
        out.write(json.dumps(row) + "\n")
    return trace.n_jobs


def read_trace(lines: Iterable[str], workload: Workload, *, source: str = "trace") -> Trace:
    """Parse a recorded trace (JSON lines, see the module docstring) against ``workload``'s job types.

    Raises :class:`~costopt.gavel.errors.TraceFileError` naming ``source`` and the first line at fault
    (an unknown job type lists the close matches)."""
    entry_of = {(workload.job_type_name(e), int(workload.scale_factor[e])): e for e in range(workload.n_entries)}
    counts: dict[str, list[int]] = {}
    for name, sf in sorted(entry_of):
        counts.setdefault(name, []).append(sf)
    rows: list[tuple[int, float, int, int, float, float, float]] = []
    seen: dict[int, int] = {}
    last_arrival = -math.inf
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue

        def bad(problem: str, number: int = number) -> TraceFileError:
            return TraceFileError(source, number, problem)

        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise bad(f"not JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(doc, dict):
            raise bad(f"a line must be a JSON object with keys {', '.join(TRACE_KEYS)}")
        missing = [k for k in TRACE_KEYS if k not in doc]
        extra = sorted(set(doc) - set(TRACE_KEYS))
        if missing or extra:
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
                [f"unknown key(s) {', '.join(extra)}"] if extra else []
            )
            raise bad(f"{'; '.join(parts)} (a line has exactly {', '.join(TRACE_KEYS)})")
        job_id = _integer(doc["job_id"], "job_id", 0, bad)
        if job_id in seen:
            raise bad(f"job_id {job_id} repeats line {seen[job_id]}")
        seen[job_id] = number
        arrival = _number(doc["arrival_s"], "arrival_s", bad, minimum=0.0)
        if arrival < last_arrival:
            raise bad(
                f"arrival_s {arrival:g} is before the previous line's {last_arrival:g}: lines must be in arrival order"
            )
        last_arrival = arrival
        sf = _integer(doc["scale_factor"], "scale_factor", 1, bad)
        name = doc["job_type"]
        if not isinstance(name, str):
            raise bad(f"job_type must be a string, got {name!r}")
        if name not in counts:
            close = difflib.get_close_matches(name, list(counts), n=3, cutoff=0.6)
            hint = f"; close: {', '.join(close)}" if close else f"; known: {', '.join(list(counts)[:6])}, ..."
            raise bad(f"unknown job_type {name!r}{hint}")
        if (name, sf) not in entry_of:
            raise bad(f"job_type {name!r} is not measured at scale_factor {sf} (measured at: {counts[name]})")
        steps = _number(doc["total_steps"], "total_steps", bad, positive=True)
        weight = _number(doc["priority_weight"], "priority_weight", bad, positive=True)
        slo = math.inf if doc["slo_s"] is None else _number(doc["slo_s"], "slo_s", bad, positive=True)
        rows.append((job_id, arrival, entry_of[(name, sf)], sf, steps, weight, slo))
    if not rows:
        raise TraceFileError(source, 0, "no jobs (the file has no non-blank line)")
    job_id_a, arrival_a, entry_a, sf_a, steps_a, weight_a, slo_a = (np.array(c) for c in zip(*rows, strict=True))
    entry = entry_a.astype(np.int64)
    total_steps = steps_a.astype(np.float64)
    return Trace(
        entry=entry,
        scale_factor=sf_a.astype(np.int64),
        arrival_s=arrival_a.astype(np.float64),
        duration_s=total_steps / workload.consolidated[entry, workload.reference_type()],
        steps=total_steps,
        slo_s=slo_a.astype(np.float64),
        job_id=job_id_a.astype(np.int64),
        weight=weight_a.astype(np.float64),
    )


def _number(
    value: Any, key: str, bad: Callable[[str], TraceFileError], *, minimum: float = 0.0, positive: bool = False
) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(f"{key} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out) or out < minimum or (positive and out <= 0):
        raise bad(f"{key} must be a finite number {'> 0' if positive else f'>= {minimum:g}'}, got {value!r}")
    return out


def _integer(value: Any, key: str, minimum: int, bad: Callable[[str], TraceFileError]) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"{key} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise bad(f"{key} must be an integer >= {minimum}, got {value}")
    return int(value)
