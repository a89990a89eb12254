"""Instructions the engine's run alone executes, under callgrind (a load-proof measure of its CPU).

GPT-3 175B, TP 8 PP 8 DP ``GPUS / 64``, 16 micro-batches per pipeline, full fidelity (the
shape of ``benchmarks/scale.py``'s ``175b-4096-full``). The lowering runs uninstrumented; at
:func:`sim.engine.simulate_program`'s call the script switches callgrind's instrumentation on
(``callgrind_control -i on``) and ends the process at its return, so callgrind's ``Collected``
is the engine's run (the DAG, the event loop, the summaries)::

    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/engine.out \\
        "$(python -c 'import sys; print(sys.executable)')" benchmarks/engine_ir.py 512

(the interpreter's own binary: a pyenv shim is a shell script, whose ``exec`` valgrind does not
follow). It prints the engine's events and flows on stderr; at 512 GPUs the run takes ~10
minutes of CPU under callgrind.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    from sim import api
    from sim.engine import EngineCounters, simulate_program
    from sim.experiment import Experiment

    gpus = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    dp = gpus // 64
    exp = Experiment.from_dict({
        "name": "engine-ir", "model": {"preset": "gpt3-175b"},
        "cluster": {"preset": "dgx-a100-80g", "num_gpus": gpus},
        "parallel": {"tp": 8, "pp": 8, "dp": dp, "vpp": 1, "zero_stage": 1},
        "training": {"micro_batch_size": 1, "global_batch_size": 16 * dp}, "schedule": "1f1b"})

    def instrumented(*args: object, **kwargs: object) -> None:
        subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())],
                       capture_output=True, check=False)
        counters = EngineCounters()
        simulate_program(*args, counters=counters, **kwargs)  # type: ignore[arg-type]
        print("events", counters.events, "flows", counters.flows, file=sys.stderr)
        sys.stderr.flush()
        os._exit(0)  # the count ends with the engine's run

    api.simulate_program = instrumented  # type: ignore[assignment]
    api.simulate(exp, fidelity="full")


if __name__ == "__main__":
    main()
