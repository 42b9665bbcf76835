"""Forced alignment: frame-level phone alignments of transcribed speech through a lexicon, with a
trained CTC or hybrid model (`asrdist align`)."""
