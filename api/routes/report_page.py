"""``/reports/savings``: the savings report as a web page for people (finance).

The page is static (``api/web/savings.html``, no key needed to fetch it); it takes the same query keys as
``GET /v1/reports/savings`` (``team``, ``from``, ``to``, ``group_by``, ``job``; ``sort``, ``offset``, ``limit`` for
its first page of jobs) and asks that route for the
data with the API key the reader enters (kept in the browser tab's session storage; ``#key=...`` in the
address is taken once and removed, never sent to the server). It shows the totals and the savings rate,
the cumulative spend against each baseline, savings by team, spend by cloud and accelerator, moves and
preemptions per day, and the jobs a page at a time (sorted and paged by the server), each opening its
baselines, reasons and history.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(tags=["reports"])


@lru_cache(maxsize=1)
def _page() -> str:
    return resources.files("api").joinpath("web/savings.html").read_text(encoding="utf-8")


@router.get("/reports/savings", response_class=HTMLResponse, summary="The savings report page (HTML)")
def savings_page() -> HTMLResponse:
    """The page; its data comes from ``GET /v1/reports/savings`` with the reader's key."""
    return HTMLResponse(_page(), headers={"Cache-Control": "no-cache"})
