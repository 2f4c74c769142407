"""Typed errors of the Gavel scheduler (policies, mechanism, simulator)."""

from __future__ import annotations

from costopt.errors import CostoptError
from costopt.registry import UnknownName


class GavelError(CostoptError):
    """Base of the scheduler's errors."""


class InvalidState(GavelError, ValueError):
    """A cluster state, trace or argument that breaks its contract (shapes, negative values, NaN...)."""


class TraceFileError(GavelError, ValueError):
    """A recorded trace that cannot be read: ``line`` (1-based) is the line at fault (0: the whole file)."""

    def __init__(self, source: str, line: int, problem: str) -> None:
        self.source = source
        self.line = line
        self.problem = problem
        where = f"{source} line {line}" if line > 0 else source
        super().__init__(f"{where}: {problem}")


class UnknownPolicy(GavelError, UnknownName):
    """A policy name that is not in the registry; the message lists the known names and close matches."""


class SolverFailed(GavelError):
    """The LP solver did not return an optimum. ``status`` is the solver's model status."""

    def __init__(self, what: str, status: str, detail: str = "") -> None:
        self.what = what
        self.status = status
        msg = f"{what}: solver returned {status}"
        super().__init__(f"{msg} ({detail})" if detail else msg)


class Infeasible(SolverFailed):
    """The LP has no feasible point (e.g. SLO deadlines that no allocation can meet)."""
