"""`python -m asrdist.cluster.agent [--exits FILE] ARGS`: torchrun, `torch.distributed.run.main(ARGS)`
(the function the `torchrun` command calls), ended through `asrdist.utils.leave` once it returns.

asrdist's launcher starts its agents this way: the same agent, arguments and behaviour as
`python -m torch.distributed.run ARGS`, without the interpreter's teardown of torch after the job
(about 0.8 s of CPU per agent, see `asrdist.utils.leave`). A failed job raises out of torch's main
as under torchrun (its error file, the traceback on stderr, exit status 1), after its failure
records (`ChildFailedError.failures`) are written to FILE for the supervisor
(`asrdist.cluster.failures.write_exits`).
"""
from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main

from asrdist.cluster.failures import write_exits
from asrdist.utils.leave import leave

if __name__ == "__main__":
    args = sys.argv[1:]
    exits = None
    if args[:1] == ["--exits"]:
        exits, args = args[1], args[2:]
    try:
        main(args)
    except ChildFailedError as exc:
        if exits is not None:
            write_exits(exits, exc.failures)
        raise
    leave(0)
