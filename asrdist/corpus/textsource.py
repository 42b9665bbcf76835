"""Sentences for the synthetic corpus: a small English grammar over word lists written here.

Why a grammar and not a text package: the text must exist offline, be identical on every machine
for a given seed (a Debian text package can change with its version), be pronounced from the
synthesizers' dictionaries (no digits, abbreviations or names they spell out), and cover every
phone of the 39-phone ARPAbet set. The word lists are chosen for that coverage: the rare phones
`zh` (measure, garage, usual, beige), `oy` (boy, coin, voice, noisy), `uh` (book, woman, sugar),
`th`/`dh`, `ch`/`jh`, `ng` and `aw` each have several words. Sentence `i` of seed `s` depends only
on `(s, i)`, so any worker can generate any sentence and the corpus does not depend on `--jobs`.
"""
from __future__ import annotations

import numpy as np

ADJECTIVES = (
    "big small old young yellow brown green heavy quiet loud bright dark warm cold smooth rough "
    "happy careful gentle strange usual royal shiny wooden golden thick thin cheap large lovely "
    "noisy sharp soft huge tiny pleasant beige purple orange clean dirty empty broken"
).split()
THINGS = (
    "chair table book cup bottle jacket box bridge garage treasure coin toy ship window ball clock "
    "picture engine fish cake bag lamp pillow hammer wheel ring key shoe hat boat letter piano "
    "guitar cheese watch blanket basket kettle sugar bucket wagon violin television"
).split()
THINGS_PLURAL = (
    "chairs tables books cups bottles jackets boxes bridges coins toys ships windows balls clocks "
    "pictures cakes bags lamps pillows hammers wheels rings keys shoes hats boats letters "
    "blankets baskets buckets apples oranges cookies flowers feathers"
).split()
AGENTS = (
    "boy girl woman teacher farmer doctor judge king child dog horse mouse cat bird neighbor "
    "soldier sailor driver singer baker artist visitor stranger pilot nurse mother father"
).split()
PLACES = (
    "kitchen garden village station house church beach forest river valley market office "
    "mountain harbor school library yard town bathroom garage museum theater shop north road"
).split()
NAMES = (
    "john mary peter susan george thomas judy charles ruth joseph helen victor joyce arthur "
    "lucy paul martha edward rose daniel"
).split()
PAST_TRANSITIVE = (
    "found carried pushed pulled washed measured painted bought took moved watched fixed opened "
    "closed dropped threw caught brought borrowed cleaned sold wanted needed chose showed hid "
    "touched packed cooked"
).split()
BASE_TRANSITIVE = (
    "find carry push pull wash measure paint buy take move watch fix open close drop throw catch "
    "bring borrow clean sell choose show hide touch pack cook"
).split()
PAST_INTRANSITIVE = (
    "laughed sang jumped slept shouted waited smiled arrived danced played rested worked "
    "listened stayed returned whispered"
).split()
ADVERBS = (
    "quickly slowly quietly loudly happily carefully again together outside early late "
    "yesterday gladly rarely usually"
).split()
TIMES = (
    "this morning|last night|every evening|on thursday|in june|after lunch|before dinner|at noon|"
    "on the weekend|in the autumn|during the summer|that afternoon|next month|all day"
).split("|")
PREPOSITIONS = "in near behind under beside inside through across toward from into".split()
NUMBERS = (
    "two three four five six seven eight nine ten eleven twelve thirteen twenty thirty forty "
    "fifty"
).split() + ["a hundred", "a thousand"]
PRONOUNS = "he she we they i you".split()
MODALS = "will could should might must can would".split()


def _template(rng: np.random.Generator) -> tuple[str, str]:
    """One sentence (lowercase words) and its final punctuation."""
    def pick(words):
        return words[int(rng.integers(len(words)))]

    kind = int(rng.integers(8))
    if kind == 0:
        s = (f"the {pick(ADJECTIVES)} {pick(AGENTS)} {pick(PAST_TRANSITIVE)} the {pick(THINGS)} "
             f"{pick(PREPOSITIONS)} the {pick(PLACES)}")
        return s, "."
    if kind == 1:
        return (f"{pick(NAMES)} {pick(PAST_TRANSITIVE)} {pick(NUMBERS)} {pick(ADJECTIVES)} "
                f"{pick(THINGS_PLURAL)} {pick(TIMES)}"), "."
    if kind == 2:
        return (f"did the {pick(AGENTS)} {pick(BASE_TRANSITIVE)} the {pick(ADJECTIVES)} "
                f"{pick(THINGS)} {pick(TIMES)}"), "?"
    if kind == 3:
        return (f"{pick(PRONOUNS)} {pick(MODALS)} {pick(BASE_TRANSITIVE)} the {pick(THINGS)} "
                f"{pick(PREPOSITIONS)} the {pick(ADJECTIVES)} {pick(PLACES)}"), "."
    if kind == 4:
        return (f"there were {pick(NUMBERS)} {pick(ADJECTIVES)} {pick(THINGS_PLURAL)} "
                f"{pick(PREPOSITIONS)} the {pick(PLACES)}"), "."
    if kind == 5:
        return (f"{pick(NAMES)} and the {pick(AGENTS)} {pick(PAST_INTRANSITIVE)} {pick(ADVERBS)} "
                f"{pick(PREPOSITIONS)} the {pick(PLACES)}"), "."
    if kind == 6:
        return (f"please {pick(BASE_TRANSITIVE)} the {pick(ADJECTIVES)} {pick(THINGS)} for "
                f"{pick(NAMES)} {pick(TIMES)}"), "."
    return (f"why did {pick(NAMES)} {pick(BASE_TRANSITIVE)} {pick(NUMBERS)} "
            f"{pick(THINGS_PLURAL)} {pick(ADVERBS)}"), "?"


def sentence(seed: int, index: int) -> tuple[str, str]:
    """Sentence `index` of the corpus drawn with `seed`: (lowercase words, text to synthesize).

    The synthesizer gets the words with sentence punctuation so that its intonation is natural;
    the transcript is the words alone.
    """
    rng = np.random.default_rng([seed, index, 0x7E47])
    words, punct = _template(rng)
    spoken = words[0].upper() + words[1:] + punct
    return words, spoken


def vocabulary() -> set[str]:
    """Every word the grammar can produce (for lexicon / language-model building)."""
    words = {"the", "did", "there", "were", "and", "please", "for", "why"}
    for group in (ADJECTIVES, THINGS, THINGS_PLURAL, AGENTS, PLACES, NAMES, PAST_TRANSITIVE,
                  BASE_TRANSITIVE, PAST_INTRANSITIVE, ADVERBS, PREPOSITIONS, PRONOUNS, MODALS,
                  NUMBERS, TIMES):
        for phrase in group:
            words.update(phrase.split())
    return words
