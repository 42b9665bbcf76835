"""One utterance's text from a trained model's scores: CTC search (greedy, prefix beam, or the
run's vocabulary) or, for hybrid models, the phone-loop Viterbi of `asrdist eval`. The model
computes where it is; the search runs on the CPU (`asrdist.eval.evaluate`)."""
from __future__ import annotations

import numpy as np
import torch

from asrdist.data.targets import Targets
from asrdist.eval.decode import viterbi_decode
from asrdist.eval.evaluate import ctc_hypothesis, decoding_log_priors, on_model_device, utterance_log_posteriors


@torch.no_grad()
def recognize(model: torch.nn.Module, feats: np.ndarray, targets: Targets, cfg, constrained=None,
              transform=None) -> str:
    """The model's text for one utterance's features: characters, phone symbols, or (a phone model
    with a vocabulary) words; `constrained` is the run's vocabulary search (`asrdist.eval.vocabulary`),
    if any; `transform` a CTC model's speaker map (`asrdist.eval.adapt.SpeakerTransform`), if any."""
    if model.kind == "ctc":
        x = on_model_device(model, torch.from_numpy(feats)[None])
        log_probs, lengths = model(transform(x) if transform is not None else x, torch.tensor([len(feats)]))
        lp = log_probs[0, : int(lengths[0])].cpu().double().numpy()
        tokens = ctc_hypothesis(lp, cfg, constrained)
        if targets.kind == "chars":
            return " ".join(targets.tokenizer.decode(tokens).split())
        if constrained is not None:  # a phone model's hypothesis made of vocabulary words
            return " ".join(constrained.words(tokens))
        return " ".join(targets.phones[t] for t in tokens)
    log_post = utterance_log_posteriors(model, feats, cfg.model.context)
    log_priors = decoding_log_priors(targets)  # unseen classes are left out, as in `asrdist eval`
    phones = viterbi_decode(log_post, cfg.eval.prior_scale * log_priors, targets.class_to_phone,
                            targets.bigram, min_duration=cfg.eval.min_duration,
                            acoustic_scale=cfg.eval.acoustic_scale, silence_id=targets.silence_id)
    return " ".join(targets.phones[p] for p in phones)
