"""`asrdist bench NAME --json OUT`: every benchmark writes one JSON object.

Each benchmark is a module `asrdist.bench.<name>` with `add_arguments(parser)` and
`run(args) -> dict`; it may define `format_result(result) -> str` to print instead of the JSON, and
`JSON_REQUIRED = False` to make `--json` optional (only `compare`, whose output is a table).
Ratios are measured side by side in one run; the JSON also records the machine (cores, threads)
and, where communication is measured, the `network` used.
"""
from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from asrdist.commands import help_of

BENCHMARKS = {
    "data": "feature extraction speed and sampler supply rate",
    "trainer": "asrdist trainer frames/s vs a bare PyTorch loop",
    "comm": "1-bit vs fp32 gradient exchange on the 46M-parameter swbd shapes (bytes seen on the wire)",
    "scaling": "frames/s of 1, 2, 4 learners per strategy with compute emulation",
    "ngsgd": "NG-SGD step time vs plain SGD; averaging bytes per sample",
    "straggler": "time to a target loss with one learner 3x slower, sync vs adpsgd; delay-by-one (real training)",
    "compare": "strategies side by side (PER, frames/s, bytes): finished runs, or --train one per strategy",
    "simulator": "the scaling simulator against asrdist's own runs (1, 2, 4 learners, every strategy)",
    "peers": "asrdist sync, onebit, averaging beside torch DDP, DDP + PowerSGD (strategy ddp), PeriodicModelAverager",
    "faults": "a real train job losing learners: detection times (sync, hung), adpsgd survival by restarts",
    "seeds": "the source papers' claims (S1-S11) by real training on dedicated emulated hosts, each a check that can fail",
}


def register(sub: argparse._SubParsersAction, path: list[str] | None = None) -> None:
    """`path`: the command line's leading words (`bench straggler`); only the named benchmark's
    module is imported for its arguments (all of them when `path` is None: the full parser)."""
    p = sub.add_parser("bench", help=help_of("bench"))
    bsub = p.add_subparsers(dest="bench_name", required=True, metavar="NAME")
    chosen = path[1] if path is not None and len(path) > 1 else None
    for name, help_text in BENCHMARKS.items():
        b = bsub.add_parser(name, help=help_text)
        b.set_defaults(func=_run, bench_module=f"asrdist.bench.{name}")
        if path is None or name == chosen:
            module = importlib.import_module(f"asrdist.bench.{name}")
            required = getattr(module, "JSON_REQUIRED", True)
            b.add_argument("--json", type=Path, required=required,
                           help="output JSON file" if required else "also write the result as JSON")
            module.add_arguments(b)


def _run(args) -> int:
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.io.atomic import write_json_atomic
    from asrdist.utils.machine import machine_info

    module = importlib.import_module(args.bench_module)
    result = module.run(args)
    result.setdefault("machine", machine_info())
    if args.json is not None:
        write_json_atomic(args.json, result)
    print(module.format_result(result) if hasattr(module, "format_result") else json.dumps(result, indent=2))
    return 0
