"""Which GPUs of which instance each job of a round holds.

The round mechanism (:class:`costopt.gavel.mechanism.RoundMechanism`) says which jobs run on which worker
type and how many GPUs each takes; this module puts them on the fleet's instances:

1. a job that held GPUs last round on a live instance of the type it runs on now keeps exactly those GPUs
   when they are still free (its lease is extended: its copy goes on, no checkpoint, no restart);
2. the others, largest first, go to the instance of their type with the fewest free GPUs that still fits
   them (best fit: large holes stay for multi-GPU jobs), lowest GPU indices first; ties: instance order;
3. a job that fits no single instance (its GPUs are free only across instances) waits this round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Slot", "Unit", "place"]


@dataclass(frozen=True, slots=True)
class Unit:
    """A job the mechanism runs this round: its worker type and GPU count."""

    job_id: str
    wtype: str
    gpus: int


@dataclass(frozen=True, slots=True)
class Slot:
    """An instance the round may use: its id, worker type and GPU count (indices ``0 .. gpus - 1``)."""

    instance: str
    wtype: str
    gpus: int


def place(
    units: Sequence[Unit], slots: Sequence[Slot], previous: Mapping[str, tuple[str, tuple[int, ...]]]
) -> tuple[dict[str, tuple[str, tuple[int, ...]]], list[str]]:
    """``({job id: (instance, GPU indices)}, [job ids that fit nowhere])`` for ``units`` on ``slots``;
    ``previous``: where each job held GPUs last round (see the module docstring for the rules)."""
    free: dict[str, list[bool]] = {s.instance: [True] * s.gpus for s in slots}
    wtype = {s.instance: s.wtype for s in slots}
    order = {s.instance: k for k, s in enumerate(slots)}
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    rest: list[Unit] = []
    for u in units:
        prev = previous.get(u.job_id)
        if prev is not None:
            inst, gpus = prev
            cells = free.get(inst)
            if (
                cells is not None
                and wtype[inst] == u.wtype
                and len(gpus) == u.gpus
                and all(0 <= g < len(cells) and cells[g] for g in gpus)
            ):
                for g in gpus:
                    cells[g] = False
                out[u.job_id] = (inst, tuple(gpus))
                continue
        rest.append(u)
    unplaced: list[str] = []
    for u in sorted(rest, key=lambda u: -u.gpus):  # stable: the mechanism's order among equals
        fits = [
            (sum(cells), order[inst], inst)
            for inst, cells in free.items()
            if wtype[inst] == u.wtype and sum(cells) >= u.gpus
        ]
        if not fits:
            unplaced.append(u.job_id)
            continue
        _, _, inst = min(fits)
        cells = free[inst]
        take = tuple(g for g, ok in enumerate(cells) if ok)[: u.gpus]
        for g in take:
            cells[g] = False
        out[u.job_id] = (inst, take)
    return out, unplaced
