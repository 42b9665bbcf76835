"""`asrdist simulate --validate`: the source documents' reported speeds and times against the
simulator's, with the relative error. One figure per paper at most is calibrated (marked), the
others are predicted.

Calibrations (each solved by bisection on the simulator itself):
- Seide et al. 2014: the 1-bit cost per value and pass, so that 8 K20X at minibatch 2880 run
  27 kfps (abstract); the K20X takes the V100's sustained share of its peak (assumption).
- IBM ICASSP 2019 (with its blog post): the V100's sustained FLOP/s, so that one V100 trains the
  job in about one week (blog: "about 1 week on 1 V100 GPU").
- IBM Interspeech 2019: nothing; predicted from the ICASSP 2019 V100 and the 100 Gbit/s link.
- IBM ICASSP 2020: the job's size (epochs), so that 64 V100 take 2.28 h (abstract).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from asrdist.sim.cluster import DEVICES, LINKS, MODELS, Cluster, Device, model_shapes, seconds_per_frame
from asrdist.sim.scenario import Job, Prediction, run_job, strategy_config

SWB300_FRAMES = 309 * 360_000
"""Seide 2014: 309 h of Switchboard (abstract) at 100 frames/s."""
SWB2000_FRAMES = 2000 * 360_000
"""IBM: the 2000-hour Switchboard (abstracts), at 100 frames/s."""
IBM_EPOCHS = 16
"""Assumption: epochs of the IBM ICASSP 2019 / Interspeech 2019 recipes (not in the seeds)."""
IBM_CHUNK = 21
IBM_BATCH = 2560 * IBM_CHUNK
"""IBM blog 2019: batch size enlarged up to 2,560 (chunks of 21 frames)."""
HADPSGD_BATCH = 3 * IBM_BATCH
"""IBM Interspeech 2019: ADPSGD converges with a batch 3x the one of synchronous SGD."""
V100_PEAK = 15.7e12
ONE_WEEK = 7 * 24 * 3600.0


@dataclass
class Case:
    paper: str
    what: str
    reported: float
    unit: str
    job: Callable[[dict], Job]
    measure: str = "job_hours"
    """job_hours | frames_per_second | speedup"""
    calibrated: bool = False

    def value(self, p: Prediction) -> float:
        return {"job_hours": p.job_seconds / 3600, "frames_per_second": p.frames_per_second,
                "speedup": p.speedup}[self.measure]


def _lstm_shapes():
    m = MODELS["ibm-lstm"]
    return model_shapes(m["model"], m["feature_dim"], m["num_classes"])


def _swbd_shapes():
    m = MODELS["swbd"]
    return model_shapes(m["model"], m["feature_dim"], m["num_classes"])


def _parameters(shapes) -> int:
    import math

    return sum(math.prod(s) for s in shapes)


def _ibm_job(k: dict, strategy: str, settings: dict, nodes: int, per_node: int, device: str, between: str,
             batch: int, epochs: float) -> Job:
    shapes = k["lstm"]
    dev: Device = k["devices"][device]
    cluster = Cluster(nodes, per_node, LINKS["nvlink"], LINKS[between])
    return Job(strategy, strategy_config(strategy, settings), shapes, cluster, batch,
               seconds_per_frame(dev, _parameters(shapes)), step_overhead=dev.step_overhead,
               frames_per_epoch=SWB2000_FRAMES, epochs=epochs, steps=12)


def _seide_job(k: dict, batch: int) -> Job:
    shapes = k["swbd"]
    return Job("onebit", strategy_config("onebit", {"double_buffering": True}), shapes,
               Cluster(1, 8, LINKS["pcie"], LINKS["pcie"]), batch, seconds_per_frame(k["devices"]["k20x"],
                                                                                     _parameters(shapes)),
               quantize_cost=k["quantize_cost"], frames_per_epoch=SWB300_FRAMES, epochs=7, steps=12)


CASES = [
    Case("Seide 2014", "1-bit SGD, 8 K20X, minibatch 2880: frames/s", 27_000, "frames/s",
         lambda k: _seide_job(k, 2880), "frames_per_second", calibrated=True),
    Case("Seide 2014", "1-bit SGD, 8 K20X, minibatch 2880: speed-up", 3.6, "x", lambda k: _seide_job(k, 2880),
         "speedup"),
    Case("Seide 2014", "1-bit SGD, 8 K20X, minibatch 16k: frames/s", 51_000, "frames/s",
         lambda k: _seide_job(k, 16384), "frames_per_second"),
    Case("Seide 2014", "1-bit SGD, 8 K20X, minibatch 16k: speed-up", 6.3, "x", lambda k: _seide_job(k, 16384),
         "speedup"),
    Case("IBM ICASSP 2019", "ADPSGD, 16 P100 (4x4): job", 14.0, "h",
         lambda k: _ibm_job(k, "adpsgd", {}, 4, 4, "p100", "infiniband", IBM_BATCH, IBM_EPOCHS)),
    Case("IBM ICASSP 2019", "HYBRID, 32 V100 (8x4): job", 11.5, "h",
         lambda k: _ibm_job(k, "hybrid", {"sync_epochs": 1}, 8, 4, "v100", "infiniband", IBM_BATCH, IBM_EPOCHS)),
    Case("IBM ICASSP 2019", "HYBRID, 32 V100 (8x4): speed-up over 1 V100", 15.0, "x",
         lambda k: _ibm_job(k, "hybrid", {"sync_epochs": 1}, 8, 4, "v100", "infiniband", IBM_BATCH, IBM_EPOCHS),
         "speedup"),
    Case("IBM Interspeech 2019", "H-ADPSGD, 64 V100 (16x4), 100 Gbit/s Ethernet: job", 5.2, "h",
         lambda k: _ibm_job(k, "hierarchical", {}, 16, 4, "v100", "100gbit", HADPSGD_BATCH, IBM_EPOCHS)),
    Case("IBM ICASSP 2020", "ADPSGD delay-by-one, 64 V100 (16x4): job", 2.28, "h",
         lambda k: _ibm_job(k, "adpsgd", {"delay_by_one": True, "pattern": "random"}, 16, 4, "v100",
                            "infiniband", HADPSGD_BATCH, k["icassp2020_epochs"]), calibrated=True),
    Case("IBM ICASSP 2020", "ADPSGD delay-by-one, 128 V100 (32x4): job", 1.98, "h",
         lambda k: _ibm_job(k, "adpsgd", {"delay_by_one": True, "pattern": "random"}, 32, 4, "v100",
                            "infiniband", HADPSGD_BATCH, k["icassp2020_epochs"])),
]


def _bisect(f: Callable[[float], float], target: float, lo: float, hi: float, iters: int = 30) -> float:
    """x in [lo, hi] with f(x) = target, f monotone (geometric bisection)."""
    flo = f(lo)
    for _ in range(iters):
        mid = (lo * hi) ** 0.5
        if (f(mid) - target) * (flo - target) > 0:
            lo, flo = mid, f(mid)
        else:
            hi = mid
    return (lo * hi) ** 0.5


def calibrate() -> dict:
    """The knobs of the module docstring, solved in order."""
    k = {"swbd": _swbd_shapes(), "lstm": _lstm_shapes(), "quantize_cost": 1e-9, "icassp2020_epochs": IBM_EPOCHS}
    params = _parameters(k["lstm"])
    v100 = DEVICES["v100"]
    # one V100 trains IBM_EPOCHS of SWB2000 in a week: frames/s = 1 / (spf + overhead / batch)
    fps1 = IBM_EPOCHS * SWB2000_FRAMES / ONE_WEEK
    spf = 1 / fps1 - v100.step_overhead / IBM_BATCH
    share = 6.0 * params / spf / V100_PEAK
    k["devices"] = {
        "v100": dataclasses.replace(v100, flops=share * V100_PEAK),
        "p100": dataclasses.replace(DEVICES["p100"], flops=share * 10.6e12),
        "k20x": dataclasses.replace(DEVICES["k20x"], flops=share * 3.95e12),
    }
    k["sustained_share"] = share

    def seide(q: float) -> float:
        return run_job(_seide_job({**k, "quantize_cost": q}, 2880)).frames_per_second

    k["quantize_cost"] = _bisect(seide, 27_000, 1e-12, 1e-8)

    def icassp2020(epochs: float) -> float:
        return CASES[8].value(run_job(CASES[8].job({**k, "icassp2020_epochs": epochs})))

    k["icassp2020_epochs"] = _bisect(icassp2020, 2.28, 0.5, 64, iters=20)
    return k


def validate() -> dict:
    """Every case: reported, simulated, relative error; and the calibrated values."""
    k = calibrate()
    rows = []
    for case in CASES:
        p = run_job(case.job(k))
        simulated = case.value(p)
        rows.append({"paper": case.paper, "case": case.what, "reported": case.reported, "unit": case.unit,
                     "simulated": simulated, "relative_error": (simulated - case.reported) / case.reported,
                     "calibrated": case.calibrated})
    predicted = [abs(r["relative_error"]) for r in rows if not r["calibrated"]]
    return {"rows": rows, "max_relative_error_predicted": max(predicted),
            "calibration": {"v100_sustained_share_of_peak": k["sustained_share"],
                            "onebit_seconds_per_value_and_pass": k["quantize_cost"],
                            "icassp2020_epochs": k["icassp2020_epochs"]},
            "target": 0.25}


def format_table(result: dict) -> str:
    lines = ["| paper | case | reported | simulated | error |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        mark = " (calibrated)" if r["calibrated"] else ""
        lines.append(f"| {r['paper']} | {r['case']}{mark} | {r['reported']:,.4g} {r['unit']} | "
                     f"{r['simulated']:,.4g} {r['unit']} | {100 * r['relative_error']:+.1f}% |")
    c = result["calibration"]
    lines.append(f"\ncalibrated: V100/P100/K20X sustained share of peak {c['v100_sustained_share_of_peak']:.3f}; "
                 f"1-bit cost {c['onebit_seconds_per_value_and_pass'] * 1e9:.3f} ns per value and pass; "
                 f"ICASSP 2020 job {c['icassp2020_epochs']:.2f} epochs. Largest error of the predicted rows: "
                 f"{100 * result['max_relative_error_predicted']:.1f}% (target 25%)")
    return "\n".join(lines)
