"""Fuzz the REST API from its own OpenAPI document (schemathesis + Hypothesis, in-process).

Every operation of ``app.openapi()`` gets ``examples`` generated requests, drawn from schemathesis'
positive (valid by the schema) and negative (breaking it) strategies, and for the routes that take an id
also valid requests naming a real job or fleet of team alpha. Each request carries one of: an admin key,
a member key of alpha, one of beta (another team's, on alpha's ids), a well-formed unknown key, a key of
the wrong scheme, or none. Each answer must
pass schemathesis' response checks: no 5xx (``not_a_server_error``), a status the document declares,
its declared content type, headers and body schema. A failing check is a finding; the run collects them
all (no stop at the first, no shrinking) and groups them by operation, check and status.

``make fuzz`` runs the long version (``python -m tests.api.fuzzing``: 250 examples per operation, over
5,000 requests, exit 1 on any finding); ``tests/api/test_fuzz.py`` a short one in ``make test``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

BAD_KEY = {"Authorization": "Bearer co_0123456789ab_" + "x" * 43}
"""A well-formed key that no team holds."""
WRONG_SCHEME = {"Authorization": "Basic Zm9vOmJhcg=="}


@dataclass
class FuzzReport:
    """One run: requests sent, findings ``(operation, check, status) -> count`` with one example each,
    the answers' statuses by operation, wall seconds."""

    requests: int = 0
    findings: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    examples: dict[tuple[str, str, int], str] = field(default_factory=dict)
    statuses: dict[str, Counter[int]] = field(default_factory=dict)
    seconds: float = 0.0

    def table(self) -> str:
        lines = [f"{'operation':<42} {'requests':>8}  statuses"]
        for op, counts in sorted(self.statuses.items()):
            spread = " ".join(f"{s}:{n}" for s, n in sorted(counts.items()))
            lines.append(f"{op:<42} {sum(counts.values()):>8}  {spread}")
        lines.append(f"{self.requests} requests in {self.seconds:.1f} s; {sum(self.findings.values())} findings")
        for (op, check, status), n in sorted(self.findings.items()):
            lines.append(f"  FINDING {n}x {op}: {check} (status {status})\n    {self.examples[(op, check, status)]}")
        return "\n".join(lines)


def _checks() -> list[Callable[..., Any]]:
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi import checks as oc

    return [
        not_a_server_error,
        oc.status_code_conformance,
        oc.content_type_conformance,
        oc.response_headers_conformance,
        oc.response_schema_conformance,
    ]


def _request_kwargs(case: Any, key: dict[str, str]) -> tuple[str, str, dict[str, Any]]:
    """The case as arguments of the test client (method, url, kwargs), with ``key``'s header."""
    kw = case.as_transport_kwargs(base_url="http://testserver")
    headers = {k: v for k, v in (kw.get("headers") or {}).items() if k.lower() != "authorization"}
    headers.update(key)
    out: dict[str, Any] = {"headers": headers}
    for name in ("params", "json", "cookies", "files"):
        if kw.get(name):
            out[name] = kw[name]
    if kw.get("data") is not None:
        out["content" if isinstance(kw["data"], bytes | str) else "data"] = kw["data"]
    return str(kw["method"]), str(kw["url"]), out


def run_fuzz(
    app: FastAPI,
    client: TestClient,
    keys: list[dict[str, str]],
    *,
    examples: int,
    known_ids: dict[str, list[str]] | None = None,
    known_bodies: dict[str, list[Any]] | None = None,
    doc: dict[str, Any] | None = None,
    rng_seed: int = 0,
) -> FuzzReport:
    """Fuzz every operation of ``doc`` (default: ``app.openapi()``) with ``examples`` requests each,
    sent through ``client``. ``known_ids``: path parameter name -> real ids, drawn for a share of the
    requests so that the found paths are explored too; ``known_bodies``: operation label -> valid bodies
    (sent with generated headers), so that the accepting paths of e.g. ``POST /v1/jobs`` are reached."""
    import schemathesis
    from schemathesis.core.result import Err
    from schemathesis.generation.modes import GenerationMode

    schema = schemathesis.openapi.from_dict(doc if doc is not None else app.openapi())
    checks = _checks()
    report = FuzzReport()
    start = time.perf_counter()
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()  # the schema itself is invalid: nothing of it can be fuzzed
        op = result.ok()
        strategies = [op.as_strategy(GenerationMode.POSITIVE), op.as_strategy(GenerationMode.NEGATIVE)]
        path_names = [p.name for p in op.path_parameters]
        if known_ids and path_names and all(n in known_ids for n in path_names):
            for picked in zip(*(known_ids[n] for n in path_names), strict=False):
                params = dict(zip(path_names, picked, strict=True))
                strategies.append(op.as_strategy(GenerationMode.POSITIVE, path_parameters=params))
        for body in (known_bodies or {}).get(op.label, []):
            strategies.append(op.as_strategy(GenerationMode.POSITIVE, body=body))
        _fuzz_operation(op, strategies, client, keys, checks, report, examples, rng_seed)
    report.seconds = time.perf_counter() - start
    return report


def _fuzz_operation(
    op: Any,
    strategies: list[Any],
    client: TestClient,
    keys: list[dict[str, str]],
    checks: list[Callable[..., Any]],
    report: FuzzReport,
    examples: int,
    rng_seed: int,
) -> None:
    statuses = report.statuses.setdefault(op.label, Counter())

    @seed(rng_seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],
    )
    @given(case=st.one_of(strategies), key=st.sampled_from(keys))
    def one(case: Any, key: dict[str, str]) -> None:
        method, url, kwargs = _request_kwargs(case, key)
        response = client.request(method, url, follow_redirects=False, **kwargs)
        report.requests += 1
        statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=checks, headers=kwargs["headers"])
        except BaseExceptionGroup as group:
            for failure in group.exceptions:
                k = (op.label, type(failure).__name__, response.status_code)
                report.findings[k] += 1
                report.examples.setdefault(
                    k, f"{method} {url} {str(kwargs.get('json'))[:160]} -> {response.text[:240]}"
                )

    one()


@dataclass
class FuzzTarget:
    app: FastAPI
    client: TestClient
    keys: list[dict[str, str]]
    known_ids: dict[str, list[str]]
    known_bodies: dict[str, list[Any]]


@contextmanager
def fuzz_target(engine: Any, tmp_path: Path) -> Iterator[FuzzTarget]:
    """The service of the job API tests over ``engine`` (seeded, three teams), with one job and one fleet
    of team alpha, team beta and a spare key of beta, whose ids the fuzzer also draws."""
    from tests.api.jobs_helpers import BODY, service

    gen = service(engine, tmp_path)
    svc = next(gen)
    try:
        job = svc.submit(svc.alpha)
        offer = {"cloud": "aws", "region": "us-east-1", "zone": "us-east-1a", "instance_type": "p3.2xlarge"}
        fleet_body = {
            "name": "f",
            "policy": "max_min_fairness_perf",
            "instances": [{"offer": {**offer, "market": "spot"}}],
        }
        fleet = svc.client.post("/v1/fleets", json=fleet_body, headers=svc.alpha)
        assert fleet.status_code == 201, fleet.text
        spare = svc.teams.create_key(svc.beta_team, name="spare")  # a key the fuzzer may revoke
        known = {
            "job_id": [job["id"]],
            "fleet_id": [fleet.json()["id"]],
            "team_id": [svc.beta_team],
            "key_id": [spare.key.id],
        }
        keys = [svc.admin, svc.alpha, svc.beta, BAD_KEY, WRONG_SCHEME, {}]  # beta: on alpha's ids, a 404
        bodies: dict[str, list[Any]] = {
            "POST /v1/jobs": [BODY, {**BODY, "gpus": 4, "objective": {"name": "min-time"}}],
            "POST /v1/plans": [{"job_type": BODY["job_type"], "steps": 1000}],
            "POST /v1/batches": [{"jobs": [BODY, BODY], "objective": {"name": "makespan", "budget_usd": "500"}}],
            "POST /v1/fleets": [fleet_body],
        }
        yield FuzzTarget(svc.app, svc.client, keys, known, bodies)
    finally:
        gen.close()


def main(argv: list[str] | None = None) -> int:
    """``make fuzz``: the long run on a fresh SQLite database; exit 1 on any finding or too few requests."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--examples", type=int, default=250, help="generated requests per operation")
    parser.add_argument("--min-requests", type=int, default=5000, help="fail a run that sent fewer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--raw-schema", action="store_true", help="FastAPI's own document (errors undeclared)")
    args = parser.parse_args(argv)
    logging.disable(logging.CRITICAL)  # the service's logs: findings are reported below
    from costopt.db.engine import make_engine, migrate

    with tempfile.TemporaryDirectory(prefix="costopt-fuzz-") as tmp:
        engine = make_engine(f"sqlite:///{Path(tmp) / 'fuzz.db'}")
        migrate(engine)
        with fuzz_target(engine, Path(tmp)) as target:
            doc = FastAPI.openapi(target.app) if args.raw_schema else None
            report = run_fuzz(
                target.app,
                target.client,
                target.keys,
                examples=args.examples,
                known_ids=target.known_ids,
                known_bodies=target.known_bodies,
                doc=doc,
                rng_seed=args.seed,
            )
        engine.dispose()
    out = sys.stdout
    out.write(report.table() + "\n")
    if report.findings or report.requests < args.min_requests:
        found = sum(report.findings.values())
        out.write(f"FAIL: {found} findings, {report.requests} requests (at least {args.min_requests} wanted)\n")
        return 1
    out.write("OK: no 5xx, every answer as the OpenAPI document declares\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
