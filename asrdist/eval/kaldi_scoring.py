"""Scores as Kaldi and icefall users read them: `%WER` lines, `errs.txt`, bootstrap intervals.

1. Each error rate's line is Kaldi's `compute-wer` form, `%WER 12.55 [ 97 / 773, 10 ins, 15 del,
   72 sub ]` (likewise `%CER`, `%PER`), from the counts `asrdist.eval.scoring` keeps.
2. `errs.txt` is icefall's `errs-*` file: the totals, each utterance's reference aligned with its
   hypothesis (kaldialign; `(ref->hyp)` marks an error, `*` the missing side), then the
   substitutions, deletions and insertions by count and every token's figures.
3. `--bootstrap`: a 95% interval of each rate by resampling utterances (Bisani & Ney 2004), from
   `kaldialign.bootstrap_wer_ci`, printed as Kaldi's `compute-wer-bootci` prints it.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Sequence

import kaldialign

GAP = "*"
"""icefall's mark of the missing side of an insertion or a deletion."""
REPLICATIONS = 10000
"""Bootstrap resamples (`compute-wer-bootci`'s default)."""


def percent(errors: int, ref_length: int) -> float:
    if ref_length:
        return 100.0 * errors / ref_length
    return 0.0 if errors == 0 else float("inf")


def kaldi_line(metric: str, counts: dict) -> str:
    """`%WER 12.55 [ 97 / 773, 10 ins, 15 del, 72 sub ]` for `counts` ({errors, ref_length, ins, del, sub})."""
    return (f"%{metric.upper()} {percent(counts['errors'], counts['ref_length']):.2f} [ {counts['errors']} / "
            f"{counts['ref_length']}, {counts['ins']} ins, {counts['del']} del, {counts['sub']} sub ]")


def bootstrap(sequences: dict, replications: int = REPLICATIONS, seed: int = 0) -> dict:
    """{metric: {rate, low, high, replications, seed}} (fractions) for each metric's (references,
    hypotheses) token sequences; a metric without utterances is left out."""
    out = {}
    for metric, (refs, hyps) in sequences.items():
        if not refs:
            continue
        ci = kaldialign.bootstrap_wer_ci([list(r) for r in refs], [list(h) for h in hyps],
                                         replications=replications, seed=seed)
        out[metric] = {"rate": round(ci["wer"], 6), "low": round(ci["ci95min"], 6), "high": round(ci["ci95max"], 6),
                       "replications": replications, "seed": seed}
    return out


def bootstrap_line(metric: str, interval: dict) -> str:
    """`%WER 12.55 95% Conf Interval [ 10.20, 14.90 ]`, as `compute-wer-bootci` prints it."""
    return (f"%{metric.upper()} {100 * interval['rate']:.2f} 95% Conf Interval [ {100 * interval['low']:.2f}, "
            f"{100 * interval['high']:.2f} ]")


def errs_path(eval_json: Path) -> Path:
    """errs.txt beside eval.json (`NAME.errs.txt` beside any other NAME.json), as hyp.txt is."""
    return eval_json.with_name("errs.txt") if eval_json.name == "eval.json" else eval_json.with_suffix(".errs.txt")


def _marked(pairs: Sequence[tuple[str, str]]) -> str:
    return " ".join(a if a == b else f"({a}->{b})" for a, b in pairs)


def errs_text(records: list[dict], metric: str) -> str:
    """icefall's errs file of `records` (`asrdist.eval.details`: utt, ref, hyp as space-separated
    tokens), `metric` (wer or per) naming the unit."""
    aligned = {r["utt"]: kaldialign.align(r["ref"].split(), r["hyp"].split(), GAP) for r in records}
    subs: Counter = Counter()
    dels: Counter = Counter()
    ins: Counter = Counter()
    # token -> [correct, substituted as ref, deleted, inserted, substituted as hyp]
    stats: dict[str, list[int]] = {}

    def stat(token: str) -> list[int]:
        return stats.setdefault(token, [0, 0, 0, 0, 0])

    for pairs in aligned.values():
        for a, b in pairs:
            if a == b:
                stat(a)[0] += 1
            elif a == GAP:
                ins[b] += 1
                stat(b)[3] += 1
            elif b == GAP:
                dels[a] += 1
                stat(a)[2] += 1
            else:
                subs[(a, b)] += 1
                stat(a)[1] += 1
                stat(b)[4] += 1
    ref_length = sum(len(r["ref"].split()) for r in records)
    counts = {"errors": sum(subs.values()) + sum(dels.values()) + sum(ins.values()), "ref_length": ref_length,
              "ins": sum(ins.values()), "del": sum(dels.values()), "sub": sum(subs.values())}
    unit = "words" if metric == "wer" else "phones"
    correct = sum(s[0] for s in stats.values())
    lines = [kaldi_line(metric, counts),
             f"Errors: {counts['ins']} insertions, {counts['del']} deletions, {counts['sub']} substitutions, over "
             f"{ref_length} reference {unit} ({correct} correct)",
             "Search below for sections starting with PER-UTT DETAILS:, SUBSTITUTIONS:, DELETIONS:, INSERTIONS:, "
             "PER-WORD STATS:", "", "PER-UTT DETAILS: corr or (ref->hyp)"]
    lines += [f"{utt}:\t{_marked(pairs)}" for utt, pairs in sorted(aligned.items())]
    lines += ["", "SUBSTITUTIONS: count ref -> hyp"]
    lines += [f"{n}   {a} -> {b}" for (a, b), n in sorted(subs.items(), key=lambda i: (-i[1], i[0]))]
    lines += ["", "DELETIONS: count ref"]
    lines += [f"{n}   {a}" for a, n in sorted(dels.items(), key=lambda i: (-i[1], i[0]))]
    lines += ["", "INSERTIONS: count hyp"]
    lines += [f"{n}   {b}" for b, n in sorted(ins.items(), key=lambda i: (-i[1], i[0]))]
    lines += ["", "PER-WORD STATS: word  corr tot_errs count_in_ref count_in_hyp"]
    rows = []
    for token, (corr, sub_ref, deleted, inserted, sub_hyp) in stats.items():
        errors = sub_ref + deleted + inserted + sub_hyp
        rows.append((-errors, token, f"{token}   {corr} {errors} {corr + sub_ref + deleted} {corr + inserted + sub_hyp}"))
    lines += [row for _, _, row in sorted(rows)]
    return "\n".join(lines) + "\n"
