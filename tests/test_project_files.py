"""The project's own files: compose definition and image, CI entry point, README commands."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import make_url, text

from costopt.settings import PROJECT_ROOT, Settings

COMPOSE_FILE = PROJECT_ROOT / "docker-compose.yml"


def _compose() -> dict[str, Any]:
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(compose, dict)
    return compose


def _api_env() -> dict[str, str]:
    """The api service's environment (a mapping in our compose file), values as text."""
    env = _compose()["services"]["api"]["environment"]
    assert isinstance(env, dict), "keep the api's environment a mapping (KEY: value)"
    return {str(k): str(v) for k, v in env.items()}


def _dockerfile_env() -> dict[str, str]:
    """``ENV`` pairs of the Dockerfile (``ENV A=1 \\`` continuation lines included)."""
    text_ = (PROJECT_ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    pairs: dict[str, str] = {}
    for line in text_.splitlines():
        if line.startswith("ENV "):
            pairs.update(re.findall(r"(\w+)=(\S+)", line))
    return pairs


def test_docker_compose_pairs_the_service_with_postgresql() -> None:
    services = _compose()["services"]
    assert set(services) == {"db", "api"}
    db, api = services["db"], services["api"]
    assert db["image"].startswith("postgres:")
    assert api["depends_on"]["db"]["condition"] == "service_healthy"
    assert (PROJECT_ROOT / api["build"] / "Dockerfile").is_file()
    # the database URL is the db service's own user, password and database, on its host name
    url = make_url(_api_env()["COSTOPT_DATABASE_URL"])
    pg = db["environment"]
    assert url.drivername == "postgresql+psycopg"
    assert (url.host, url.port or 5432) == ("db", 5432)
    assert (url.username, url.password, url.database) == (
        pg["POSTGRES_USER"],
        pg["POSTGRES_PASSWORD"],
        pg["POSTGRES_DB"],
    )


def test_docker_compose_ports_and_healthchecks_match_the_service() -> None:
    services = _compose()["services"]
    env = {**_dockerfile_env(), **_api_env()}
    port = env["COSTOPT_API_PORT"]
    assert env["COSTOPT_API_HOST"] == "0.0.0.0"  # reachable through the published port
    assert services["api"]["ports"] == [f"127.0.0.1:{port}:{port}"]
    assert f"EXPOSE {port}" in (PROJECT_ROOT / "Dockerfile").read_text()
    api_check = " ".join(services["api"]["healthcheck"]["test"])
    assert f"127.0.0.1:{port}/readyz" in api_check
    db_check = " ".join(services["db"]["healthcheck"]["test"])
    pg = services["db"]["environment"]
    assert f"pg_isready -U {pg['POSTGRES_USER']} -d {pg['POSTGRES_DB']}" in db_check
    for service in services.values():
        assert {"interval", "timeout", "retries"} <= set(service["healthcheck"])
    # the first start seeds the store from the real data: readiness may take a while
    assert "start_period" in services["api"]["healthcheck"]


def test_every_costopt_variable_of_the_image_and_compose_file_is_a_setting() -> None:
    names = {k for k in {**_dockerfile_env(), **_api_env()} if k.startswith("COSTOPT_")}
    assert "COSTOPT_DATABASE_URL" in names
    unknown = sorted(n for n in names if n.removeprefix("COSTOPT_").lower() not in Settings.model_fields)
    assert not unknown, f"not fields of costopt.settings.Settings (ignored silently): {unknown}"


def test_the_data_folder_the_service_reads_is_mounted() -> None:
    api = _compose()["services"]["api"]
    targets = {v.split(":")[1]: v.split(":")[0] for v in api["volumes"]}
    assert _api_env()["COSTOPT_DATA_DIR"] in targets
    assert targets[_api_env()["COSTOPT_DATA_DIR"]] == "../shared/data"


def _compose_settings_here(database: str) -> Settings:
    """The api service's settings as compose gives them, run on this machine: the database host is
    127.0.0.1 (the local PostgreSQL) and the database one of this test's own; mounted folders are their
    host side."""
    env = _api_env()
    url = make_url(env["COSTOPT_DATABASE_URL"]).set(host="127.0.0.1", database=database)
    mounts = {
        v.split(":")[1]: (COMPOSE_FILE.parent / v.split(":")[0]).resolve()
        for v in _compose()["services"]["api"]["volumes"]
    }
    values: dict[str, Any] = {k.removeprefix("COSTOPT_").lower(): v for k, v in env.items() if k.startswith("COSTOPT_")}
    values["database_url"] = url.render_as_string(hide_password=False)
    values["data_dir"] = mounts[env["COSTOPT_DATA_DIR"]]
    return Settings(**values)


@pytest.fixture
def compose_database() -> Iterator[str]:
    """A database of its own owned by the compose file's user (created, with the user, when missing),
    dropped afterwards; skips without PostgreSQL (fails under CI, as every PostgreSQL test)."""
    from costopt.db.engine import make_engine
    from tests.conftest import PG_ADMIN_URL, pg_schema

    with pg_schema():  # skips or fails when PostgreSQL is not reachable
        pass
    url = make_url(_api_env()["COSTOPT_DATABASE_URL"])
    name = f"costopt_compose_{uuid.uuid4().hex[:10]}"
    admin = make_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        password = (url.password or "").replace("'", "''")
        conn.execute(  # idempotent, and safe when another test run creates the role at the same moment
            text(
                f"DO $$ BEGIN CREATE ROLE \"{url.username}\" LOGIN PASSWORD '{password}'; "
                "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
            )
        )
        conn.execute(text(f'CREATE DATABASE "{name}" OWNER "{url.username}"'))
    try:
        yield name
    finally:
        # DROP DATABASE waits for a checkpoint of the whole server (10-30 s while other tests write): it runs
        # in a thread the test process waits for at exit, not in this test's teardown.
        def drop() -> None:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()

        threading.Thread(target=drop, name=f"drop {name}").start()  # not a daemon: joined at exit


@pytest.mark.postgres
@pytest.mark.slow
def test_the_compose_settings_serve_on_the_local_postgresql(
    compose_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``create_app`` with the compose file's settings migrates and seeds PostgreSQL and answers /readyz.
    The scheduler starts paused: no collector reaches a cloud from a test. The seed is the curated list prices
    only (the whole real data's import, ~15 s of CPU, is tests/pricing/test_importer.py's)."""
    from apscheduler.schedulers.background import BackgroundScheduler
    from fastapi.testclient import TestClient

    import api.wiring
    from api.app import create_app

    settings = _compose_settings_here(compose_database)
    assert settings.data_dir is not None and settings.data_dir.is_dir(), "../shared/data is missing"
    seeded: list[list[Path]] = []
    real_seed_paths = api.wiring.seed_paths

    def list_prices_only(s: Any) -> list[Path]:
        seeded.append(real_seed_paths(s))  # what it would seed: the mounted data folder's files too
        return [s.catalog_dir / "list_prices.csv"]

    monkeypatch.setattr(api.wiring, "seed_paths", list_prices_only)
    start = BackgroundScheduler.start
    monkeypatch.setattr(BackgroundScheduler, "start", lambda self, paused=False: start(self, paused=True))
    with TestClient(create_app(settings)) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert client.get("/metrics").status_code == 200
        latest = client.get("/v1/prices/latest", params={"limit": 1})
        assert latest.status_code == 200 and latest.json()["count"] == 1, latest.text
    assert seeded and any(p.is_relative_to(settings.data_dir) for p in seeded[0])  # the compose mount's data


def test_ci_runs_the_readmes_test_command() -> None:
    ci = (PROJECT_ROOT / ".ci" / "run").read_text()
    readme = (PROJECT_ROOT / "README.md").read_text()
    assert "make test" in ci and "make test" in readme and "make run" in readme
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    assert "\nrun:" in makefile and "\ntest:" in makefile


def test_no_shared_data_file_is_copied_into_the_project(shared_data: Path) -> None:
    """No file of the project is a copy of a shared data file, whole or in excerpt. A format may dictate a
    file's name (an Azure sheet folder's ``instance_mapping.csv``, a region's ``us_east.csv``), so a fixture
    written by hand may share a name: it must then share no more than a header and a few facts (lines)."""
    import hashlib

    # the shared_data fixture fails when the data is missing (it used to return here and pass unchecked)
    shared = [p for p in shared_data.rglob("*") if p.is_file() and p.suffix in {".csv", ".json", ".out"}]
    assert len(shared) > 10  # the comparison below ran against the real data
    digests = {hashlib.sha256(p.read_bytes()).hexdigest(): p for p in shared}
    by_name: dict[str, list[Path]] = {}
    for p in shared:
        by_name.setdefault(p.name, []).append(p)
    ours = [p for root in ("data", "tests") for p in (PROJECT_ROOT / root).rglob("*") if p.is_file()]
    copies = [f"{p} == {digests[d]}" for p in ours if (d := hashlib.sha256(p.read_bytes()).hexdigest()) in digests]
    for p in ours:
        for theirs in by_name.get(p.name, []):
            common = set(p.read_bytes().splitlines()[1:]) & set(theirs.read_bytes().splitlines()[1:])
            if len(common) > 5:
                copies.append(f"{p} holds {len(common)} lines of {theirs}")
    assert not copies, f"copied from ../shared/data: {copies}"


def test_docs_name_every_top_level_package() -> None:
    arch = (PROJECT_ROOT / "docs" / "architecture.md").read_text()
    for pkg in ("costopt/", "pricing/", "providers/", "api/"):
        assert pkg in arch
    assert Path(PROJECT_ROOT / "docs" / "cli.md").is_file()
