"""Mutation score per module from a finished `make mutate` (mutmut's results under ./mutants).

Prints one row per mutated file and a total: mutants, killed (a test failed or timed out), survived (every
test passed), no tests (no selected test reaches the mutated function), not checked, and the score
killed / (killed + survived + no tests). Exits 1 when no result is found (mutmut did not run).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

KILLED = {1, 3, 36, 24, -24, 152, 255}  # a failing test, pytest's internal error, or a timeout
SURVIVED = {0}
NO_TESTS = {5, 33}


def classify(code: int | None) -> str:
    """mutmut's exit code of one mutant as killed / survived / no tests / not checked / other."""
    if code is None:
        return "not checked"
    if code in KILLED:
        return "killed"
    if code in SURVIVED:
        return "survived"
    if code in NO_TESTS:
        return "no tests"
    return "other"


def tally(root: Path) -> dict[str, Counter[str]]:
    """Counts per source file (path relative to ``root``, without the .meta suffix)."""
    out: dict[str, Counter[str]] = {}
    for meta in sorted(root.rglob("*.py.meta")):
        codes = json.loads(meta.read_text()).get("exit_code_by_key", {})
        if codes:
            out[str(meta.relative_to(root))[: -len(".meta")]] = Counter(classify(c) for c in codes.values())
    return out


def score(c: Counter[str]) -> float:
    judged = c["killed"] + c["survived"] + c["no tests"]
    return 100.0 * c["killed"] / judged if judged else float("nan")


def main(root: Path = Path("mutants")) -> int:
    rows = tally(root)
    if not rows:
        print(f"no mutmut results under {root}/ (run `make mutate` first)", file=sys.stderr)
        return 1
    cols = ("killed", "survived", "no tests", "not checked", "other")
    print("| file | mutants | " + " | ".join(cols) + " | score % |")
    print("|---|---:|" + "---:|" * len(cols) + "---:|")
    total: Counter[str] = Counter()
    for path, c in rows.items():
        total.update(c)
        print(f"| {path} | {sum(c.values())} | " + " | ".join(str(c[k]) for k in cols) + f" | {score(c):.1f} |")
    cells = " | ".join(str(total[k]) for k in cols)
    print(f"| **total** | {sum(total.values())} | {cells} | {score(total):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("mutants")))
