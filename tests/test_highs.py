"""HiGHS's task scheduler is global to a process: the collection planner (pulp) and Gavel's LPs, run in
one process in either order, must agree on its thread count (a mismatch fails every later solve)."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PULP_FIRST = """
import pulp
from costopt.highs import HIGHS_THREADS
p = pulp.LpProblem("x", pulp.LpMinimize)
x = pulp.LpVariable("x", 0, 10, cat=pulp.LpInteger)
p += x
p += x >= 1
p.solve(pulp.HiGHS(msg=False, threads=HIGHS_THREADS))
"""
_GAVEL = """
from costopt.gavel.lp import _new_highs
import highspy
h = _new_highs()
h.addVar(1.0, 4.0)
h.changeColCost(0, 1.0)
h.run()
assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal, h.modelStatusToString(h.getModelStatus())
"""
_COLLECTION = """
from costopt.planning.collection_solve import new_highs
import highspy
h = new_highs()
h.addVar(2.0, 3.0)
h.changeColCost(0, 1.0)
h.run()
assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal, h.modelStatusToString(h.getModelStatus())
"""


@pytest.mark.parametrize(
    "script",
    [_PULP_FIRST + _GAVEL, _GAVEL + _PULP_FIRST + _COLLECTION, _COLLECTION + _GAVEL],
    ids=["pulp-gavel", "gavel-pulp", "collection-gavel"],
)
def test_every_highs_user_agrees_on_the_thread_count(script: str) -> None:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
