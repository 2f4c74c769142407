"""One HiGHS setting for the whole process.

HiGHS (highspy) runs every solver instance of a process on one global task scheduler, made with the
thread count of the first instance that runs; an instance asking for another count later fails at
``run()`` (status "Not Set"). The collection planner (through pulp) and Gavel's LPs share a process
(the service, the test suite), so every instance takes its thread count from here.
"""

from __future__ import annotations

from typing import Any

HIGHS_THREADS = 1
"""Threads of every HiGHS instance: the LPs and MILPs here are small or solved one after another, and
HiGHS's worker pool would only compete with the caller (and the service's other work) for the CPU."""


def configure(h: Any) -> Any:
    """Silence ``h`` and give it the process's thread count; returns ``h``."""
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", HIGHS_THREADS)
    return h
