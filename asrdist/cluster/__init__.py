"""Where learners run: the one process-group set-up (`process_group.py`), the one launcher of
local learners (`launcher.py`, torch.distributed.run), and the emulated cluster network
(`netem.py`) with the learners launched on it (`netem_launch.py`)."""
