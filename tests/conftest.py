"""Shared test helpers."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "workloads" / "examples" / "gpt-1.3b-pp4.yaml"

SMALL_EXPERIMENT = {
    "name": "t",
    "model": {"preset": "gpt3-1.3b", "seq_length": 2048},
    "cluster": {"preset": "dgx-a100-80g", "num_gpus": 16},
    "parallel": {"tp": 2, "pp": 4, "dp": 2},
    "training": {"micro_batch_size": 2, "global_batch_size": 64},
}
"""A small valid experiment the bad-input tests break one key at a time (copy it first)."""


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``sim ARGV`` in process through :func:`sim.cli.main`: exit status, stdout, stderr."""
    from sim.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            rc = int(exc.code or 0)
    return rc, out.getvalue(), err.getvalue()


def synthetic_experiment(p: int, m: int, schedule: str = "1f1b", *, forward_ms: float = 1.0,
                         backward_ms: float = 2.0, weight_grad_ms: float = 0.0,
                         activation_MB: float = 0.0, vpp: int = 1, preset: str = "ideal") -> dict:
    """An experiment mapping with the synthetic model on the ideal cluster (dp = 1)."""
    return {
        "name": f"synthetic-p{p}-m{m}",
        "model": {"synthetic": {"forward_ms": forward_ms, "backward_ms": backward_ms,
                                "weight_grad_ms": weight_grad_ms,
                                "activation_MB": activation_MB}},
        "cluster": {"preset": preset, "num_gpus": p},
        "parallel": {"pp": p, "vpp": vpp},
        "training": {"global_batch_size": m},
        "schedule": schedule,
    }


def assert_golden(path: Path, text: str) -> None:
    """``text`` equals the golden file at ``path``; ``UPDATE_GOLDEN=1`` rewrites it first."""
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing {path}; run with UPDATE_GOLDEN=1 to create it"
    assert path.read_text() == text


def check_structure(s) -> None:
    """A schedule's structure checked as ``validate()`` checks it, in linear time (every op
    once, each rank running its own stages, the required ops and no other), plus the
    deadlock check (``list_schedule`` raises ScheduleError). ``validate`` itself is
    quadratic in the op count on a full grid (it rebuilds ``set(need)`` per op)."""
    from collections import Counter

    from workloads.schedules import list_schedule, required_ops

    seen = Counter(op for ops in s.rank_ops for op in ops)
    assert all(c == 1 for c in seen.values()), [op for op, c in seen.items() if c > 1]
    for r, ops in enumerate(s.rank_ops):
        assert all(s.stage_rank[op.stage] == r for op in ops), f"rank {r} runs a foreign stage"
    need = required_ops(s.num_stages, s.num_microbatches, s.split_backward, s.seq_chunks)
    assert set(seen) == set(need)
    list_schedule(s, lambda op: 1.0)


def assert_golden_grid(s, path: Path, seq_chunks: bool = False) -> None:
    """Schedule ``s``'s grid, under a header naming it (with its sequence chunks ``k`` where
    ``seq_chunks``), equals the golden file at ``path`` (:func:`assert_golden`), and that
    file, a valid custom schedule file, parses back to the same order, fused groups and
    sequence chunks."""
    from workloads.schedules import from_text

    k = f"k={s.seq_chunks} " if seq_chunks else ""
    assert_golden(path, f"# {s.name} p={s.num_ranks} m={s.num_microbatches} "
                        f"v={s.chunks_per_rank} {k}stages={list(s.stage_rank)}\n{s.grid()}\n")
    parsed = from_text(path.read_text(), s.num_microbatches)
    assert parsed.rank_ops == s.rank_ops and parsed.stage_rank == s.stage_rank
    assert parsed.fused == s.fused and parsed.seq_chunks == s.seq_chunks


def load_benchmark(name: str) -> ModuleType:
    """A fresh copy of ``benchmarks/<name>.py`` (benchmarks is not a package), registered in
    ``sys.modules`` so that its dataclasses resolve their annotations."""
    path = ROOT / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def segment_timer(exp):
    """``compute_s(seg)``: a cost segment's time on ``exp``'s GPU with its default device
    profile, as the lowering times it (a segment with a fixed duration takes that)."""
    from sim.calibration import default_profile
    from sim.device import compute_time_s

    profile = default_profile(exp.cluster.gpu.name)

    def compute_s(seg) -> float:
        if seg.duration_s is not None:
            return seg.duration_s
        return compute_time_s(exp.cluster.gpu, profile, seg.flops, seg.hbm_bytes,
                              seg.attn_flops, seg.elementwise_bytes,
                              exp.config.training.attention, seg.gemm_dims)
    return compute_s


@contextlib.contextmanager
def engine_switch(name: str, on: bool) -> Iterator[None]:
    """The engine's fast path ``name`` (a switch on :class:`sim.engine._Run`: ``sends``,
    ``share_plans``, ``memo_work``) on or off for the block, on again after it."""
    from sim import engine

    setattr(engine._Run, name, on)
    try:
        yield
    finally:
        setattr(engine._Run, name, True)


def observed_full_run(exp, changes: list, stepping: bool = True, rows: bool = True) -> tuple:
    """``exp`` at full fidelity with the engine's stepping (blocks of TP lanes) and rows (the
    DP replicas' blocks as one) switched on or off: what the run shows (``stats.json``, the
    timeline's records), what it computes (every instruction's three times, bit for bit), its
    counters, and how it ran (instructions stepped in blocks, blocks stepped in rows)."""
    from array import array
    from functools import partial

    from sim import api, engine

    times, counters = engine.InstructionTimes(), engine.EngineCounters()
    saved = api.simulate_program
    api.simulate_program = partial(saved, counters=counters, times=times)
    engine._Run.stepping, engine._Run.rows = stepping, rows
    try:
        result = api.simulate(exp, fidelity="full", link_changes=changes)
    finally:
        api.simulate_program = saved
        engine._Run.stepping = engine._Run.rows = True
    shown = (api.stats_json(result.stats),) + tuple(
        getattr(result.timeline, what)
        for what in ("spans", "flows", "memory", "collectives", "peak_memory_by_gpu"))
    computed = tuple(array("d", values).tobytes()
                     for values in (times.ready_s, times.end_s, times.mid_s))
    count = (counters.events, counters.instructions, counters.flows,
             counters.rate_recomputations, counters.rerated_flows,
             list(counters.bytes_on_link.items()))
    return shown, computed, count, (counters.stepped, counters.rows)


def frameworks_toml_variants(section: str, field: str, value: str) -> tuple[str, str]:
    """workloads/frameworks.toml with ``field = value`` in profile ``[section]`` instead of
    its own line, and the same text with that field's ``_source`` renamed away: the two
    malformed tables the profile loader must refuse."""
    from importlib.resources import files

    text = files("workloads").joinpath("frameworks.toml").read_text(encoding="utf-8")
    head, rest = text.split(f"[{section}]", 1)
    lines = [f"{field} = {value}" if line.startswith(f"{field} =") else line
             for line in rest.splitlines()]
    no_source = rest.replace(f"{field}_source =", f"{field}_note =")
    return (head + f"[{section}]" + "\n".join(lines), head + f"[{section}]" + no_source)
