"""Rewrite asrdist/sim/validated_cases.json: the held-out rows of a fresh `asrdist simulate
--validate` and the rows of `asrdist bench simulator` JSONs (the arguments: e.g. one run on emulated
hosts and one with `--network loopback`, whose cases carry their placement). The bench rows of a
placement no argument measured are kept as recorded, with their part of the note.

    .venv/bin/python scripts/record_validated_cases.py [BENCH_SIMULATOR_JSON ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from asrdist.sim.uncertainty import RECORD, cases_from_bench, cases_from_validate, load_cases, record
from asrdist.sim.validate import validate


def main(argv: list[str]) -> int:
    old_cpu = [c for c in load_cases() if c.device == "cpu"] if RECORD.is_file() else []
    old_note = json.loads(RECORD.read_text()).get("note", "") if RECORD.is_file() else ""
    cpu, notes = [], []
    for path in argv:
        bench = json.loads(Path(path).read_text())
        cpu += cases_from_bench(bench)
        load = bench.get("load_average", {}).get("before", ["?"])[0]
        load = f"{load:.1f}" if isinstance(load, (int, float)) else load
        notes.append(f"`asrdist bench simulator` on {bench.get('network')} finished "
                     f"{bench.get('finished_at', 'at a time not recorded')} on {bench.get('cores')} cores at a "
                     f"load average of {load}")
    measured = {c.placement for c in cpu}
    kept = [c for c in old_cpu if c.placement not in measured]
    if kept:
        placements = {c.placement for c in kept}
        notes[:0] = [f"kept ({', '.join(sorted(placements))}): {part}" for part in bench_notes(old_note)
                     if ("loopback" if " on loopback " in part else "hosts") in placements]
    note = "; ".join(notes) + "; paper rows: `asrdist simulate --validate` (held out)" if argv else old_note
    cpu = kept + cpu
    record(cases_from_validate(validate()) + cpu, note=note)
    print(f"wrote {RECORD}")
    return 0


def bench_notes(note: str) -> list[str]:
    """The bench runs an earlier note names, one each (a "kept (...): " prefix and the paper rows
    left off)."""
    parts = [part.split("): ", 1)[1] if part.startswith("kept (") else part
             for part in note.split("; paper rows:")[0].split("; ")]
    return list(dict.fromkeys(part for part in parts if part.startswith("`asrdist bench simulator`")))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
