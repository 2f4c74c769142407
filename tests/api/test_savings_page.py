"""The savings page in a real browser (headless Debian Chromium driven by Playwright): it loads with no
console error, its four charts draw, its totals equal the API's, the jobs table sorts, a job opens its
history; a screenshot is kept (``var/artifacts/savings-page-<backend>.png``, or ``$COSTOPT_ARTIFACTS_DIR``).

Chromium and Playwright are installed by ``make browser`` (``.ci/run`` calls it). Outside CI the test
skips when either is missing; under CI it fails instead.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from tests.api.jobs_helpers import Service, service
from tests.api.report_helpers import bill

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py

ARTIFACTS = Path(os.environ.get("COSTOPT_ARTIFACTS_DIR", Path(__file__).resolve().parents[2] / "var" / "artifacts"))


def _chromium() -> str:
    path = os.environ.get("COSTOPT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        path = None
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium and Playwright are required under CI: `make browser` installs them")
        pytest.skip("no Chromium or Playwright here (`make browser` installs them)")
    return path


@contextmanager
def _page(**options: Any) -> Iterator[Any]:
    """A new page of headless Chromium (the test skips or fails as :func:`_chromium` says)."""
    chromium = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        try:
            yield browser.new_page(**options)
        finally:
            browser.close()


@pytest.fixture
def served(engine: Engine, tmp_path: Path) -> Iterator[tuple[Service, str]]:
    """The service (two teams' jobs billed) answering on a real port."""
    import uvicorn

    for svc in service(engine, tmp_path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        server = uvicorn.Server(
            uvicorn.Config(svc.app, host="127.0.0.1", port=port, lifespan="off", log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            yield svc, f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            thread.join(timeout=10)


def test_the_page_shows_the_apis_totals_and_draws_its_charts(
    served: tuple[Service, str], request: pytest.FixtureRequest
) -> None:
    svc, base = served
    billed = bill(svc)
    key = svc.admin["Authorization"].removeprefix("Bearer ")
    query = f"from={billed['from']}&group_by=team"
    api: dict[str, Any] = svc.client.get(f"/v1/reports/savings?{query}", headers=svc.admin).json()
    problems: list[str] = []
    with _page(viewport={"width": 1300, "height": 1400}) as page:
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.goto(f"{base}/reports/savings?{query}#key={key}")
        page.wait_for_selector("body[data-ready]", timeout=20_000)
        assert page.get_attribute("body", "data-ready") == "1", page.inner_text("#error")
        assert problems == []
        totals = api["totals"]
        for element, field in (
            ("#total-actual", "actual_cost"),
            ("#total-on-demand", "baseline_on_demand_cost"),
            ("#total-static", "baseline_static_spot_cost"),
            ("#total-savings", "savings"),
            ("#savings-rate", "savings_rate"),
        ):
            assert page.get_attribute(element, "data-exact") == totals[field], element
        assert page.inner_text("#total-actual") == f"${float(totals['actual_cost']):,.2f}"
        for chart, shape in (
            ("#chart-cumulative", "circle"),
            ("#chart-teams", "rect"),
            ("#chart-spend", "rect"),
            ("#chart-activity", "rect"),
        ):
            sizes = page.eval_on_selector_all(
                f"{chart} {shape}", "els => els.map(e => { const b = e.getBBox(); return b.width + b.height; })"
            )
            assert sizes and max(sizes) > 5, f"{chart} drew nothing"
        rows = page.eval_on_selector_all("#jobs tbody tr", "trs => trs.map(t => t.cells[0].innerText)")
        assert sorted(rows) == sorted([billed["a"]["id"], billed["b"]["id"]])
        by_savings = [j["job_id"] for j in api_jobs(svc, query, "-savings")]
        assert rows == by_savings  # the page's default order: most saved first, sorted by the server
        page.click("#jobs thead th[data-col='0']")  # sort by job id (the server sorts and answers again)
        page.wait_for_selector("body[data-ready='1']", timeout=20_000)
        after = page.eval_on_selector_all("#jobs tbody tr", "trs => trs.map(t => t.cells[0].innerText)")
        assert after == sorted(rows) and "\u25bc" not in page.inner_text("#jobs thead th[data-col='0']")
        page.click(f"a[data-job='{billed['a']['id']}']")
        page.wait_for_function("document.getElementById('job-events').textContent.includes('succeeded')")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"savings-page-{request.node.callspec.id}.png"), full_page=True)
        assert problems == []


def api_jobs(svc: Service, query: str, sort: str) -> list[dict[str, Any]]:
    got = svc.client.get(f"/v1/reports/savings?{query}&sort={sort}", headers=svc.admin)
    assert got.status_code == 200, got.text
    return list(got.json()["jobs"])


def test_the_page_lists_a_page_of_jobs_and_moves_between_pages(served: tuple[Service, str]) -> None:
    """With a page of one job the table lists one, says how many there are, and Next/Previous move."""

    svc, base = served
    billed = bill(svc)
    key = svc.admin["Authorization"].removeprefix("Bearer ")
    query = f"from={billed['from']}&limit=1&sort=job_id"
    ids = sorted([billed["a"]["id"], billed["b"]["id"]])
    cells = "trs => trs.map(t => t.cells[0].innerText)"
    with _page() as page:
        page.goto(f"{base}/reports/savings?{query}#key={key}")
        page.wait_for_selector("body[data-ready='1']", timeout=20_000)
        assert page.eval_on_selector_all("#jobs tbody tr", cells) == ids[:1]
        assert page.inner_text("#jobs-range") == "Jobs 1 to 1 of 2."
        assert page.is_disabled("#jobs-prev") and not page.is_disabled("#jobs-next")
        page.click("#jobs-next")
        page.wait_for_selector("body[data-ready='1']", timeout=20_000)
        assert page.eval_on_selector_all("#jobs tbody tr", cells) == ids[1:]
        assert page.inner_text("#jobs-range") == "Jobs 2 to 2 of 2."
        assert page.is_disabled("#jobs-next") and not page.is_disabled("#jobs-prev")
        page.click("#jobs-prev")
        page.wait_for_selector("body[data-ready='1']", timeout=20_000)
        assert page.eval_on_selector_all("#jobs tbody tr", cells) == ids[:1]


def test_without_a_key_the_page_asks_for_one(served: tuple[Service, str]) -> None:
    _, base = served
    with _page() as page:
        page.goto(f"{base}/reports/savings")
        page.wait_for_selector("#key-form:not([hidden])", timeout=10_000)
        page.fill("#key", "co_bad_key")
        page.click("#key-form button")
        page.wait_for_selector("body[data-ready='error']", timeout=10_000)
        assert "could not be loaded" in page.inner_text("#error")
