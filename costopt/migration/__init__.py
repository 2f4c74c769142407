"""Migration: the rule that decides whether a running job stays or moves (:mod:`.decision`), and the
cache of offers kept out of plans for a while (:mod:`.unavailable`)."""

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
from costopt.migration.unavailable import UnavailableEntry, UnavailableOffers

__all__ = [
    "Action",
    "Decision",
    "InvalidDecisionInput",
    "MigrationRule",
    "MoveArrays",
    "OfferQuote",
    "Reason",
    "RunningJob",
    "UnavailableEntry",
    "UnavailableOffers",
    "choose",
    "decide",
    "decide_many",
    "egress_matrix",
]
