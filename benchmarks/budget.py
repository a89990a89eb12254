"""Benchmark: memory per lowered instruction of a full-fidelity run, per representation.

:mod:`sim.budget` refuses (or, under ``fidelity: auto``, collapses) a run whose lowered
program would not fit in :data:`sim.budget.MAX_PROGRAM_BYTES`, charging each estimated
instruction the bytes its representation takes through the simulation
(``sim/data/budget.toml``). This script measures those bytes: each case runs in a fresh
subprocess, which simulates a small warm-up run (:data:`WARM_UP`), builds the experiment,
notes its resident memory after a garbage collection (``VmRSS`` of ``/proc/self/status``;
its peak, ``VmHWM``, is reset there: ``/proc/self/clear_refs``), runs
:func:`sim.api.simulate` and reads the peak; the row is (peak - before) / estimated
instructions (:meth:`sim.budget.Estimate.instructions`). The memory of the experiment
itself (cluster graph, routing, schedule) is not the program's and is left out.

Representations (:meth:`sim.budget.Estimate.representation`; ZeRO-3 across replicas is
charged apart, :data:`sim.budget.ZERO3_BYTES_PER_INSTRUCTION`):

- ``packed``: one full-fidelity step (:class:`workloads.packed.PackedBuilder`'s columns);
- ``tuples``: the program as named tuples: more than one step (``--steps``, and the
  schedules whose steps overlap, run three steps: :func:`workloads.multistep.repeat_program`
  copies the step into a list), the reference path, the jobs of a shared cluster
  (:mod:`sim.jobs` merges them into one list) and every collapsed program.

Run ``python benchmarks/budget.py`` (every case, a few minutes) or ``--only 175b-256,...``.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from scale import A100, GPT_175B, LLAMA_7B, Case  # noqa: E402

GPT_13B_128 = {"preset": "gpt3-1.3b", "seq_length": 2048}

CASES: dict[str, tuple[Case, int, dict]] = {
    # one step: packed
    "175b-256": (Case("175b-256", GPT_175B, A100, 256, 8, 8, 4, 32, "full"), 1, {}),
    "175b-512": (Case("175b-512", GPT_175B, A100, 512, 8, 8, 8, 64, "full"), 1, {}),
    "175b-1024": (Case("175b-1024", GPT_175B, A100, 1024, 8, 8, 16, 128, "full"), 1, {}),
    "175b-4096": (Case("175b-4096", GPT_175B, A100, 4096, 8, 8, 64, 1024, "full"), 1, {}),
    "7b-1024": (Case("7b-1024", LLAMA_7B, A100, 1024, 2, 4, 128, 1024, "full"), 1, {}),
    "1.3b-128": (Case("1.3b-128", GPT_13B_128, A100, 128, 2, 4, 16, 256, "full"), 1, {}),
    "1.3b-128-overlap": (Case("1.3b-128-overlap", GPT_13B_128, A100, 128, 2, 4, 16, 256,
                              "full"), 1, {"parallel": {"overlap_grad_reduce": True}}),
    "1.3b-128-local-sgd": (Case("1.3b-128-local-sgd", GPT_13B_128, A100, 128, 2, 4, 16, 512,
                                "full"), 1, {"parallel": {"zero_stage": 0},
                                             "training": {"sync_every": 4}}),
    "1.3b-128-zero3": (Case("1.3b-128-zero3", GPT_13B_128, A100, 128, 2, 4, 16, 512, "full"),
                       1, {"parallel": {"zero_stage": 3}}),
    # several steps: named tuples
    "175b-256-x3": (Case("175b-256-x3", GPT_175B, A100, 256, 8, 8, 4, 32, "full"), 3, {}),
    "175b-512-x2": (Case("175b-512-x2", GPT_175B, A100, 512, 8, 8, 8, 64, "full"), 2, {}),
    "175b-1024-x2": (Case("175b-1024-x2", GPT_175B, A100, 1024, 8, 8, 16, 128, "full"), 2, {}),
    "175b-1024-x4": (Case("175b-1024-x4", GPT_175B, A100, 1024, 8, 8, 16, 128, "full"), 4, {}),
    "7b-256-zb-x3": (Case("7b-256-zb-x3", LLAMA_7B, A100, 256, 2, 4, 32, 256, "full",
                          "zb-v", 2), 3, {}),
    "1.3b-128-m8-x2": (Case("1.3b-128-m8-x2", GPT_13B_128, A100, 128, 2, 4, 16, 128, "full"), 2,
                       {}),
    "1.3b-128-x2": (Case("1.3b-128-x2", GPT_13B_128, A100, 128, 2, 4, 16, 512, "full"), 2, {}),
    "1.3b-128-local-sgd-x2": (Case("1.3b-128-local-sgd-x2", GPT_13B_128, A100, 128, 2, 4, 16,
                                   256, "full"), 2, {"parallel": {"zero_stage": 0},
                                                     "training": {"sync_every": 4}}),
    "1.3b-128-zero3-x2": (Case("1.3b-128-zero3-x2", GPT_13B_128, A100, 128, 2, 4, 16, 256,
                               "full"), 2, {"parallel": {"zero_stage": 3}}),
}
"""Name: (the experiment, steps, its keys changed per section). ``1.3b-128-local-sgd``: local
SGD simulates a step without DP communication beside the step, copied as named tuples.
``7b-256-zb-x3``: ZB-V's steps overlap, so a run of it takes three steps without
``--steps``."""

WARM_UP = {"name": "warm-up", "model": {"preset": "gpt3-1.3b", "num_layers": 2},
           "cluster": {"preset": A100, "num_gpus": 16}, "parallel": {"tp": 2, "pp": 2, "dp": 4},
           "training": {"micro_batch_size": 1, "global_batch_size": 8}}
"""Simulated (one step, then two) before a case is measured, so that the modules a run
imports on first use and its caches are not counted as the case's."""


def _status_bytes(field: str) -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (its peak) of this process, in bytes: of this
    process's own memory (``getrusage``'s peak would also count the RSS of the process that
    started it, whose memory this one replaced at ``exec``)."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def run_case(case: Case, steps: int, changes: dict) -> dict:
    """Build and simulate ``case`` for ``steps`` steps in this process; the row."""
    from sim import api, budget
    from sim.experiment import Experiment

    for n in (1, 2):
        api.simulate(Experiment.from_dict(WARM_UP), fidelity="full", steps=n)
    data = case.experiment()
    for section, keys in changes.items():
        data[section].update(keys)
    exp = Experiment.from_dict(data)
    work = budget.estimate(exp, steps)
    gc.collect()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")  # the peak (VmHWM) from here
    before = _status_bytes("VmRSS")
    result = api.simulate(exp, fidelity=case.fidelity, steps=steps)
    peak = _status_bytes("VmHWM")
    estimated = work.instructions(case.fidelity)[0]
    return {"case": case.name, "steps": steps,
            "representation": work.representation(case.fidelity) + (" zero3" * work.zero3)
            + (" +copy" * work.copies), "charge": work.charge(case.fidelity),
            "estimated": estimated, "lowered": len(result.program.instructions),
            "before_mib": before / 2**20, "peak_mib": peak / 2**20,
            "bytes_per_instruction": (peak - before) / estimated}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--only", help="comma-separated case names")
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(*CASES[args.case])))
        return
    print(f"{'case':<21} {'steps':>5} {'repr':<13} {'estimated':>10} {'lowered':>10} "
          f"{'before MiB':>10} {'peak MiB':>9} {'B/instr':>8} {'charged':>8}", flush=True)
    for name in args.only.split(",") if args.only else CASES:
        out = subprocess.run([sys.executable, __file__, "--case", name], capture_output=True,
                             text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['case']:<21} {r['steps']:>5} {r['representation']:<13} "
              f"{r['estimated']:>10,.0f} {r['lowered']:>10,} {r['before_mib']:>10.0f} "
              f"{r['peak_mib']:>9.0f} {r['bytes_per_instruction']:>8.0f} "
              f"{r['charge']:>8}", flush=True)


if __name__ == "__main__":
    main()
