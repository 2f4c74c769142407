"""CLI cold-start benchmark: wall and CPU seconds of ``costopt --help``-like commands, in fresh processes.

Run: ``.venv/bin/python bench/cli_startup_bench.py [--repeat 5] [--tree PATH] [-- ARGS ...]``
Default commands: ``--help``, ``prices --help``, ``jobs list --help``. ``--tree`` runs another checkout
of the project (e.g. ``git archive <commit> | tar -x -C /tmp/before``) with this virtualenv, to compare.
Prints, per command, the best and median of ``--repeat`` runs (wall, and user+system CPU, which a loaded
machine disturbs less), then the import time of ``api.cli.main`` (``python -X importtime``, best run).
Goal: ``costopt --help`` under 1 s of wall time on an idle machine (it was 2.0 s, 3.7 s on a laptop,
before the heavy imports moved into the commands).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_COMMANDS = (["--help"], ["prices", "--help"], ["jobs", "list", "--help"])
RUN_APP = "import sys; from api.cli.main import app; sys.argv[0] = 'costopt'; app()"


def one_run(tree: Path, args: list[str]) -> tuple[float, float]:
    """(wall seconds, user+system CPU seconds) of one fresh ``costopt ARGS`` process in ``tree``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", RUN_APP, *args], cwd=tree, capture_output=True, check=False, env=_env(tree)
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"costopt {' '.join(args)} failed in {tree}: {done.stderr.decode()[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def import_ms(tree: Path) -> float:
    """Cumulative import time of ``api.cli.main`` in a fresh process, milliseconds."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import api.cli.main"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
        env=_env(tree),
    )
    match = re.search(r"\|\s*(\d+)\s*\|\s*api\.cli\.main\s*$", done.stderr, re.MULTILINE)
    if match is None:
        raise SystemExit("no import time line for api.cli.main")
    return int(match.group(1)) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tree", type=Path, default=ROOT, help="The checkout to run (default: this one).")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="One command's arguments (default: three).")
    opts = parser.parse_args()
    tree = opts.tree.resolve()
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    commands = [args] if args else [list(c) for c in DEFAULT_COMMANDS]
    one_run(tree, ["--help"])  # compile the bytecode once, outside the measurement
    print(f"tree {tree}, best and median of {opts.repeat} runs, load average {os.getloadavg()[0]:.1f}")
    for args in commands:
        runs = [one_run(tree, args) for _ in range(opts.repeat)]
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(
            f"costopt {' '.join(args):<22} wall best {min(walls):.2f} s median {statistics.median(walls):.2f} s; "
            f"CPU best {min(cpus):.2f} s median {statistics.median(cpus):.2f} s"
        )
    print(f"import api.cli.main: {min(import_ms(tree) for _ in range(opts.repeat)):.0f} ms (best)")


if __name__ == "__main__":
    main()
