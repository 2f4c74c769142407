"""Where two runs of the kill drill (``bench/kill_drill.py --folder F``) part, job by job.

Reads two runs' SQLite databases (``F/killed/costopt.db``, ``F/baseline/costopt.db``...) and prints, for each
job (by name: ``k<i>``, ``f<i>``), its ledger cost in each run and, for the jobs whose costs differ, the two
runs' histories side by side from their first difference: the copies (epoch, instance, zone and type, start,
end, end reason, cost), the migrations (kind, created, last update, state) and the job's events. The runs of
one seed give each job the same id (``COSTOPT_JOB_ID_SEED``), so the rows line up.

    .venv/bin/python bench/kill_drill_diff.py F/killed F/baseline [--all] [--limit N]

Read only. Times are simulated (the stepped clock's), shown as HH:MM:SS from the day the drill starts.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path


def _t(us: int | None) -> str:
    if us is None:
        return "-"
    return datetime.fromtimestamp(us / 1_000_000, UTC).strftime("%H:%M:%S")


@dataclass(frozen=True)
class Row:
    """One line of a job's history: its simulated time (µs, for the order) and its text."""

    at: int
    text: str


def _history(db: sqlite3.Connection, job_id: str) -> list[Row]:
    rows: list[Row] = []
    costs = {
        key: amount
        for key, amount in db.execute(
            "select interval_key, amount_micro_usd from ledger_intervals where job_id = ?", (job_id,)
        )
    }
    for key, epoch, iid, offer, start, end, why in db.execute(
        "select interval_key, epoch, instance_id, offer, started_at, ended_at, end_reason from migration_copies "
        "where job_id = ? order by started_at, epoch",
        (job_id,),
    ):
        o = json.loads(offer)
        usd = costs.get(key)
        cost = "-" if usd is None else f"{Decimal(usd) / 1_000_000:.4f}"
        rows.append(
            Row(
                start,
                f"copy e{epoch} {iid} {o.get('zone')}/{o.get('instance_type')} {_t(start)}-{_t(end)} "
                f"{why or ''} {cost}",
            )
        )
    for _mid, kind, state, f, t, created, updated, reason in db.execute(
        "select id, kind, state, from_epoch, to_epoch, created_at, updated_at, reason from migrations "
        "where job_id = ? order by created_at, id",
        (job_id,),
    ):
        rows.append(Row(created, f"mig {kind} e{f}->e{t} {_t(created)}..{_t(updated)} {state} {reason[:60]}"))
    for at, kind, to_state, reason in db.execute(
        "select at, kind, to_state, reason from job_events where job_id = ? order by id", (job_id,)
    ):
        if kind == "state":
            rows.append(Row(at, f"event {_t(at)} -> {to_state} {reason[:60]}"))
    rows.sort(key=lambda r: r.at)
    return rows


def _jobs(db: sqlite3.Connection) -> dict[str, tuple[str, Decimal]]:
    """name -> (job id, ledger cost USD: the job's intervals and additive charges)."""
    out: dict[str, tuple[str, Decimal]] = {}
    for jid, name in db.execute("select id, name from jobs"):
        micro = db.execute(
            "select coalesce(sum(amount_micro_usd), 0) from ledger_intervals where job_id = ?", (jid,)
        ).fetchone()[0]
        micro += db.execute(
            "select coalesce(sum(amount_micro_usd), 0) from ledger_charges where job_id = ? and additive", (jid,)
        ).fetchone()[0]
        out[name] = (jid, Decimal(micro) / 1_000_000)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, help="a run's folder (holding costopt.db)")
    p.add_argument("b", type=Path, help="the other run's folder")
    p.add_argument("--all", action="store_true", help="every job's history, not only the differing ones")
    p.add_argument("--limit", type=int, default=12, help="history lines shown per job from the first difference")
    a = p.parse_args(argv)
    dbs = [sqlite3.connect(f"file:{f / 'costopt.db'}?mode=ro", uri=True) for f in (a.a, a.b)]
    ja, jb = (_jobs(d) for d in dbs)
    names = sorted(set(ja) | set(jb), key=lambda n: (n[0], int(n[1:]) if n[1:].isdigit() else 0, n))
    total = [Decimal(0), Decimal(0)]
    print(f"{'job':6} {'A USD':>12} {'B USD':>12} {'A - B':>10}")
    for name in names:
        ca, cb = ja.get(name, ("", Decimal(0)))[1], jb.get(name, ("", Decimal(0)))[1]
        total[0] += ca
        total[1] += cb
        mark = "" if ca == cb else "  *"
        print(f"{name:6} {ca:12.6f} {cb:12.6f} {ca - cb:+10.6f}{mark}")
    print(f"{'total':6} {total[0]:12.6f} {total[1]:12.6f} {total[0] - total[1]:+10.6f}")
    for name in names:
        if name not in ja or name not in jb:
            continue
        if ja[name][1] == jb[name][1] and not a.all:
            continue
        ha, hb = _history(dbs[0], ja[name][0]), _history(dbs[1], jb[name][0])
        first = next(
            (i for i, (x, y) in enumerate(zip(ha, hb, strict=False)) if x.text != y.text), min(len(ha), len(hb))
        )
        print(f"\n== {name} ({ja[name][0]}): first difference at line {first} of {len(ha)} / {len(hb)}")
        lo = max(0, first - 2)
        for i in range(lo, min(max(len(ha), len(hb)), first + a.limit)):
            x = ha[i].text if i < len(ha) else ""
            y = hb[i].text if i < len(hb) else ""
            print(f"  A {x}\n  B {y}" if x != y else f"  = {x}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
