"""Allocation policies behind one interface (:class:`Policy`) and a registry of names.

Names follow Gavel's code base (``_perf`` = heterogeneity-aware); ``hierarchical_*`` are this
project's additions, and ``max_min_fairness_pareto_perf`` is an alias of ``max_min_fairness_perf``
(which takes the Pareto stage). Space sharing is not a name: it is switched on
in the :class:`~costopt.gavel.state.ClusterState` (``space_sharing=True``) and honoured by the aware
LP policies.
"""

from __future__ import annotations

from collections.abc import Callable

from costopt.gavel.errors import UnknownPolicy
from costopt.gavel.policies.base import Policy
from costopt.gavel.policies.fairness import Hierarchical, MaxMinFairness
from costopt.gavel.policies.fifo import Fifo
from costopt.gavel.policies.finish_time import FinishTimeFairness, MinTotalDuration
from costopt.gavel.policies.throughput import MaxSumThroughput, MaxThroughputPerDollar
from costopt.registry import Registry

POLICIES: Registry[Callable[[], Policy]] = Registry("policy", error=UnknownPolicy)
"""Every policy by name (case-insensitive); each entry makes a fresh policy."""

_FACTORIES: dict[str, Callable[[], Policy]] = {
    "max_min_fairness": lambda: MaxMinFairness(name="max_min_fairness", aware=False),
    # The aware LAS takes the Pareto stage: of the allocations at the max-min level, the one with the
    # largest total normalized throughput, not the solver's vertex (issue 12, docs/gavel.md).
    "max_min_fairness_perf": lambda: MaxMinFairness(name="max_min_fairness_perf", aware=True, pareto=True),
    "finish_time_fairness": lambda: FinishTimeFairness(name="finish_time_fairness", aware=False),
    "finish_time_fairness_perf": lambda: FinishTimeFairness(name="finish_time_fairness_perf", aware=True),
    "min_total_duration": lambda: MinTotalDuration(name="min_total_duration", aware=False),
    "min_total_duration_perf": lambda: MinTotalDuration(name="min_total_duration_perf", aware=True),
    "fifo": lambda: Fifo(name="fifo", aware=False),
    "fifo_perf": lambda: Fifo(name="fifo_perf", aware=True),
    "max_sum_throughput_perf": lambda: MaxSumThroughput(name="max_sum_throughput_perf"),
    "max_sum_throughput_normalized_by_cost_perf": lambda: MaxThroughputPerDollar(
        name="max_sum_throughput_normalized_by_cost_perf", slos=False
    ),
    "max_sum_throughput_normalized_by_cost_perf_SLOs": lambda: MaxThroughputPerDollar(
        name="max_sum_throughput_normalized_by_cost_perf_SLOs", slos=True
    ),
    "hierarchical_fairness_perf": lambda: Hierarchical(name="hierarchical_fairness_perf", within="fairness"),
    "hierarchical_fifo_perf": lambda: Hierarchical(name="hierarchical_fifo_perf", within="fifo"),
}
_ALIASES: dict[str, tuple[str, ...]] = {
    # its own name until the aware LAS took the Pareto stage (2026-12-04); fleets may have stored it
    "max_min_fairness_perf": ("max_min_fairness_pareto_perf",),
}
for _name, _factory in _FACTORIES.items():
    POLICIES.register(_name, _factory, aliases=_ALIASES.get(_name, ()))

POLICY_NAMES: tuple[str, ...] = POLICIES.names()


def get_policy(name: str) -> Policy:
    """A new policy registered under ``name`` (any case); :class:`UnknownPolicy` lists the known names
    and the close matches otherwise."""
    return POLICIES.get(name)()


__all__ = [
    "POLICIES",
    "POLICY_NAMES",
    "Fifo",
    "FinishTimeFairness",
    "Hierarchical",
    "MaxMinFairness",
    "MaxSumThroughput",
    "MaxThroughputPerDollar",
    "MinTotalDuration",
    "Policy",
    "get_policy",
]
