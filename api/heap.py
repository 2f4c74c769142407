"""The service process's long-lived heap kept out of the garbage collector's full passes.

After start-up a worker holds about 230,000 objects that live as long as it does (modules, classes,
pydantic and SQLAlchemy schemas, the planner's throughput catalog). CPython's full (generation 2)
collection walks all of them: 100-400 ms per pass on this 2-core machine under load, every request of the
worker waiting meanwhile (the REST load benchmark's p99 spikes). :func:`settle` moves what lives at that
moment into the permanent generation (``gc.freeze``), so a full pass walks only what was made since.
Frozen objects are never collected: call it only once start-up's garbage is gone (it collects first).
"""

from __future__ import annotations

import gc


def settle() -> int:
    """Collect, then freeze every object alive now; returns how many objects are frozen in all."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
