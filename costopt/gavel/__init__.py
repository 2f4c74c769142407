"""Gavel inside costopt: heterogeneity-aware allocation policies, the round-based mechanism and a
simulator (see docs/gavel.md). Nothing is loaded at import time."""
