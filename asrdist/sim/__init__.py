"""Scaling simulator: predicts frames/s, speed-up and time per epoch of every asrdist strategy on
a cluster that is not in front of the user (`asrdist simulate`). See `asrdist.sim.engine`."""
from __future__ import annotations


def predict_frames_per_second(cfg, learners: int, seconds_per_frame: float, *, nodes: int = 1,
                              network: str = "loopback", network_cost: float = 0.0) -> float:
    """The simulator's job frames/s for run config `cfg` (model, strategy and its settings, global
    batch) on `learners` learners in `nodes` nodes, each learner computing `seconds_per_frame`
    (measured compute time per frame on this machine, as if one learner had all its cores; the
    learners of one machine share them). `network`: the link between nodes (loopback, 1gbit, ...);
    `network_cost`: CPU seconds a learner spends per byte it sends or receives (0: free)."""
    # the package stays light: `asrdist simulate --help` reads asrdist.sim.cluster's tables
    from asrdist.sim.scenario import simulate_config

    return simulate_config(cfg, learners, seconds_per_frame, nodes=nodes, network=network,
                           network_cost=network_cost).frames_per_second
