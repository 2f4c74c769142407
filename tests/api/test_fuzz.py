"""The short API fuzz of ``make test`` (``make fuzz`` is the long one): schemathesis cases generated from
the app's own OpenAPI document, with valid and invalid keys, answer no 5xx and only what the document
declares (status, content type, headers, body), on both backends; and the fuzzer finds a 5xx and an
undeclared answer when there is one (it can fail)."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.errors import install_error_docs, install_error_handlers
from tests.api.fuzzing import BAD_KEY, fuzz_target, run_fuzz


def test_short_fuzz_finds_nothing(engine: Engine, tmp_path: Path) -> None:
    with fuzz_target(engine, tmp_path) as target:
        report = run_fuzz(
            target.app,
            target.client,
            target.keys,
            examples=8,
            known_ids=target.known_ids,
            known_bodies=target.known_bodies,
        )
    assert report.requests >= 150, report.table()
    assert not report.findings, report.table()
    # the requests reached the routes' own answers, not only the key check
    statuses = {s for counts in report.statuses.values() for s in counts}
    assert {200, 401, 422} <= statuses, report.table()


def test_fuzzer_reports_a_5xx_and_an_undeclared_status() -> None:
    app = FastAPI()
    install_error_handlers(app)
    install_error_docs(app)

    @app.get("/v1/boom/{n}")
    def boom(n: int) -> dict[str, int]:
        if n % 2:
            raise RuntimeError("a bug")  # 500 internal_error
        if n % 3 == 0:
            raise HTTPException(418, "undeclared")
        return {"n": n}

    with TestClient(app, raise_server_exceptions=False) as client:
        report = run_fuzz(app, client, [BAD_KEY], examples=40)
    checks = {check for _, check, _ in report.findings}
    assert any(status == 500 for _, _, status in report.findings), report.table()
    assert "UndefinedStatusCode" in checks, report.table()


def test_the_document_declares_the_error_shape_and_its_headers() -> None:
    app = FastAPI()
    install_error_handlers(app)
    install_error_docs(app)

    @app.post("/v1/things/{n}", openapi_extra={"security": [{"bearer": []}]})
    def post_thing(n: int, body: dict[str, int]) -> dict[str, int]:
        return body

    @app.get("/readyz", responses={503: {"content": {"application/json": {"schema": {"type": "object"}}}}})
    def readyz() -> dict[str, str]:
        return {}

    doc = app.openapi()
    assert doc is app.openapi()  # documented once, then FastAPI's cached document
    responses = doc["paths"]["/v1/things/{n}"]["post"]["responses"]
    assert set(responses) == {"200", "400", "401", "403", "404", "409", "413", "422", "429", "503"}
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    assert all(responses[s]["content"] == error for s in responses if s != "200")
    assert "WWW-Authenticate" in responses["401"]["headers"]
    assert "Retry-After" in responses["429"]["headers"] and "Retry-After" in responses["503"]["headers"]
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    ready = doc["paths"]["/readyz"]["get"]["responses"]
    assert ready["503"]["content"] == {"application/json": {"schema": {"type": "object"}}}  # its own body kept
