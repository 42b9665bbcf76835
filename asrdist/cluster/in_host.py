"""`python -m asrdist.cluster.in_host MODULE ARGS...`: join this learner's emulated host's cgroups
(their `cgroup.procs` files in `environ.HOST_CGROUPS`), then run `python -m MODULE ARGS` in this process.

On dedicated emulated hosts (`--cpus-per-host`, `asrdist.cluster.cpushare`) the launcher starts
every learner through this module, so that a host's quota holds its learners' processes and
every thread they start (their communication threads included) and nothing else: torchrun's agent
of each host, and with host 0's the job's c10d store that every learner's claims go to, runs on
the machine's margin beside the hosts, as a real cluster's agents and store run on its hosts' CPU
beside their devices. (With the store inside host 0's quota, at 16 hosts of 0.12 cores every claim
of every learner waited for host 0's next quota period: docs/seeds.md.)

Imports nothing of torch: the learner's own imports are charged to its host.
"""
from __future__ import annotations

import os
import runpy
import sys

from asrdist.utils import environ


def join(files: list[str]) -> None:
    """Move this process (all its threads) into every cgroup of `files` (`cgroup.procs` paths)."""
    pid = str(os.getpid())
    for f in files:
        with open(f, "w") as procs:
            procs.write(pid)


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -m asrdist.cluster.in_host MODULE [ARGS...]")
    try:
        join(environ.host_cgroups())
    except OSError as e:
        sys.exit(f"asrdist: error: learner {os.getpid()}: cannot join its host's cgroup ({e})")
    sys.argv = list(argv)  # as `python -m MODULE ARGS` sees them (runpy sets argv[0] to its file)
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
