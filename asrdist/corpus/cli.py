"""`asrdist corpus synth|fsdd|import-kaldi|import-lhotse|export-kaldi|export-lhotse`."""
from __future__ import annotations

import argparse
from pathlib import Path

from asrdist.checks import cli_number
from asrdist.commands import help_of


def register(sub: argparse._SubParsersAction, path: list[str] | None = None) -> None:
    p = sub.add_parser("corpus", help=help_of("corpus"))
    csub = p.add_subparsers(dest="corpus_command", required=True, metavar="KIND")

    s = csub.add_parser("synth", help="synthetic multi-speaker English corpus with exact phone alignments")
    s.add_argument("out", type=Path)
    s.add_argument("--utterances", type=cli_number(int, at_least=3), default=1000, help="default: 1000")
    s.add_argument("--seed", type=cli_number(int, at_least=0), default=0, help="default: 0")
    s.add_argument("--synthesizer", choices=["espeak", "flite"], default="espeak")
    s.add_argument("--jobs", type=cli_number(int, at_least=0), default=0, help="worker processes (default: all cores)")
    s.add_argument("--noise-snr", type=cli_number(float), default=None, help="add white noise at this SNR in dB")
    s.add_argument("--skip-bad", action="store_true", help="skip and count bad utterances")
    s.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    s.set_defaults(func=_synth)

    f = csub.add_parser("fsdd", help="Free Spoken Digit Dataset as a corpus")
    f.add_argument("out", type=Path)
    f.add_argument("--source", type=Path, default=None, help="FSDD checkout (default: ../shared/data/fsdd)")
    f.add_argument("--test-speaker", default=None, help="held-out speaker (default: the last by name)")
    f.add_argument("--split", choices=["speaker", "official"], default="speaker",
                   help="speaker: one whole speaker is the test set; official: takes 0-4 are test")
    f.add_argument("--sample-rate", type=int, choices=[8000, 16000], default=8000)
    f.add_argument("--channel", type=cli_number(int, at_least=0), default=None, metavar="K",
                   help="use channel K (0-based) of multi-channel recordings, which are an error without it")
    f.add_argument("--skip-bad", action="store_true")
    f.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    f.set_defaults(func=_fsdd)

    k = csub.add_parser("import-kaldi", help="a corpus from Kaldi data directories (train / dev / test)")
    k.add_argument("src", type=Path, help="a directory holding Kaldi data directories, or one of them")
    k.add_argument("out", type=Path)
    _add_split_options(k, "subdirectory")
    k.add_argument("--alignments", type=Path, default=None,
                   help="alignment ark/scp/text (int phone ids per frame); default: SRC/alignment.scp if present")
    k.add_argument("--lexicon", type=Path, default=None,
                   help="pronunciation dictionary (Kaldi lexicon.txt or CMU dict), stored as OUT/lexicon.txt: "
                        "phone targets of an unaligned corpus and `asrdist align` come from it")
    k.add_argument("--channel", type=cli_number(int, at_least=0), default=None, metavar="K",
                   help="use channel K (0-based) of multi-channel audio, which is an error without it "
                        "(stored as mono copies in OUT/audio)")
    k.add_argument("--skip-bad", action="store_true")
    k.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    k.set_defaults(func=_import_kaldi)

    h = csub.add_parser("import-lhotse", help="a corpus from lhotse manifests (a CutSet, or recordings + supervisions)")
    h.add_argument("src", type=Path, help="a CutSet manifest (CUTS.jsonl.gz, with or without features), or a "
                                          "directory of *cuts*.jsonl[.gz] or *recordings*.jsonl[.gz] + "
                                          "*supervisions*.jsonl[.gz] manifests, named by split as lhotse recipes "
                                          "write them")
    h.add_argument("out", type=Path)
    _add_split_options(h, "manifest part (e.g. train-clean-5)")
    h.add_argument("--skip-bad", action="store_true")
    h.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    h.set_defaults(func=_import_lhotse)

    e = csub.add_parser("export-kaldi", help="export a corpus split as a plain Kaldi data directory")
    e.add_argument("src", type=Path)
    e.add_argument("out", type=Path)
    e.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    e.set_defaults(func=_export_kaldi)

    x = csub.add_parser("export-lhotse", help="export a corpus (or one split) as lhotse CutSets, one per split")
    x.add_argument("src", type=Path, metavar="CORPUS")
    x.add_argument("out", type=Path, help="directory for cuts_SPLIT.jsonl.gz")
    x.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    x.set_defaults(func=_export_lhotse)


def _add_split_options(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--split", action="append", default=None, metavar="SPLIT[=NAME]",
                   help=f"SPLIT (train) when SRC is a single source; SPLIT=NAME picks the {what} for a "
                        f"split (train, valid, test) where the names do not say it")
    p.add_argument("--sample-rate", type=cli_number(int, at_least=4000), default=None, metavar="HZ",
                   help="resample audio at other rates to HZ (copies in OUT/audio); default: the rate of most "
                        "recordings, and audio at another rate is an error")
    p.add_argument("--valid-speakers", type=cli_number(int, at_least=1), default=None, metavar="N",
                   help="carve a valid set of N whole training speakers when the source has none "
                        "(default: 10%% of them, at least 1)")


def _synth(args):
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.corpus.synth import synth_command
    return synth_command(args)


def _fsdd(args):
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.corpus.fsdd import fsdd_command
    return fsdd_command(args)


def _import_kaldi(args):
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.corpus.import_kaldi import import_command
    return import_command(args)


def _import_lhotse(args):
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.corpus.import_lhotse import import_lhotse_command
    return import_lhotse_command(args)


def _export_kaldi(args):
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.corpus.export_kaldi import export_command
    return export_command(args)


def _export_lhotse(args):
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.corpus.lhotse_cuts import export_lhotse_command
    return export_lhotse_command(args)
