"""Typed run configuration: YAML recipe -> dataclasses, strict about unknown keys.

A recipe has sections `data`, `model`, `optim`, `train`, `strategy`, `eval` and a top-level `seed`.
`section.key=value` overrides are applied on top (values parsed as YAML scalars). The strategy
section's keys depend on `strategy.name`: each strategy module defines its own config dataclass.
"""
from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from asrdist.checks import check_field
from asrdist.errors import ConfigError
from asrdist.features.fbank import MAX_MEL_BINS, MIN_MEL_BINS
from asrdist.models.registry import ModelConfig
from asrdist.optim.batch_search import check_search_sizes
from asrdist.optim.build import OptimConfig
from asrdist.parallel import STRATEGIES, strategy_config_class
from asrdist.parallel.base import DEFAULT_TIMEOUT_SECONDS
from asrdist.parallel.groups import check_group_size
from asrdist.train.loop import StragglerConfig, check_arithmetic


@dataclass
class DataConfig:
    corpus: str = "demo/corpus"
    """Corpus directory as built by `asrdist corpus ...` (train/, valid/, test/ inside)."""
    num_mel_bins: int = 40
    """Filterbank size (10 to 128; Kaldi's default is 23) used when the corpus has no features yet or
    other ones (training re-extracts them)."""
    cmvn: str = "global"
    """global | speaker | none."""
    targets: str = "monophone"
    """Frame models: monophone | tied. CTC models: phones | chars."""
    tied_states: int = 200
    """Number of tied context-dependent classes when targets = tied."""
    batch_size: int = 256
    """Global minibatch: frames (DNN), chunks (LSTM) or max frames per batch (CTC); split evenly across learners."""
    window_utterances: int = 64
    """Frame randomization window, in utterances."""
    speed_perturb: list[float] = field(default_factory=list)
    """Speed perturbation as in Kaldi recipes, e.g. [0.9, 1.0, 1.1]: a copy of every training utterance
    at each factor other than 1.0 (asrdist.data.augment); [] = off."""
    noise_snr: float | None = None
    """Additive noise at this SNR (dB) on every augmented copy, plus one noisy copy at speed 1.0; null = off."""
    time_masks: int = 0
    """SpecAugment: time masks per training utterance or chunk (0 = off)."""
    time_mask_frames: int = 10
    """SpecAugment: widest time mask, in frames (and at most a fifth of the utterance)."""
    freq_masks: int = 0
    """SpecAugment: frequency masks per training utterance, chunk or spliced frame (0 = off)."""
    freq_mask_bins: int = 8
    """SpecAugment: widest frequency mask, in filterbank bins."""
    edge_crop: float = 0.0
    """CTC only: probability that a training utterance loses a random part of its leading and trailing
    quiet frames (tighter end-pointing, asrdist.data.augment step 4); 0 = off."""
    freq_warp: float = 0.0
    """Vocal tract length perturbation: each training utterance's filterbank is warped in frequency by
    a factor drawn uniformly from [1 - freq_warp, 1 + freq_warp] (asrdist.data.augment step 5); 0 = off."""

    def __post_init__(self):
        if self.cmvn not in ("global", "speaker", "none"):
            raise ConfigError(f"data.cmvn: '{self.cmvn}' is not one of global, speaker, none")
        if self.targets not in ("monophone", "tied", "phones", "chars"):
            raise ConfigError(f"data.targets: '{self.targets}' is not one of monophone, tied, phones, chars")
        check_field("data.num_mel_bins", self.num_mel_bins, at_least=MIN_MEL_BINS, at_most=MAX_MEL_BINS)
        check_field("data.tied_states", self.tied_states, at_least=1)
        check_field("data.batch_size", self.batch_size, at_least=1)
        check_field("data.window_utterances", self.window_utterances, at_least=1)
        for factor in self.speed_perturb:
            check_field("data.speed_perturb", factor, float, at_least=0.5, at_most=2.0)
        if self.noise_snr is not None:
            check_field("data.noise_snr", self.noise_snr, float, at_least=-10, at_most=60)
        check_field("data.time_masks", self.time_masks, at_least=0)
        check_field("data.time_mask_frames", self.time_mask_frames, at_least=1)
        check_field("data.freq_masks", self.freq_masks, at_least=0)
        check_field("data.freq_mask_bins", self.freq_mask_bins, at_least=1, at_most=self.num_mel_bins)
        check_field("data.edge_crop", self.edge_crop, float, at_least=0, at_most=1)
        check_field("data.freq_warp", self.freq_warp, float, at_least=0, at_most=0.3)


@dataclass
class TrainConfig:
    epochs: int = 4
    learners: int = 1
    """Local learner processes (torch.distributed.run --nproc-per-node)."""
    max_steps: int = 0
    """Stop after this many steps in total (0 = no limit)."""
    log_every: int = 20
    checkpoint_every: int = 0
    """Atomic checkpoint every K steps (0 = only at epoch end)."""
    checkpoint_minutes: float = 10.0
    """Lock-step strategies: a checkpoint about every this many minutes within an epoch as well (the
    interval is fixed in steps from the time of the first steps of each start), so that a run killed
    in a long first epoch can be resumed; 0 = only at epoch ends (and `checkpoint_every`)."""
    validate_every_epochs: int = 1
    validate_every: int = 0
    """Validate the consensus model every this many minibatches within an epoch as well (0 = at
    epoch ends only); each validation is in summary.json's `validations` with its wall seconds."""
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    """Timeout of every collective and of the whole launch's rendezvous."""
    threads: int = 0
    """Torch threads per learner (0 = cores / local learners)."""
    emulate_compute_ms: float = 0.0
    """Replace forward/backward by a sleep and synthetic gradients (scaling benchmarks)."""
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    group_size: int = 0
    """Learners per group (a "node" for hierarchical strategies); 0 = torchrun's LOCAL_WORLD_SIZE."""
    nonfinite: str = "stop"
    """A NaN/inf loss or gradient: stop (the run ends naming the step) | skip (the minibatch is
    dropped on every learner that shares the step, counted in summary.json)."""
    max_skips_in_a_row: int = 10
    """skip: this many non-finite minibatches in a row stop the run."""
    max_restarts: int = 0
    """When a learner fails, torchrun restarts every learner this many times at most; each restart
    resumes from the last checkpoint (`--max-restarts` of torch.distributed.run)."""
    average_last: int = 1
    """The final model (model.pt) is the element-wise mean of the models of the last N epochs
    (ESPnet's and icefall's checkpoint averaging; `asrdist.train.epoch_average`); 1 = the last
    epoch's model alone. More than train.epochs averages them all."""
    accumulate: int = 1
    """Gradient accumulation: forward and backward of each learner's minibatch in this many
    micro-batches (its rows split evenly; activations of one micro-batch in memory at a time), the
    gradients summed, then one exchange and one step of the whole minibatch, as one batch would
    take it. The minibatch (`data.batch_size`, the global one) stays what it is."""
    precision: str = "fp32"
    """fp32 | bf16: bf16 runs the forward (and so the backward's matrix products) under torch's
    autocast; weights, gradients, optimizer state and what strategies exchange stay fp32."""

    def __post_init__(self):
        for key, minimum in (("epochs", 1), ("learners", 1), ("max_steps", 0), ("log_every", 1),
                             ("checkpoint_every", 0), ("validate_every_epochs", 1), ("validate_every", 0),
                             ("threads", 0)):
            check_field(f"train.{key}", getattr(self, key), at_least=minimum)
        check_field("train.timeout_seconds", self.timeout_seconds, float, above=0)
        check_field("train.checkpoint_minutes", self.checkpoint_minutes, float, at_least=0, at_most=7 * 24 * 60)
        check_field("train.emulate_compute_ms", self.emulate_compute_ms, float, at_least=0)
        check_field("train.group_size", self.group_size, at_least=0)
        if self.nonfinite not in ("stop", "skip"):
            raise ConfigError(f"train.nonfinite: expected stop or skip, got {self.nonfinite!r}")
        check_field("train.max_skips_in_a_row", self.max_skips_in_a_row, at_least=1)
        check_field("train.max_restarts", self.max_restarts, at_least=0, at_most=100)
        check_field("train.average_last", self.average_last, at_least=1)
        check_arithmetic(self.accumulate, self.precision)
        if not isinstance(self.straggler, StragglerConfig):
            raise ConfigError(f"train.straggler: expected a mapping, got {self.straggler!r}")


@dataclass
class EvalConfig:
    min_duration: int = 3
    """Minimum phone duration in frames for Viterbi decoding."""
    acoustic_scale: float = 1.0
    prior_scale: float = 1.0
    bigram_smoothing: float = 1.0
    beam: int = 8
    """CTC beam width (0 = greedy only)."""
    vocabulary: str = "none"
    """CTC only: none | train (hypotheses made of the training transcripts' words) | PATH (a word
    list or lexicon: the first field of each line), searched by `asrdist.eval.vocabulary`. A phone
    model pronounces the words by a lexicon: the corpus' (train) or PATH, which must then be one."""
    adapt_rounds: int = 0
    """CTC only, `asrdist eval`: rounds of unsupervised speaker adaptation (`asrdist.eval.adapt`: a
    per-speaker affine feature map fitted to the model's own hypotheses, then decode again); 0 = off."""
    adapt_steps: int = 30
    """Adam steps per adaptation round, each over all of a speaker's utterances."""
    adapt_lr: float = 0.01
    """Adam's step size for the feature map."""
    adapt_l2: float = 0.03
    """Weight of |A - I|^2 + |b|^2, which keeps the map near the identity."""
    adapt_word_balance: float = 0.0
    """Isolated-word models decoding with a vocabulary: > 0 fits each speaker's map by information
    maximisation instead of to the hypotheses (each utterance's word made certain while the speaker's
    words, taken together, keep the training transcripts' word frequencies; this weight holds them
    there). It assumes a test speaker says the words about as often as the training speakers did."""
    lm_weight: float = 0.0
    """CTC with a vocabulary: weight of the word language model `eval.lm` in the search
    (`asrdist.eval.lexdecoder`: lm_weight x ln P(word | history)); 0 = off. Without a vocabulary
    (character models): weight of a token LM given as `eval.lm` PATH."""
    word_bonus: float = 0.0
    """With a vocabulary: added per hypothesised word (longer hypotheses against the LM's cost)."""
    lm: str = "train"
    """The language model `lm_weight` weighs: train (the training transcripts' word bigram, the run
    directory's lm.arpa) or PATH (an ARPA file or a KenLM binary, over words; over the model's
    characters, `|` the space, when eval.vocabulary is none)."""
    decoder: str = "prefix"
    """CTC with a vocabulary: prefix (`asrdist.eval.prefixsearch`: a hypothesis scores the sum over
    its alignments, the CTC posterior; more accurate) or flashlight (flashlight-text's lexicon
    decoder: its best alignment; about 10x faster). Both take eval.lm and eval.lexicon."""
    lexicon: str = "none"
    """CTC only: none, or PATH: the words' token sequences (a phone model's Kaldi / CMU lexicon; a
    character model's `word  c h a r s |` lines); its words are the vocabulary unless eval.vocabulary
    names one."""

    def __post_init__(self):
        check_field("eval.min_duration", self.min_duration, at_least=1)
        check_field("eval.acoustic_scale", self.acoustic_scale, float, above=0)
        check_field("eval.prior_scale", self.prior_scale, float, at_least=0)
        check_field("eval.bigram_smoothing", self.bigram_smoothing, float, at_least=0)
        check_field("eval.beam", self.beam, at_least=0)
        check_field("eval.adapt_rounds", self.adapt_rounds, at_least=0)
        check_field("eval.adapt_steps", self.adapt_steps, at_least=1)
        check_field("eval.adapt_lr", self.adapt_lr, float, above=0)
        check_field("eval.adapt_l2", self.adapt_l2, float, at_least=0)
        check_field("eval.adapt_word_balance", self.adapt_word_balance, float, at_least=0, at_most=100)
        check_field("eval.lm_weight", self.lm_weight, float, at_least=0, at_most=100)
        check_field("eval.word_bonus", self.word_bonus, float, at_least=-100, at_most=100)
        if not isinstance(self.vocabulary, str) or not self.vocabulary.strip():
            raise ConfigError(f"eval.vocabulary: expected none, train or a word-list path, got {self.vocabulary!r}")
        if self.vocabulary not in ("none", "train") and not Path(self.vocabulary).is_file():
            raise ConfigError(f"eval.vocabulary: {self.vocabulary}: word list not found (or use none / train)")
        if not isinstance(self.lm, str) or not self.lm.strip():
            raise ConfigError(f"eval.lm: expected train or the path of an ARPA / KenLM binary file, got {self.lm!r}")
        if self.lm != "train" and not Path(self.lm).is_file():
            raise ConfigError(f"eval.lm: {self.lm}: language model not found (an ARPA or KenLM binary file, "
                              "or train)")
        if self.decoder not in ("prefix", "flashlight"):
            raise ConfigError(f"eval.decoder: expected prefix or flashlight, got {self.decoder!r}")
        if not isinstance(self.lexicon, str) or not self.lexicon.strip():
            raise ConfigError(f"eval.lexicon: expected none or a lexicon path, got {self.lexicon!r}")
        if self.lexicon != "none" and not Path(self.lexicon).is_file():
            raise ConfigError(f"eval.lexicon: {self.lexicon}: lexicon not found (or use none)")
        words = self.vocabulary != "none" or self.lexicon != "none"
        if (self.lm_weight > 0 and self.lm == "train" or self.word_bonus != 0) and not words:
            raise ConfigError("eval.lm_weight: the word bigram scores vocabulary words; it needs eval.vocabulary "
                              "(train or a word list) or eval.lexicon (or, for a character model, eval.lm=PATH of "
                              "a character LM)")


@dataclass
class RunConfig:
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    strategy: Any = None
    """The strategy's own config dataclass; its `name` picks the class."""
    strategy_name: str = "single"
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self):
        """Checks that need more than one section, so a bad combination fails before any run starts."""
        check_field("seed", self.seed, at_least=0, at_most=2**32 - 1)
        learners = self.train.learners
        if self.strategy_name == "single" and learners != 1:
            several = ", ".join(name for name in STRATEGIES if name != "single")
            raise ConfigError(f"train.learners: strategy 'single' runs exactly 1 learner, got {learners} "
                              f"(pick one that runs several with --strategy: {several})")
        if self.data.batch_size % learners:
            raise ConfigError(f"data.batch_size: must be a multiple of train.learners = {learners} "
                              f"(each learner takes an equal share), got {self.data.batch_size}")
        if self.train.group_size:
            check_group_size(self.train.group_size, learners, f"train.learners = {learners}")
        if getattr(self.strategy, "auto_batch_size", False):
            check_search_sizes(self.data.batch_size, learners)
        for key in ("vocabulary", "lexicon"):
            if getattr(self.eval, key) != "none" and self.data.targets not in ("chars", "phones"):
                raise ConfigError(f"eval.{key}: word-constrained decoding is for CTC models (data.targets=chars "
                                  f"or phones), not data.targets={self.data.targets}")
        if (self.eval.lm_weight > 0 and self.eval.vocabulary == "none" and self.eval.lexicon == "none"
                and self.data.targets != "chars"):
            raise ConfigError("eval.lm: a token LM (eval.vocabulary none) is for character CTC models, not "
                              f"data.targets={self.data.targets}; give eval.vocabulary or eval.lexicon")
        for key in ("adapt_rounds", "adapt_word_balance"):
            if getattr(self.eval, key) and self.model.kind != "ctc":
                raise ConfigError(f"eval.{key}: speaker adaptation is for CTC models, not model.name="
                                  f"{self.model.name}")
        if self.data.edge_crop and self.model.kind != "ctc":
            raise ConfigError(f"data.edge_crop: crops the silence around CTC utterances; model.name="
                              f"{self.model.name} trains frame targets, which it would misalign: set it to 0")
        for rank in self.train.straggler.ranks:
            if rank >= learners:
                raise ConfigError(f"train.straggler.ranks: each rank must be in [0, {learners - 1}] "
                                  f"(train.learners = {learners}), got {rank}")

    def to_dict(self) -> dict:
        d = {"seed": self.seed}
        for name in ("data", "model", "optim", "train"):
            d[name] = dataclasses.asdict(getattr(self, name))
        d["strategy"] = {"name": self.strategy_name,
                         **(dataclasses.asdict(self.strategy) if self.strategy is not None else {})}
        d["eval"] = dataclasses.asdict(self.eval)
        return d


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping")
        return from_dict(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], where)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return str(value)
    return value


def from_dict(cls: type, data: dict, where: str) -> Any:
    """Build dataclass `cls` from a mapping; unknown keys and wrong types are ConfigErrors."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown config key (known: {', '.join(sorted(names))})")
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def apply_override(tree: dict, override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override '{override}': expected section.key=value")
    key, _, raw = override.partition("=")
    parts = key.strip().split(".")
    node = tree
    for p in parts[:-1]:
        if node.get(p) is None:  # a section left empty in YAML (`data:`) reads as null
            node[p] = {}
        node = node[p]
        if not isinstance(node, dict):
            raise ConfigError(f"override '{override}': '{p}' is not a section")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        reason = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ConfigError(f"override '{override}': the value is not YAML ({reason}); a text value "
                          f"with such characters needs quotes inside the shell's") from None
    if isinstance(value, str):
        try:  # YAML 1.1 reads "1e-3" as a string
            value = float(value)
        except ValueError:
            pass
    node[parts[-1]] = value


class _RecipeLoader(yaml.SafeLoader):
    """YAML for recipes: `1e-3` is a number (YAML 1.1 wants `1.0e-3`), and a key given twice or a
    key that is not a name is an error (PyYAML would keep the last value, or sort keys of mixed
    types into a TypeError)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            if not isinstance(key, str):
                raise ConfigError(f"{self.name}:{line}: key {key!r} is not a name")
            if key in seen:
                raise ConfigError(f"{self.name}:{line}: key '{key}' given twice (the first would be lost)")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def check_sections(tree: dict, where: str) -> dict:
    """Each section a mapping (`strategy: NAME` is read as `strategy: {name: NAME}`)."""
    if isinstance(tree.get("strategy"), str):
        tree["strategy"] = {"name": tree["strategy"]}
    for key in ("data", "model", "optim", "train", "eval", "strategy"):
        value = tree.get(key)
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{where}{key}: expected a section of `key: value` lines, got {type(value).__name__} "
                              f"{value!r}")
    return tree


def read_config_tree(path: str | Path) -> dict:
    """The raw mapping of a YAML recipe; a missing or malformed file is a one-line ConfigError."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a config file")
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {exc.start})") from None
    try:
        loader = _RecipeLoader(text)
        loader.name = str(path)
        try:
            tree = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error(path, exc)) from None
    if tree is None:  # an empty file (or only comments) is no recipe, not the default one
        raise ConfigError(f"{path}: empty recipe (no settings); give a recipe with at least the sections "
                          f"it changes, e.g. configs/default.yaml")
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: expected a mapping of sections (model:, data:, ...) at the top level, "
                          f"found {_yaml_kind(tree)}")
    return check_sections(tree, f"{path}: ")


def _yaml_kind(value) -> str:
    kinds = {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def _yaml_error(path: Path, exc: yaml.YAMLError) -> str:
    """One line naming the file, the line and what the parser found there (and what it was inside)."""
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    if not problem:
        return f"{path}: invalid YAML ({str(exc).splitlines()[0]})"
    where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    inside = ""
    if context:
        inside = f" ({context}{f' that starts at line {start.line + 1}' if start is not None else ''})"
    return f"{where}: invalid YAML: {problem}{inside}"


def load_config(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    tree = read_config_tree(path) if path is not None else {}
    for o in overrides:
        apply_override(tree, o)
    return config_from_tree(tree)


def config_sections() -> dict[str, type]:
    """The recipe's sections besides `strategy` (whose dataclass depends on its name)."""
    return {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig, "train": TrainConfig,
            "eval": EvalConfig}


def config_from_tree(tree: dict) -> RunConfig:
    known = {"seed", "data", "model", "optim", "train", "strategy", "eval"}
    check_sections(tree, "")
    unknown = sorted(map(str, set(tree) - known))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown config section (known: {', '.join(sorted(known))})")
    strategy_tree = dict(tree.get("strategy") or {})
    name = str(strategy_tree.pop("name", "single"))
    cls = strategy_config_class(name)
    if cls is None:
        if strategy_tree:
            raise ConfigError(f"strategy.{sorted(strategy_tree)[0]}: unknown config key for strategy '{name}'")
        strategy = None
    else:
        strategy = from_dict(cls, strategy_tree, "strategy")
    sections = {}
    for key, cls_ in config_sections().items():
        sections[key] = from_dict(cls_, tree.get(key) or {}, key)
    return RunConfig(seed=tree.get("seed", 0), strategy=strategy, strategy_name=name, **sections)
