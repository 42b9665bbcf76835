"""`python -m asrdist.cluster.agent ARGS`: torchrun, `torch.distributed.run.main(ARGS)` (the function
the `torchrun` command calls), ended through `asrdist.utils.leave` once it returns.

asrdist's launcher starts its agents this way: the same agent, arguments and behaviour as
`python -m torch.distributed.run ARGS`, without the interpreter's teardown of torch after the job
(about 0.8 s of CPU per agent, see `asrdist.utils.leave`). A failed job raises out of torch's main
as under torchrun (its error file, the traceback on stderr, exit status 1).
"""
from __future__ import annotations

from torch.distributed.run import main

from asrdist.utils.leave import leave

if __name__ == "__main__":
    main()
    leave(0)
