"""Kaldi data directories and audio files, read and written: the layer under corpus, features and eval."""
