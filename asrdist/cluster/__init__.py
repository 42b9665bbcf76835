"""Where learners run: the one process-group set-up (`process_group.py`), the launcher, and the
emulated cluster network."""
