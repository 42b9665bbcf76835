"""Time a character CTC run's word searches on a split and score them: CPU seconds per utterance,
CER and WER, for each decoder (eval.decoder prefix and flashlight; a checkout without eval.decoder:
its one search) at each beam, without and with the run's LM (eval.lm_weight 0.5, eval.word_bonus 1.0).

The network's log-probs are computed once; only the search is timed (time.process_time, one
thread). The search is whichever asrdist is on PYTHONPATH, so two checkouts compare two searches
on the same model (docs/evaluation.md, "The lexicon search against the earlier Python search"):

    PYTHONPATH=CHECKOUT .venv/bin/python scripts/time_ctc_search.py RUN SPLIT OUT.json [BEAM ...]
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

import asrdist
from asrdist.eval.decode import ctc_greedy_decode
from asrdist.eval.scoring import error_rate
from asrdist.eval.vocabulary import vocabulary_search
from asrdist.features.store import FeatureStore
from asrdist.io.kaldi_dir import read_data_dir
from asrdist.run.evaluate import load_run_model


def main(run: Path, split: Path, out: Path, beams: list[int]) -> None:
    torch.set_num_threads(1)
    model, cfg, targets, _ = load_run_model(run, {"vocabulary": "train"})
    tok = targets.tokenizer
    store, data = FeatureStore(split), read_data_dir(split)
    log_probs, refs = [], []
    with torch.no_grad():
        for utt in store.utt_ids:
            feats = torch.from_numpy(np.array(store[utt]))[None]
            lp, n = model(feats, torch.tensor([feats.shape[1]]))
            log_probs.append(lp[0, :int(n[0])].double().numpy())
            refs.append(tok.normalize(data.utterances[utt].text))

    def score(hyps):
        return {"cer": error_rate([list(r) for r in refs], [list(h) for h in hyps])["rate"],
                "wer": error_rate([r.split() for r in refs], [h.split() for h in hyps])["rate"]}

    rows = {"code": asrdist.__file__, "utterances": len(refs), "frames": sum(len(x) for x in log_probs),
            "lm": getattr(cfg.eval, "lm", "the training bigram, in memory"),
            "greedy": score([tok.decode(ctc_greedy_decode(lp)) for lp in log_probs])}
    decoders = ("prefix", "flashlight") if hasattr(cfg.eval, "decoder") else ("",)
    for decoder, beam in ((d, b) for d in decoders for b in beams):
        for weight, bonus in ((0.0, 0.0), (0.5, 1.0)):
            cfg.eval.beam, cfg.eval.lm_weight, cfg.eval.word_bonus = beam, weight, bonus
            if decoder:
                cfg.eval.decoder = decoder
            search = vocabulary_search(cfg, targets)
            search.search(log_probs[0])  # built, its LM loaded, before the clock starts
            start = time.process_time()
            hyps = [tok.decode(search.search(lp)) for lp in log_probs]
            cpu = time.process_time() - start
            key = f"{decoder + '_' if decoder else ''}beam{beam}_lm{weight}"
            rows[key] = {**score(hyps), "cpu_s_per_utt": cpu / len(refs)}
            print(f"{key}: {rows[key]}", flush=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), [int(b) for b in sys.argv[4:]] or [8, 32])
