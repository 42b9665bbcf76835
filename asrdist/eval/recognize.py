"""One utterance's text from a trained model's scores: CTC search (greedy, prefix beam, or the
run's vocabulary) or, for hybrid models, the phone-loop Viterbi of `asrdist eval`."""
from __future__ import annotations

import numpy as np
import torch

from asrdist.data.targets import Targets
from asrdist.eval.decode import viterbi_decode
from asrdist.eval.evaluate import _frame_logits, ctc_hypothesis


@torch.no_grad()
def recognize(model: torch.nn.Module, feats: np.ndarray, targets: Targets, cfg, constrained=None,
              transform=None) -> str:
    """The model's text for one utterance's features: characters, phone symbols, or (a phone model
    with a vocabulary) words; `constrained` is the run's vocabulary search (`asrdist.eval.vocabulary`),
    if any; `transform` a CTC model's speaker map (`asrdist.eval.adapt.SpeakerTransform`), if any."""
    if model.kind == "ctc":
        x = torch.from_numpy(feats)[None]
        log_probs, lengths = model(transform(x) if transform is not None else x, torch.tensor([len(feats)]))
        lp = log_probs[0, : int(lengths[0])].double().numpy()
        tokens = ctc_hypothesis(lp, cfg, constrained)
        if targets.kind == "chars":
            return " ".join(targets.tokenizer.decode(tokens).split())
        if constrained is not None:  # a phone model's hypothesis made of vocabulary words
            return " ".join(constrained.words(tokens))
        return " ".join(targets.phones[t] for t in tokens)
    priors = np.asarray(targets.priors, dtype=np.float64)
    with np.errstate(divide="ignore"):  # unseen classes are left out, as in `asrdist eval`
        log_priors = np.log(np.where(priors > 1e-6, priors, 0.0))
    log_post = torch.log_softmax(_frame_logits(model, feats, cfg.model.context), -1).double().numpy()
    phones = viterbi_decode(log_post, cfg.eval.prior_scale * log_priors, targets.class_to_phone,
                            targets.bigram, min_duration=cfg.eval.min_duration,
                            acoustic_scale=cfg.eval.acoustic_scale, silence_id=targets.silence_id)
    return " ".join(targets.phones[p] for p in phones)


