"""Each team's on-demand reference for the savings reports (the ``COSTOPT_REPORT_BASELINES`` setting).

A light module (the domain only): the settings check the rules at start-up with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from costopt.domain import Cloud, Market, OfferKey
from costopt.reports.errors import ReportError

__all__ = ["DEFAULT_REFERENCE", "Reference", "ReferenceRules"]

DEFAULT_REFERENCE = "aws/us-east-1"
"""The home region when no rule names one: on-demand in AWS us-east-1."""


@dataclass(frozen=True, slots=True)
class Reference:
    """Where a team's on-demand baseline runs: a cloud region, and optionally a fixed instance type
    (None: the planner picks the cheapest on-demand instance there for the job at submission)."""

    cloud: Cloud
    region: str
    instance_type: str | None
    rule: str

    def offer(self) -> OfferKey:
        if self.instance_type is None:
            raise ReportError(f"{self.rule} names no instance type")
        return OfferKey(self.cloud, self.region, "", self.instance_type, Market.ON_DEMAND)


def _parse_reference(key: str, value: str) -> Reference:
    parts = [p.strip() for p in str(value).split("/")]
    if len(parts) not in (2, 3) or not all(parts):
        raise ReportError(
            f"report baseline {key!r}: {value!r} is not 'cloud/region' or 'cloud/region/instance_type' "
            f"(e.g. aws/us-east-1 or aws/us-east-1/p3.2xlarge)"
        )
    try:
        cloud = Cloud(parts[0].lower())
    except ValueError as exc:
        raise ReportError(
            f"report baseline {key!r}: unknown cloud {parts[0]!r}; one of {', '.join(c.value for c in Cloud)}"
        ) from exc
    return Reference(cloud, parts[1], parts[2] if len(parts) == 3 else None, f"{key} -> {value}")


class ReferenceRules:
    """Each team's on-demand reference, from a mapping (the ``COSTOPT_REPORT_BASELINES`` setting).

    Keys: a team's id or name, or ``*`` (every team), optionally with ``:<gpus>`` (jobs of that GPU
    count); values ``cloud/region`` or ``cloud/region/instance_type``. The most specific key wins:
    ``<team id>:<gpus>``, ``<team name>:<gpus>``, ``<team id>``, ``<team name>``, ``*:<gpus>``, ``*``;
    without a ``*`` rule, ``*`` is :data:`DEFAULT_REFERENCE`."""

    def __init__(self, rules: Mapping[str, str] | None = None) -> None:
        self._rules = {str(k).strip(): _parse_reference(str(k).strip(), v) for k, v in (rules or {}).items()}
        self._rules.setdefault("*", _parse_reference("*", DEFAULT_REFERENCE))
        for key in self._rules:
            head, _, gpus = key.partition(":")
            if not head or (gpus and not gpus.isdigit()):
                raise ReportError(f"report baseline key {key!r}: use a team id or name, or *, then optionally :<gpus>")

    def reference(self, team_id: str, team_name: str | None, gpus: int) -> Reference:
        names = [n for n in (team_id, team_name) if n]
        for key in [*(f"{n}:{gpus}" for n in names), *names, f"*:{gpus}", "*"]:
            if key in self._rules:
                return self._rules[key]
        raise AssertionError("the * rule always exists")  # pragma: no cover
