"""`asrdist eval RUN_DIR --data DATA_DIR` and `asrdist decode RUN_DIR WAV...`."""
from __future__ import annotations

import argparse
from pathlib import Path

from asrdist.checks import cli_device, cli_number
from asrdist.commands import help_of
from asrdist.errors import ConfigError
from asrdist.io.atomic import check_output_file

DECODE_EPILOG = """\
utterance ids: the file's name without its audio suffix (.wav, .flac, ...),
whitespace replaced by '_' (in `utt text` lines the first space ends the id).
When two files share a name, every id is the file's path relative to the
files' common directory, without the suffix (d1/x, d2/x), or with it where
only the suffix differs (x.flac, x.ogg); a file given twice gets -2, -3, ...
With --scp, the ids are the wav.scp's.

A file that cannot be decoded (unreadable audio, shorter than one frame) does
not stop the others: they are decoded and printed, then the command exits
non-zero with one line naming the bad file, and --out is not written. A path
that is missing or not a regular file stops it before anything is decoded."""


def register(sub: argparse._SubParsersAction, path: list[str] | None = None) -> None:
    p = sub.add_parser("eval", help=help_of("eval"))
    p.add_argument("run_dir", type=Path)
    p.add_argument("--data", type=Path, required=True, help="a split directory or a corpus directory (uses test)")
    p.add_argument("--out", type=Path, default=None,
                   help="output JSON (default RUN_DIR/eval.json); hypotheses go beside it, to NAME.hyp.txt "
                        "(hyp.txt for eval.json), and each utterance's alignment to NAME.errs.txt (errs.txt)")
    p.add_argument("--bootstrap", action="store_true",
                   help="also a 95%% confidence interval of each error rate, by resampling utterances "
                        "(kaldialign.bootstrap_wer_ci, 10000 resamples; Kaldi's compute-wer-bootci)")
    _vocabulary_option(p)
    p.add_argument("--adapt-rounds", type=cli_number(int, at_least=0), default=None, metavar="N",
                   help="CTC: rounds of unsupervised speaker adaptation (a feature map per speaker fitted to the "
                        "model's own hypotheses; 0 = off); default: the recipe's eval.adapt_rounds")
    _balance_option(p)
    _lm_options(p)
    _hybrid_options(p)
    device_option(p)
    p.set_defaults(func=_eval)

    d = sub.add_parser("decode", help=help_of("decode"),
                       epilog=DECODE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("run_dir", type=Path)
    d.add_argument("wavs", type=Path, nargs="*", metavar="WAV")
    d.add_argument("--scp", type=Path, default=None, metavar="WAV_SCP",
                   help="instead of WAV...: a Kaldi wav.scp (`utterance path` lines; its ids name the lines, as in "
                        "--utt2spk); command pipes and archive entries are refused (import such a directory)")
    d.add_argument("--out", type=Path, default=None,
                   help="also write the lines to this file (only when every file decodes)")
    _vocabulary_option(d)
    who = d.add_mutually_exclusive_group()
    who.add_argument("--same-speaker", action="store_true",
                     help="the files are one speaker's: decode them as `asrdist eval` decodes a speaker (CMVN "
                          "statistics over all of them, and the run's speaker adaptation for CTC models); by "
                          "default each file is its own speaker")
    who.add_argument("--utt2spk", type=Path, default=None, metavar="FILE",
                     help="Kaldi utt2spk (`utterance speaker` lines, utterance ids as below): each speaker's "
                          "files decoded together, as --same-speaker does for one")
    d.add_argument("--adapt-rounds", type=cli_number(int, at_least=0), default=None, metavar="N",
                   help="with --same-speaker or --utt2spk, CTC: rounds of speaker adaptation (0 = off); "
                        "default: the recipe's eval.adapt_rounds")
    _balance_option(d)
    _lm_options(d)
    _hybrid_options(d)
    d.add_argument("--channel", type=cli_number(int, at_least=0), default=None, metavar="K",
                   help="decode channel K (0-based) of multi-channel files, which are an error without it "
                        "(mono files are read as they are)")
    device_option(d)
    d.set_defaults(func=_decode)


def device_option(p: argparse.ArgumentParser) -> None:
    """`--device` of the commands that run a trained model (eval, decode, align)."""
    p.add_argument("--device", type=cli_device, default=None, metavar="cpu|cuda|cuda:N",
                   help="where the model computes (its forward passes; the searches and the scoring run on the "
                        "CPU); default: cuda when torch sees a GPU, else cpu")


def _vocabulary_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vocabulary", default=None, metavar="none|train|PATH",
                   help="CTC: hypotheses only from these words (the training transcripts' or a word list / "
                        "lexicon file's; a phone model pronounces them by the corpus lexicon or PATH, a "
                        "lexicon); default: the recipe's eval.vocabulary")


def _lm_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lm-weight", type=cli_number(float, at_least=0, at_most=100), default=None, metavar="W",
                   help="CTC with a vocabulary: weight of the word language model (--lm) in the search (0 = "
                        "off); default: the recipe's eval.lm_weight")
    p.add_argument("--word-bonus", type=cli_number(float, at_least=-100, at_most=100), default=None, metavar="B",
                   help="with a vocabulary: added per hypothesised word; default: the recipe's eval.word_bonus")
    p.add_argument("--lm", default=None, metavar="train|PATH",
                   help="the language model --lm-weight weighs: the training transcripts' bigram (train) or an ARPA "
                        "/ KenLM binary file; default: the recipe's eval.lm")
    p.add_argument("--decoder", default=None, metavar="prefix|flashlight",
                   help="CTC with a vocabulary: the word search, prefix (sums a hypothesis' alignments: more "
                        "accurate) or flashlight (flashlight-text's lexicon decoder, its best alignment: about 10x "
                        "faster); default: the recipe's eval.decoder (prefix)")
    p.add_argument("--lexicon", default=None, metavar="none|PATH",
                   help="CTC: the words' token sequences (a phone model's Kaldi / CMU lexicon, a character "
                        "model's `word  c h a r s |` lines); default: the recipe's eval.lexicon")


def _hybrid_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prior-scale", type=cli_number(float, at_least=0, at_most=10), default=None, metavar="S",
                   help="hybrid: the frame scores are log p(class|x) - S x log p(class) (1 = likelihoods, 0 = "
                        "posteriors); default: the recipe's eval.prior_scale")
    p.add_argument("--acoustic-scale", type=cli_number(float, above=0, at_most=100), default=None, metavar="A",
                   help="hybrid: weight of the frame scores against the phone bigram; default: the recipe's "
                        "eval.acoustic_scale")
    p.add_argument("--min-duration", type=cli_number(int, at_least=1, at_most=100), default=None, metavar="F",
                   help="hybrid: a decoded phone lasts at least F frames; default: the recipe's eval.min_duration")


def _balance_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--adapt-word-balance", type=cli_number(float, at_least=0, at_most=100), default=None,
                   metavar="X", help="isolated-word CTC models with a vocabulary: > 0 fits each speaker's map by "
                   "information maximisation, holding the speaker's words to the training word frequencies "
                   "with weight X (0 = fit to the hypotheses); default: the recipe's eval.adapt_word_balance")


def _eval(args):
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.eval.details import hyp_path
    from asrdist.eval.kaldi_scoring import errs_path
    from asrdist.run.evaluate import eval_command
    from asrdist.run.rundir import CONFIG_NAME, MODEL_NAME, TARGETS_NAME

    out = args.out or args.run_dir / "eval.json"
    run_files = tuple(args.run_dir / name for name in (MODEL_NAME, TARGETS_NAME, CONFIG_NAME))
    data = (args.data,) if args.data is not None else ()
    for path in (out, hyp_path(out), errs_path(out)):
        check_output_file(path, inputs=run_files + data)
    return eval_command(args)


def _decode(args):
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.run.decode import decode_command
    from asrdist.run.rundir import MODEL_NAME

    if bool(args.wavs) == (args.scp is not None):
        raise ConfigError("decode: give audio files (WAV...) or --scp wav.scp" + (", not both" if args.wavs else ""))
    if args.out is not None:
        extra = tuple(p for p in (args.utt2spk, args.scp) if p is not None)
        check_output_file(args.out, inputs=(*args.wavs, args.run_dir / MODEL_NAME, *extra))
    return decode_command(args)
