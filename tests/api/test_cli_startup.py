"""The CLI starts light: loading ``costopt`` and rendering any ``--help`` imports no heavy library.

Each check runs in a fresh interpreter (this test process has long since imported everything) with an
import hook that records, for every heavy package, which project modules were being imported when it
was first loaded, so a failure names the import to move into the command that needs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from costopt.settings import PROJECT_ROOT

# Top-level packages (or dotted prefixes) that must not load at CLI start-up.
HEAVY = (
    "pandas",
    "scipy",
    "numpy",
    "matplotlib",
    "sqlalchemy",
    "boto3",
    "botocore",
    "google.cloud",
    "google.auth",
    "azure",
)

_PROBE = textwrap.dedent(
    """
    import json, sys

    HEAVY = {heavy!r}
    seen = {{}}

    class Recorder:
        def find_spec(self, name, path=None, target=None):
            for heavy in HEAVY:
                if (name == heavy or name.startswith(heavy + ".")) and heavy not in seen:
                    chain, frame = [], sys._getframe(1)
                    while frame is not None:
                        mod = frame.f_globals.get("__name__", "")
                        if mod.split(".")[0] in ("api", "costopt", "pricing", "providers") and mod not in chain:
                            chain.append(mod)
                        frame = frame.f_back
                    seen[heavy] = list(reversed(chain))
            return None

    sys.meta_path.insert(0, Recorder())
    from api.cli.main import app

    args = {args!r}
    if args:
        try:
            app(args, prog_name="costopt")
        except SystemExit as exc:
            if (exc.code or 0) not in {ok_codes!r}:
                raise
    loaded = {{h: seen.get(h, []) for h in HEAVY if h in sys.modules or h in seen}}
    sys.stdout.write("\\n" + json.dumps(loaded) + "\\n")
    """
)


def _heavy_imports(
    args: list[str], *, ok_codes: tuple[int, ...] = (0,), env: dict[str, str] | None = None
) -> dict[str, list[str]]:
    code = _PROBE.format(heavy=HEAVY, args=args, ok_codes=ok_codes)
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _groups() -> list[list[str]]:
    """``--help`` of the app and of every command and group it has (read from the app itself)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, typer; from api.cli.main import app; c = typer.main.get_command(app); "
            "print(json.dumps(sorted(c.commands)))",
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    names = json.loads(done.stdout)
    assert {"prices", "plan", "drill", "serve"} <= set(names)
    return [["--help"]] + [[name, "--help"] for name in names]


def _explain(found: dict[str, list[str]]) -> str:
    return "; ".join(f"{pkg} loaded while importing {' -> '.join(chain) or '?'}" for pkg, chain in found.items())


def test_importing_the_cli_loads_no_heavy_library() -> None:
    found = _heavy_imports([])
    assert not found, (
        f"{_explain(found)}: import heavy libraries inside the command functions that use them (docs/cli.md)"
    )


@pytest.mark.parametrize("args", _groups(), ids=lambda a: " ".join(a))
def test_help_loads_no_heavy_library(args: list[str]) -> None:
    found = _heavy_imports(args)
    assert not found, f"costopt {' '.join(args)}: {_explain(found)}"


def test_a_thin_client_command_runs_light() -> None:
    """``costopt jobs list`` (an HTTP client of the service) fails fast on an unreachable service (exit 1)
    without loading any heavy library on the way."""
    found = _heavy_imports(["jobs", "list"], ok_codes=(1,), env={"COSTOPT_API_URL": "http://127.0.0.1:9"})
    assert not found, f"costopt jobs list: {_explain(found)}"


def test_the_probe_sees_a_heavy_import() -> None:
    """The check itself works: a command that does load pandas is caught, with the importing module."""
    code = _PROBE.format(heavy=HEAVY, args=[], ok_codes=(0,)).replace(
        "from api.cli.main import app", "from api.cli.main import app\nimport api.wiring"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert "pandas" in found
    assert "api.wiring" in found["pandas"]
