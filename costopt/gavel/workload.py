"""The job types the simulator draws from, as arrays taken from the throughput catalog.

An *entry* is a (job type, scale factor) the catalog measured on every worker type: Gavel's file has
26 single-GPU entries and 19 job types at 2, 4 and 8 GPUs (83 entries). Throughputs are steps/s of
the whole job; ``spread`` holds the throughput when the job's GPUs span several servers (the
consolidated value where the catalog has none, and for 1 GPU). ``pair[a, b, j]`` is entry ``a``'s
steps/s co-located with entry ``b`` on type ``j`` (0 = cannot share, or different scale factors).

The Gavel file is read by :mod:`costopt.throughput` only; this module turns a catalog into arrays.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from costopt.gavel.errors import InvalidState
from costopt.gavel.state import FloatArray, IntArray
from costopt.throughput import ThroughputCatalog, load_gavel_throughputs

log = logging.getLogger(__name__)

GAVEL_WORKER_TYPES: tuple[str, ...] = ("v100", "p100", "k80")
"""Worker types of Gavel's simulations, in the order of ``--cluster V100:P100:K80``."""


@dataclass(frozen=True, slots=True, eq=False)
class Workload:
    """Arrays over catalog entries (rows) and worker types (columns); see the module docstring."""

    names: tuple[str, ...]
    scale_factor: IntArray
    worker_types: tuple[str, ...]
    consolidated: FloatArray
    spread: FloatArray
    pair: FloatArray

    @property
    def n_entries(self) -> int:
        return len(self.names)

    def entries_with_scale_factor(self, sf: int) -> IntArray:
        out: IntArray = np.nonzero(self.scale_factor == sf)[0].astype(np.int64)
        return out

    def job_type_name(self, entry: int) -> str:
        """The catalog's job type of ``entry`` (its name without the `` xN`` GPU count)."""
        return self.names[entry].rsplit(" x", 1)[0]

    def reference_type(self) -> int:
        """Column of the V100 (durations in traces are V100 seconds); the first type otherwise."""
        return self.worker_types.index("v100") if "v100" in self.worker_types else 0


def workload_from_catalog(catalog: ThroughputCatalog, worker_types: Sequence[str] = GAVEL_WORKER_TYPES) -> Workload:
    """Entries are the (job type, GPU count) cells known on every worker type, in catalog order,
    single-GPU first; unknown cells are left out rather than guessed."""
    wts = tuple(worker_types)
    names: list[str] = []
    sfs: list[int] = []
    cons: list[FloatArray] = []
    spread: list[FloatArray] = []
    keys: list[str] = []
    for sf in catalog.gpu_counts():
        rows, _, mat = catalog.matrix(sf, "consolidated", accelerators=wts)
        _, _, spr = catalog.matrix(sf, "spread", accelerators=wts) if sf > 1 else (rows, wts, mat)
        for i, name in enumerate(rows):
            if np.all(np.isfinite(mat[i])):
                names.append(f"{name} x{sf}")
                keys.append(name)
                sfs.append(sf)
                cons.append(mat[i])
                spread.append(np.where(np.isfinite(spr[i]), spr[i], mat[i]))
    if not names:
        raise InvalidState(f"the catalog has no job type measured on all of {wts}")
    sf_arr = np.array(sfs, dtype=np.int64)
    k = len(names)
    pair = np.zeros((k, k, len(wts)))
    for sf in np.unique(sf_arr).tolist():
        idx = np.nonzero(sf_arr == sf)[0].tolist()
        for a in idx:
            for b in idx:
                for j, acc in enumerate(wts):
                    got = catalog.pair(keys[a], keys[b], acc, int(sf))
                    if got is not None:
                        pair[a, b, j] = got[0]
    log.info("workload: %d entries (%s GPUs) on %s", k, sorted(set(sfs)), wts)
    return Workload(
        names=tuple(names),
        scale_factor=sf_arr,
        worker_types=wts,
        consolidated=np.array(cons),
        spread=np.array(spread),
        pair=pair,
    )


@lru_cache(maxsize=4)
def load_workload(path: Path, worker_types: tuple[str, ...] = GAVEL_WORKER_TYPES) -> Workload:
    """The workload of a Gavel-format throughput file (read once per path and worker types)."""
    catalog = ThroughputCatalog.from_measurements(load_gavel_throughputs(Path(path)))
    return workload_from_catalog(catalog, worker_types)
