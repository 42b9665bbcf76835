"""The one reader and writer of this process's environment variables: every variable asrdist
honours has its function here, and so does the environment a child process starts with. The job's
own variables (torchrun's, and those asrdist's launcher adds) are read once, into `JobEnv`
(`asrdist.cluster.process_group`), from `process_environment()`."""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ELASTIC_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
"""Where torch's elastic agent tells a learner to write its error record."""
HOST_CGROUPS = "ASRDIST_HOST_CGROUPS"
"""The `cgroup.procs` files of the emulated host a learner runs on, joined by os.pathsep
(`asrdist.cluster.in_host`; set by the launcher for its agents)."""


def process_environment() -> Mapping[str, str]:
    """This process's variables, to read a job's (`JobEnv.from_environ`) from."""
    return os.environ


def child_environment(**overrides: str) -> dict[str, str]:
    """The environment of a child process: this one's, with `overrides`."""
    return {**os.environ, **overrides}


def cache_home() -> Path:
    """The user's cache directory: `XDG_CACHE_HOME`, else ~/.cache."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def compiler() -> str:
    """The C++ compiler torch's cpp_extension uses: `CXX`, else `c++`."""
    return os.environ.get("CXX", "c++")


def torch_extensions_dir() -> str | None:
    """Where torch's cpp_extension builds (`TORCH_EXTENSIONS_DIR`); None: torch's default."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or None


def prepend_to_path(directory: str) -> None:
    """Programs in `directory` are found first, by this process and the ones it starts."""
    os.environ["PATH"] = directory + os.pathsep + os.environ.get("PATH", "")


def any_set(names: tuple[str, ...]) -> bool:
    """Whether the user set any of the variables `names` (to something non-empty)."""
    return any(os.environ.get(name) for name in names)


def elastic_error_file() -> str | None:
    """The file torch's elastic agent reads a failed learner's error record from
    (ELASTIC_ERROR_FILE); None where the learner was not started by an agent."""
    return os.environ.get(ELASTIC_ERROR_FILE) or None


def host_cgroups() -> list[str]:
    """The `cgroup.procs` files this learner joins (HOST_CGROUPS); empty: none."""
    return [f for f in os.environ.get(HOST_CGROUPS, "").split(os.pathsep) if f]
