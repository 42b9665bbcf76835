"""What a model says, utterance by utterance: `hyp.txt`, and in `eval.json` the worst
utterances, the error rate of each speaker and the most frequent errors.

Each record is {utt, ref, hyp, errors, ref_length, unit}: texts as a reader sees them (phone
symbols joined by spaces for phone models), errors counted by edit distance (kaldialign) in the
unit of the text (words for character models, phones otherwise).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Mapping, Sequence

import kaldialign

WORST = 10
_GAP = "\x00"  # kaldialign's filler for a missing token: no word or phone symbol


def _record(utt: str, ref: list, hyp: list, ref_text: str, hyp_text: str, unit: str) -> dict:
    d = kaldialign.edit_distance(ref, hyp)
    return {"utt": utt, "ref": ref_text, "hyp": hyp_text, "errors": d["sub"] + d["del"] + d["ins"],
            "ref_length": len(ref), "unit": unit}


def phone_details(utt_ids: Sequence[str], refs: Sequence[Sequence[int]], hyps: Sequence[Sequence[int]],
                  symbols: Sequence[str]) -> list[dict]:
    def text(seq):
        return " ".join(symbols[i] for i in seq)

    return [_record(u, list(r), list(h), text(r), text(h), "phones") for u, r, h in zip(utt_ids, refs, hyps)]


def text_details(utt_ids: Sequence[str], refs: Sequence[str], hyps: Sequence[str]) -> list[dict]:
    return [_record(u, r.split(), h.split(), " ".join(r.split()), " ".join(h.split()), "words")
            for u, r, h in zip(utt_ids, refs, hyps)]


def worst_utterances(records: list[dict], count: int = WORST) -> list[dict]:
    """The `count` utterances with the highest error rate (errors / reference length), most
    errors first among equals, then by id: the ones to listen to first."""
    def key(r):
        return (-r["errors"] / max(r["ref_length"], 1), -r["errors"], r["utt"])

    return [r for r in sorted(records, key=key) if r["errors"] > 0][:count]


def speaker_rates(records: list[dict], speaker_of: Mapping[str, str]) -> dict[str, dict]:
    """{speaker: {utterances, errors, ref_length, error_rate, sentence_accuracy}}, sorted by
    speaker: who the model fails (a new voice, a noisy room) more than how often."""
    out: dict[str, dict] = {}
    for r in records:
        s = out.setdefault(speaker_of.get(r["utt"], r["utt"]),
                           {"utterances": 0, "errors": 0, "ref_length": 0, "exact": 0})
        s["utterances"] += 1
        s["errors"] += r["errors"]
        s["ref_length"] += r["ref_length"]
        s["exact"] += int(r["errors"] == 0)
    return {spk: {"utterances": s["utterances"], "errors": s["errors"], "ref_length": s["ref_length"],
                  "error_rate": round(s["errors"] / max(s["ref_length"], 1), 4),
                  "sentence_accuracy": round(s["exact"] / s["utterances"], 4)}
            for spk, s in sorted(out.items())}


def speaker_table(speakers: Mapping[str, dict], unit: str) -> str:
    """`speaker_rates` as a text table, the worst speaker first (ties by name), ending in the
    pooled row: the lines `asrdist eval` prints."""
    rows = sorted(speakers.items(), key=lambda item: (-item[1]["error_rate"], item[0]))
    width = max([len("speaker"), len("all")] + [len(s) for s in speakers])
    head = f"{'speaker':<{width}}  {'utts':>5}  {unit:>7}  {'errors':>6}  {'error rate':>10}  {'utts right':>10}"
    lines = [head]
    for name, s in rows:
        lines.append(f"{name:<{width}}  {s['utterances']:>5}  {s['ref_length']:>7}  {s['errors']:>6}  "
                     f"{s['error_rate']:>10.4f}  {s['sentence_accuracy']:>10.4f}")
    utts = sum(s["utterances"] for s in speakers.values())
    length = sum(s["ref_length"] for s in speakers.values())
    errors = sum(s["errors"] for s in speakers.values())
    right = sum(s["sentence_accuracy"] * s["utterances"] for s in speakers.values())
    lines.append(f"{'all':<{width}}  {utts:>5}  {length:>7}  {errors:>6}  {errors / max(length, 1):>10.4f}  "
                 f"{right / max(utts, 1):>10.4f}")
    return "\n".join(lines) + "\n"


def confusions(records: list[dict], count: int = WORST) -> list[dict]:
    """The `count` most frequent errors over every utterance, in the records' unit, from
    kaldialign's alignment of each reference with its hypothesis: {ref, hyp, count}, a
    substitution (both set), a deletion (`hyp` "") or an insertion (`ref` ""); most frequent first."""
    counts: Counter = Counter()
    for r in records:
        for a, b in kaldialign.align(r["ref"].split(), r["hyp"].split(), _GAP):
            if a != b:
                counts[(a.replace(_GAP, ""), b.replace(_GAP, ""))] += 1
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:count]
    return [{"ref": a, "hyp": b, "count": n} for (a, b), n in ranked]


def hyp_lines(records: list[dict]) -> str:
    """Kaldi's `utt text` form, sorted by utterance id."""
    return "".join(f"{r['utt']} {r['hyp']}".rstrip() + "\n" for r in sorted(records, key=lambda r: r["utt"]))


def hyp_path(eval_json: Path) -> Path:
    """hyp.txt beside eval.json (`NAME.hyp.txt` beside any other NAME.json)."""
    return eval_json.with_name("hyp.txt") if eval_json.name == "eval.json" else eval_json.with_suffix(".hyp.txt")
