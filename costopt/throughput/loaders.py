"""Loaders of Gavel's measured-throughput files (steps/s). Nothing is read at import time.

Two formats exist:

* **Gavel's simulator format** (``gavel/simulation_throughputs.json``, ``physical_cluster_throughputs.json``)::

      {worker_type: {"('<job type>', <scale factor>)": {"null": isolated,
                                                         "('<other job type>', <same sf>)": [self, other]}}}

  Keys are Python tuple literals, parsed with :func:`ast.literal_eval` (literals only, length-capped).
  The scale factor is the job's GPU count. Worker types ``k80``/``p100``/``v100`` hold jobs whose GPUs
  are in one server (placement ``consolidated``); ``<acc>_unconsolidated`` hold the same jobs spread over
  servers (placement ``spread``). Their scale-factor-1 entries duplicate the consolidated ones and are
  not loaded as spread (a single GPU has no placement). Co-location pairs are loaded from the
  consolidated worker types only (for every scale factor); the spread pairs are ignored.
* **The older single-GPU format** (``prices/gavel_oracle_throughputs_k80_p100_v100.json``, the
  dynamic-pricing paper's file)::

      {gpu_type: {"<job type>": {"null": isolated, "<other job type>": [self, other]}}}

  Job types are bare display names (no tuple, no scale factor); every value is for 1 GPU.

The two files disagree on every shared cell (see ``/work/shared/data/README.md``); load the one your
analysis needs, not both into one catalog. A throughput of 0 means "cannot run" and is kept as 0.

Paths are arguments: the constants below are relative to the data folder (``Settings.data_dir``).
Malformed content raises :class:`MalformedThroughputFile` naming the file and the entry; a missing
file raises the usual :class:`FileNotFoundError`.
"""

from __future__ import annotations

import ast
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from costopt.domain import normalize_accelerator
from costopt.throughput.errors import InvalidThroughput, MalformedThroughputFile
from costopt.throughput.model import JobType, PairKey, PairThroughput, Placement, ThroughputKey

log = logging.getLogger(__name__)

GAVEL_SIMULATION_FILE = Path("gavel/simulation_throughputs.json")
"""Gavel's simulator throughputs, relative to the data folder (the default catalog source)."""
GAVEL_PHYSICAL_FILE = Path("gavel/physical_cluster_throughputs.json")
"""Gavel's re-measured physical-cluster throughputs (same format), relative to the data folder."""
GAVEL_ORACLE_FILE = Path("prices/gavel_oracle_throughputs_k80_p100_v100.json")
"""The dynamic-pricing paper's older single-GPU file, relative to the data folder."""

SPREAD_SUFFIX = "_unconsolidated"
_MAX_KEY_LENGTH = 300  # far above any real key; bounds literal_eval's work on hostile input


@dataclass(frozen=True, slots=True, eq=False)
class ThroughputMeasurements:
    """The content of one throughput file: isolated throughputs and co-location pairs (steps/s).

    ``job_types`` lists every job type in file order. Mappings are read-only.
    """

    source: str
    isolated: Mapping[ThroughputKey, float]
    pairs: Mapping[PairKey, PairThroughput]
    job_types: tuple[JobType, ...]


def load_throughput_file(path: Path) -> ThroughputMeasurements:
    """Load either format, told apart by the job keys (tuple literals or bare names)."""
    data = _read_json(path)
    for per_acc in data.values():
        if isinstance(per_acc, dict) and per_acc:
            first = next(iter(per_acc))
            if isinstance(first, str) and first.lstrip().startswith("("):
                return _parse_gavel(path, data)
            return _parse_oracle(path, data)
    raise MalformedThroughputFile(path, "<file>", "no accelerator holds any job type")


def load_gavel_throughputs(path: Path) -> ThroughputMeasurements:
    """Load Gavel's simulator format (tuple-literal keys, scale factors, consolidated and spread)."""
    return _parse_gavel(path, _read_json(path))


def load_oracle_throughputs(path: Path) -> ThroughputMeasurements:
    """Load the older single-GPU format (bare job-type names; all values at 1 GPU, consolidated)."""
    return _parse_oracle(path, _read_json(path))


def _read_json(path: Path) -> dict[str, Any]:
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedThroughputFile(path, "<file>", f"not JSON ({exc})") from exc
    if not isinstance(data, dict) or not data:
        raise MalformedThroughputFile(path, "<file>", "expected a non-empty JSON object keyed by accelerator")
    return data


class _Builder:
    """Accumulates one file's entries; keeps job types in first-seen order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.isolated: dict[ThroughputKey, float] = {}
        self.pairs: dict[PairKey, PairThroughput] = {}
        self.job_types: dict[JobType, None] = {}  # job keys in file order
        self.partners: dict[JobType, None] = {}  # job types seen only as co-location partners so far
        self._parsed: dict[str, JobType] = {}

    def job(self, name: str, entry: str, *, partner: bool = False) -> JobType:
        jt = self._parsed.get(name)
        if jt is None:
            try:
                jt = JobType.parse(name)
            except InvalidThroughput as exc:
                raise MalformedThroughputFile(self.path, entry, str(exc)) from exc
            self._parsed[name] = jt
        (self.partners if partner else self.job_types).setdefault(jt, None)
        return jt

    def value(self, raw: object, entry: str) -> float:
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) or raw < 0:
            raise MalformedThroughputFile(self.path, entry, f"throughput must be a finite number >= 0, got {raw!r}")
        return float(raw)

    def pair(self, raw: object, entry: str) -> PairThroughput:
        if not isinstance(raw, list) or len(raw) != 2:
            raise MalformedThroughputFile(self.path, entry, f"a co-location value must be [self, other], got {raw!r}")
        return self.value(raw[0], entry), self.value(raw[1], entry)

    def result(self) -> ThroughputMeasurements:
        if not self.isolated:
            raise MalformedThroughputFile(self.path, "<file>", "no throughput found")
        return ThroughputMeasurements(
            source=str(self.path),
            isolated=MappingProxyType(self.isolated),
            pairs=MappingProxyType(self.pairs),
            job_types=tuple(dict.fromkeys([*self.job_types, *self.partners])),
        )


def _accelerator(path: Path, raw: str) -> str:
    acc = normalize_accelerator(raw)
    if not acc:
        raise MalformedThroughputFile(path, repr(raw), "empty accelerator name")
    return acc


def _job_mapping(path: Path, raw: object, entry: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise MalformedThroughputFile(path, entry, f"expected an object of job types, got {type(raw).__name__}")
    return raw


def _parse_gavel(path: Path, data: dict[str, Any]) -> ThroughputMeasurements:
    path = Path(path)
    b = _Builder(path)
    keys: dict[str, tuple[str, int]] = {}  # parse each distinct key string once

    def job_key(raw: str, entry: str) -> tuple[str, int]:
        if raw not in keys:
            keys[raw] = _parse_tuple_key(path, raw, entry)
        return keys[raw]

    spread_single: dict[ThroughputKey, float] = {}
    for worker, jobs in data.items():
        spread = worker.endswith(SPREAD_SUFFIX)
        placement: Placement = "spread" if spread else "consolidated"
        acc = _accelerator(path, worker.removesuffix(SPREAD_SUFFIX))
        for job_raw, inner in _job_mapping(path, jobs, repr(worker)).items():
            entry = f"[{worker!r}][{job_raw!r}]"
            name, sf = job_key(job_raw, entry)
            jt = b.job(name, entry)
            if not isinstance(inner, dict) or "null" not in inner:
                raise MalformedThroughputFile(path, entry, 'expected an object with an isolated "null" throughput')
            key = ThroughputKey(jt, acc, sf, placement)
            value = b.value(inner["null"], entry + "['null']")
            if spread and sf == 1:
                spread_single[key] = value
            else:
                b.isolated[key] = value
            for other_raw, pair_raw in inner.items():
                if other_raw == "null":
                    continue
                pentry = f"{entry}[{other_raw!r}]"
                other_name, other_sf = job_key(other_raw, pentry)
                if other_sf != sf:
                    raise MalformedThroughputFile(
                        path, pentry, f"co-located jobs must share the scale factor, got {sf} and {other_sf}"
                    )
                pair = b.pair(pair_raw, pentry)
                if not spread:
                    b.pairs[PairKey(jt, b.job(other_name, pentry, partner=True), acc, sf)] = pair
    differing = 0
    for key, value in spread_single.items():
        if key not in b.isolated:
            b.isolated[key] = value
        elif b.isolated[key] != value:
            differing += 1
    if differing:
        log.warning(
            "%s: %d single-GPU values of *%s worker types differ from the consolidated ones; kept the latter",
            path,
            differing,
            SPREAD_SUFFIX,
        )
    result = b.result()
    log.info(
        "loaded %d throughputs and %d co-location pairs of %d job types from %s",
        len(result.isolated),
        len(result.pairs),
        len(result.job_types),
        path,
    )
    return result


def _parse_tuple_key(path: Path, raw: str, entry: str) -> tuple[str, int]:
    if not isinstance(raw, str) or len(raw) > _MAX_KEY_LENGTH:
        raise MalformedThroughputFile(path, entry, "job key must be a short \"('<job type>', <scale factor>)\" string")
    try:
        parsed = ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise MalformedThroughputFile(
            path, entry, f"job key {raw!r} is not a \"('<job type>', <scale factor>)\" literal"
        ) from exc
    if (
        not isinstance(parsed, tuple)
        or len(parsed) != 2
        or not isinstance(parsed[0], str)
        or isinstance(parsed[1], bool)
        or not isinstance(parsed[1], int)
        or parsed[1] < 1
    ):
        raise MalformedThroughputFile(path, entry, f"job key must be (job type name, scale factor >= 1), got {raw!r}")
    return parsed[0], parsed[1]


def _parse_oracle(path: Path, data: dict[str, Any]) -> ThroughputMeasurements:
    path = Path(path)
    b = _Builder(path)
    for gpu, jobs in data.items():
        acc = _accelerator(path, gpu)
        for job_raw, inner in _job_mapping(path, jobs, repr(gpu)).items():
            entry = f"[{gpu!r}][{job_raw!r}]"
            if job_raw.lstrip().startswith("("):
                raise MalformedThroughputFile(path, entry, "tuple key: this is Gavel's simulator format")
            jt = b.job(job_raw, entry)
            if not isinstance(inner, dict) or "null" not in inner:
                raise MalformedThroughputFile(path, entry, 'expected an object with an isolated "null" throughput')
            b.isolated[ThroughputKey(jt, acc)] = b.value(inner["null"], entry + "['null']")
            for other_raw, pair_raw in inner.items():
                if other_raw == "null":
                    continue
                pentry = f"{entry}[{other_raw!r}]"
                b.pairs[PairKey(jt, b.job(other_raw, pentry, partner=True), acc)] = b.pair(pair_raw, pentry)
    result = b.result()
    log.info(
        "loaded %d single-GPU throughputs of %d job types from %s", len(result.isolated), len(result.job_types), path
    )
    return result
