"""The project's own files: compose definition, CI entry point, README commands."""

from __future__ import annotations

from pathlib import Path

import yaml

from costopt.settings import PROJECT_ROOT


def test_docker_compose_pairs_the_service_with_postgresql() -> None:
    compose = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) >= {"db", "api"}
    assert services["db"]["image"].startswith("postgres:")
    api = services["api"]
    assert api["depends_on"]["db"]["condition"] == "service_healthy"
    assert api["environment"]["COSTOPT_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert (PROJECT_ROOT / api["build"] / "Dockerfile").is_file()


def test_ci_runs_the_readmes_test_command() -> None:
    ci = (PROJECT_ROOT / ".ci" / "run").read_text()
    readme = (PROJECT_ROOT / "README.md").read_text()
    assert "make test" in ci and "make test" in readme and "make run" in readme
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    assert "\nrun:" in makefile and "\ntest:" in makefile


def test_no_shared_data_file_is_copied_into_the_project() -> None:
    shared = PROJECT_ROOT.parent / "shared" / "data"
    if not shared.is_dir():
        return
    shared_names = {p.name for p in shared.rglob("*") if p.is_file() and p.suffix in {".csv", ".json", ".out"}}
    ours = {p.name for p in (PROJECT_ROOT / "data").rglob("*") if p.is_file()}
    ours |= {p.name for p in (PROJECT_ROOT / "tests").rglob("*") if p.is_file()}
    assert not (shared_names & ours), f"copied from ../shared/data: {sorted(shared_names & ours)}"


def test_docs_name_every_top_level_package() -> None:
    arch = (PROJECT_ROOT / "docs" / "architecture.md").read_text()
    for pkg in ("costopt/", "pricing/", "providers/", "api/"):
        assert pkg in arch
    assert Path(PROJECT_ROOT / "docs" / "cli.md").is_file()
