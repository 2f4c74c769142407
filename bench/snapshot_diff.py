"""What grew in a service worker between two tracemalloc snapshots (written by ``bench/api_load.py``'s
``make_app`` when ``BENCH_TRACEMALLOC_DIR`` is set, e.g. for a soak).

    BENCH_MEMORY_DIR=/tmp/snaps BENCH_TRACEMALLOC=1 .venv/bin/python bench/soak.py --minutes 3 --backend sqlite
    .venv/bin/python bench/snapshot_diff.py /tmp/snaps            # each worker: its 2nd snapshot vs its last
    .venv/bin/python bench/snapshot_diff.py A.snap B.snap --top 30 --group traceback

Prints the top allocation sites by growth (KiB and count), grouped by ``lineno`` (default), ``filename``
or ``traceback``.
"""

from __future__ import annotations

import argparse
import tracemalloc
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def pairs(paths: list[Path]) -> list[tuple[Path, Path]]:
    """The snapshots to compare: two files as given; a directory: per worker pid, its second snapshot
    (the first after start-up) and its last."""
    if len(paths) == 2 and all(p.is_file() for p in paths):
        return [(paths[0], paths[1])]
    by_pid: dict[str, list[Path]] = defaultdict(list)
    for p in sorted(paths[0].glob("*.snap")):
        by_pid[p.name.split("-")[0]].append(p)
    return [(snaps[min(1, len(snaps) - 2)], snaps[-1]) for snaps in by_pid.values() if len(snaps) >= 2]


IGNORE = [
    tracemalloc.Filter(False, tracemalloc.__file__),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
]


def growth_sites(a: Path, b: Path, top: int = 10, group: str = "lineno") -> dict[str, Any]:
    """What grew from snapshot ``a`` to ``b``: the traced MiB at ``b`` and its growth, and the ``top`` sites
    by growth (KiB, blocks, the site's last frame)."""
    old = tracemalloc.Snapshot.load(str(a)).filter_traces(IGNORE)
    new = tracemalloc.Snapshot.load(str(b)).filter_traces(IGNORE)
    stats = new.compare_to(old, group)
    return {
        "from": a.name,
        "to": b.name,
        "traced_mib": round(sum(s.size for s in stats) / 2**20, 1),
        "grown_mib": round(sum(s.size_diff for s in stats) / 2**20, 2),
        "top": [
            {
                "kib": round(s.size_diff / 1024, 1),
                "blocks": s.count_diff,
                "now_kib": round(s.size / 1024),
                "at": f"{s.traceback[-1].filename.removeprefix(str(ROOT) + '/')}:{s.traceback[-1].lineno}",
            }
            for s in stats[:top]
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--group", choices=["lineno", "filename", "traceback"], default="lineno")
    args = ap.parse_args()
    for a, b in pairs(args.paths):
        old = tracemalloc.Snapshot.load(str(a)).filter_traces(IGNORE)
        new = tracemalloc.Snapshot.load(str(b)).filter_traces(IGNORE)
        stats = new.compare_to(old, args.group)
        grown, held = sum(s.size_diff for s in stats) / 2**20, sum(s.size for s in stats) / 2**20
        print(f"== {a.name} -> {b.name}: {grown:+.1f} MiB traced ({held:.1f} MiB)")
        for s in stats[: args.top]:
            print(f"{s.size_diff / 1024:+10.1f} KiB {s.count_diff:+8d} blocks  ({s.size / 1024:.0f} KiB now)")
            for line in s.traceback.format()[-(8 if args.group == "traceback" else 1) * 2 :]:
                print("      " + line.strip())


if __name__ == "__main__":
    main()
