"""Where learners run: the one process-group set-up (`process_group.py`), the one launch path
(`launcher.py`: torch.distributed.run under asrdist's supervisor, `supervisor.py`, on this machine
or on the emulated cluster network of `netem.py`), and the learner side of learner functions
(`netem_launch.py`)."""
