"""HiGHS's task scheduler is global to a process: the collection planner (pulp) and Gavel's LPs, run in
one process in either order, must agree on its thread count (a mismatch fails every later solve)."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PULP_FIRST = """
import numpy as np
import scipy.sparse as sp
from costopt.planning.collection_solve import PairModel, PulpBackend
model = PairModel(
    group=np.array([0, 0]), offer=np.array([0, 1]), cost=np.array([2.0, 1.0]), hours=np.array([1.0, 1.0]),
    gpus=np.array([1, 1]), counts=np.array([1]), quota_rows=sp.csr_array((0, 2)),
    quota_max=np.array([], dtype=np.int64),
)
result = PulpBackend(model).min_cost(model.full_bounds(), None, None)
assert result.status == "optimal" and result.jobs is not None and result.jobs.tolist() == [0, 1], result
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
