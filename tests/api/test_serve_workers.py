"""``costopt serve --workers N``: several worker processes (replicas) on PostgreSQL, refused where the
service runs in one process (SQLite: one writer; the simulated cloud: it lives inside its process)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from api.cli.main import app
from costopt.settings import PROJECT_ROOT, get_settings
from tests.api.test_replicas_socket import listening_sockets
from tests.conftest import PG_ADMIN_URL, pg_schema
from tests.net_support import free_port, stopped

runner = CliRunner()


@pytest.fixture
def clean_settings() -> Iterator[None]:
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_sqlite_serves_from_one_process(clean_settings: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSTOPT_DATABASE_URL", f"sqlite:///{tmp_path / 'one.db'}")
    result = runner.invoke(app, ["serve", "--workers", "2"])
    assert result.exit_code == 2
    assert "SQLite serves from one process" in result.stderr and "postgresql" in result.stderr
    assert not (tmp_path / "one.db").exists()  # refused before anything was made


def test_the_simulated_cloud_serves_from_one_process(clean_settings: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSTOPT_DATABASE_URL", PG_ADMIN_URL)
    monkeypatch.setenv("COSTOPT_PROVIDER", "sim")
    result = runner.invoke(app, ["serve", "--workers", "2"])
    assert result.exit_code == 2
    assert "simulated cloud" in result.stderr and "--workers 1" in result.stderr


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


@pytest.mark.postgres
def test_two_workers_on_postgresql_share_one_admin_key(tmp_path: Path) -> None:
    """The parent migrates, seeds and makes the first admin key (printed once), then two worker
    processes serve the same port; the key works against both."""
    with pg_schema() as schema:
        port = free_port()
        env = {
            **os.environ,
            "COSTOPT_DATABASE_URL": f"{PG_ADMIN_URL}?options=-csearch_path%3D{schema}",
            "COSTOPT_PROVIDER": "local",
            "COSTOPT_LOCAL_PROVIDER_DIR": str(tmp_path / "local"),
            "COSTOPT_MIGRATION_JOBS_ENABLED": "false",
            "COSTOPT_SEED_ON_START": "false",
        }
        cmd = [sys.executable, "-m", "api.cli.main", "serve", "--workers", "2", "--no-collect", "--port", str(port)]
        out = tmp_path / "serve.log"
        log = out.open("w+b")
        proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        with log, stopped(proc):
            deadline = time.monotonic() + 300  # a hang's bound: two workers' imports took > 90 s at load 15
            while time.monotonic() < deadline and b"admin key (shown once)" not in out.read_bytes():
                assert proc.poll() is None, out.read_text()
                time.sleep(0.2)
            secret = out.read_text().split("admin key (shown once): ")[1].split()[0]
            seen = 0
            while time.monotonic() < deadline and seen < 20:
                assert proc.poll() is None, out.read_text()
                try:
                    r = httpx.get(f"http://127.0.0.1:{port}/v1/jobs", headers={"Authorization": f"Bearer {secret}"})
                except httpx.HTTPError:
                    time.sleep(0.2)
                    continue
                assert r.status_code == 200, r.text
                seen += 1
            assert seen == 20
            # the workers (uvicorn's supervisor is the parent), each on its own socket (api/replicas.py); polled:
            # under load the supervisor may be restarting a worker that missed its 5-s health check
            end = time.monotonic() + 60
            while not (len(_children(proc.pid)) >= 2 and listening_sockets(port) == 2) and time.monotonic() < end:
                time.sleep(0.5)
            assert len(_children(proc.pid)) >= 2
            assert listening_sockets(port) == 2
            assert out.read_text().count("admin key (shown once)") == 1


def test_one_process_ignores_worker_recycling_and_says_so(
    clean_settings: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COSTOPT_DATABASE_URL", f"sqlite:///{tmp_path / 'one.db'}")
    monkeypatch.setenv("COSTOPT_WORKER_MAX_RSS_MB", "500")
    monkeypatch.setenv("COSTOPT_SEED_ON_START", "false")
    ran: list[object] = []
    monkeypatch.setattr("uvicorn.run", lambda application, **kw: ran.append(kw))
    result = runner.invoke(app, ["serve", "--no-collect"])
    assert result.exit_code == 0, result.output
    assert ran  # served, by one process
    assert "COSTOPT_WORKER_MAX_RSS_MB is ignored by one process" in result.stderr
