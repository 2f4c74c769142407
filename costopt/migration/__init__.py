"""Migration: the rule that decides whether a running job stays or moves (:mod:`.decision`)."""

from costopt.migration.decision import (
    Action,
    Decision,
    InvalidDecisionInput,
    MigrationRule,
    MoveArrays,
    OfferQuote,
    Reason,
    RunningJob,
    choose,
    decide,
    decide_many,
    egress_matrix,
)

__all__ = [
    "Action",
    "Decision",
    "InvalidDecisionInput",
    "MigrationRule",
    "MoveArrays",
    "OfferQuote",
    "Reason",
    "RunningJob",
    "choose",
    "decide",
    "decide_many",
    "egress_matrix",
]
