"""The mixing a gossiping job really had (issue 63 item 2): every exchange its actives started
(`Strategy.gossip`), in RUN/gossip.tsv, and summary.json's `gossip`: the spectral gap of the mixing
rebuilt from that record (`topology.measured_gap`) beside the lock-step schedule's over as many
rounds and the pattern's exact figure. Learners at different speeds (a straggler, unequal hosts)
mix less than the lock-step figure says; the record shows by how much."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from asrdist.io.atomic import write_text_atomic
from asrdist.parallel import topology

GOSSIP_NAME = "gossip.tsv"


def gossip_summary(records: Sequence[dict | None]) -> tuple[dict[str, Any], list] | None:
    """(summary.json's `gossip`, the exchanges in the order they started) from every learner's
    `Strategy.gossip()`; None when the strategy does not gossip."""
    kept = [r for r in records if r]
    if not kept:
        return None
    n, pattern, seed = kept[0]["learners"], kept[0]["pattern"], kept[0]["seed"]
    exchanges = sorted(tuple(e) for r in kept for e in r["exchanges"])
    pairs = [(int(a), int(p)) for _, a, p in exchanges]
    rounds = len(pairs) // (n // 2)
    lockstep = [pair for r in range(rounds) for pair in topology.partners_of_round(n, r, pattern, seed)]
    per_active = Counter(a for a, _ in pairs)
    counts = [per_active.get(a, 0) for a in topology.active_ranks(n)]
    figures = {"learners": n, "pattern": pattern, "exchanges": len(pairs), "rounds": rounds,
               "exchanges_per_active": {"min": min(counts), "max": max(counts)},
               "spectral_gap": topology.measured_gap(n, pairs),
               "spectral_gap_lockstep": topology.measured_gap(n, lockstep),
               "spectral_gap_expected": topology.pattern_gap(n, pattern, seed)}
    return figures, exchanges


def write_gossip(run_dir: Path, exchanges: list) -> None:
    """RUN/gossip.tsv: `seconds  active  passive` per exchange, seconds from the first one."""
    t0 = exchanges[0][0] if exchanges else 0.0
    lines = ["seconds\tactive\tpassive"] + [f"{t - t0:.6f}\t{a}\t{p}" for t, a, p in exchanges]
    write_text_atomic(Path(run_dir) / GOSSIP_NAME, "\n".join(lines) + "\n")
