"""What machine a figure came from: recorded in every benchmark JSON and run directory."""
from __future__ import annotations

import os
import platform
import sys

import torch


def machine_info() -> dict:
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
    }
