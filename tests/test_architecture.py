"""Architecture rules of DESIGN.md, enforced: purity of modules and the public API."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import EXAMPLE, ROOT, synthetic_experiment

PURE = [
    "workloads.schedules", "workloads.costs", "workloads.lowering", "workloads.models",
    "workloads.program", "topologies.graphs", "topologies.cluster", "topologies.presets",
    "topologies.placement", "topologies.hardware", "topologies.config", "topologies.build",
    "sim.collectives", "sim.channels", "sim.network",
    "sim.stats", "sim.export", "sim.device", "sim.config", "sim.experiment", "sim.timeline",
    "workloads.multistep", "sim.idle", "sim.faults", "sim.faults_config", "workloads.seqchunks",
    "workloads.memory", "workloads.registry", "base.errors", "base.outputs", "base.schema",
    "base.collector",
    "workloads.registry",
]


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_neither_simpy_nor_matplotlib(module: str) -> None:
    code = (f"import sys, {module}; bad = [m for m in ('simpy', 'matplotlib') if m in sys.modules];"
            " print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout.strip()
    assert out == "", f"{module} pulls in {out}"


def test_only_the_engine_imports_simpy_and_only_plots_matplotlib() -> None:
    for path in ROOT.glob("*/**/*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("tests/", "benchmarks/", ".")):
            continue
        text = path.read_text()
        if "import simpy" in text:
            assert rel == "sim/engine.py", rel
        if "import matplotlib" in text or "from matplotlib" in text:
            assert rel.startswith("plots/"), rel


def test_python_api_load_change_simulate() -> None:
    from sim import load_experiment, simulate

    exp = load_experiment(EXAMPLE)
    base = simulate(exp)
    gpipe = simulate(exp.with_changes({"schedule": "gpipe"}))
    assert gpipe.stats["step_time_s"] >= base.stats["step_time_s"] * 0.999
    # GPipe stashes all 16 micro-batches on every stage; 1F1B at most 4 on stage 0
    assert gpipe.stats["peak_memory_gib"] > base.stats["peak_memory_gib"]
    two_stage = exp.with_changes({"parallel.pp": 2, "parallel.dp": 4})
    assert two_stage.placement.degree("dp") == 4
    assert two_stage.num_microbatches == 8
    # the original is unchanged
    assert exp.placement.degree("pp") == 4


def test_from_dict_round_trip_and_derived_dp() -> None:
    from sim.experiment import build_experiment

    data = synthetic_experiment(4, 8)
    exp = build_experiment(data)
    assert exp.placement.degree("dp") == 1
    assert exp.num_microbatches == 8
    assert exp.tokens_per_step is None
