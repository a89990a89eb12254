"""benchmarks/memory_breakdown.py against the simulator, the terms docs/memory-gaps.md quotes
for Llama 3 405B, and the sweep rows that contradict each other (sim.validate.contradicted)."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from sim.api import simulate
from sim.calibration import default_profile
from sim.corpus import CORPUS_DIR, load_source
from sim.experiment import build_experiment
from sim.validate import (
    Prediction,
    Row,
    contradicted,
    contradicted_ran,
    load_rows,
    sweep_source_report,
)
from tests.conftest import load_benchmark

GiB = 2**30
SWEEP = CORPUS_DIR / "hagemann2023_sweep.csv"
LLAMA3 = CORPUS_DIR / "dubey2024_llama3_405b.csv"


@pytest.fixture(scope="module")
def mb():
    return load_benchmark("memory_breakdown")


def _small_llama3() -> dict:
    """Meta's stack on 32 H100: interleaved TP2 PP2 V2, all-gather CP2, ZeRO-2 reducing every
    micro-batch, so that every term of the breakdown is non-zero somewhere."""
    return {"name": "small-llama3",
            "model": {"preset": "llama2-7b", "num_layers": 6, "seq_length": 2048},
            "cluster": {"preset": "dgx-h100", "num_gpus": 32},
            "parallel": {"tp": 2, "pp": 2, "dp": 4, "cp": 2, "vpp": 2, "zero_stage": 2,
                         "sequence_parallel": True},
            "training": {"micro_batch_size": 1, "global_batch_size": 32,
                         "framework": "llama3"},
            "schedule": "interleaved"}


@pytest.mark.parametrize("case", ["small-llama3", "sweep-846", "sweep-0"])
def test_breakdown_is_the_simulators_peak(mb, case):
    """Each pipeline rank's peak, summed from its terms, is what simulate reports for it."""
    if case == "small-llama3":
        data = _small_llama3()
    else:
        data = load_rows(SWEEP)[int(case.split("-")[1])].experiment()
    exp = build_experiment(data)
    stats = simulate(exp, default_profile(exp.cluster.gpu.name), fidelity="collapsed").stats
    ranks = mb.breakdown(exp)
    assert [m.peak / GiB for m in ranks] == pytest.approx(stats["peak_memory_per_stage_gib"],
                                                          rel=1e-9)
    if case == "small-llama3":  # the terms it splits the working memory into all appear
        assert any(m.unreduced_grads > 0 for m in ranks)
        assert any(m.cp_kv > 0 for m in ranks)
        assert all(m.zero3_gathered == 0 for m in ranks)
        assert all(m.fragmentation == pytest.approx(0.24) for m in ranks)


def _llama3(mb, run: str):
    row = next(r for r in load_source(LLAMA3).rows if r.run == run)
    return mb.breakdown(build_experiment(row.experiment()))


def test_llama3_405b_terms_as_documented(mb):
    """docs/memory-gaps.md: pipeline rank 1 holds 141 one-layer stashes of 0.496 GiB at 8K
    tokens with 32 micro-batches (2(p - 2) + (V - 1)N + 1, N = p = 16) and all its 128 forwards
    with 16; with everything but the allocator's overhead the 8,192-GPU layout is already over
    an H100's 79.11 GiB (its measured total, gpus.toml), the 16,384-GPU ones under it by at
    most 8.8% of their dynamic memory (9.1% against the A100 fraction's 79.3 GiB it had before
    issue 19; 9.9% with the former constant 1 GiB reserved; the run's is 1.53-1.57 GiB on rank
    1, sim/reserved.py)."""
    layer = 0.49609375 * GiB
    for run, count, fits_before_allocator in (("llama3-405b-8192gpu-cp1", 141, False),
                                              ("llama3-405b-16384gpu-cp1", 128, True),
                                              ("llama3-405b-16384gpu-cp16", 128, True)):
        ranks = _llama3(mb, run)
        top = max(ranks, key=lambda m: m.peak)
        assert top.rank == 1
        assert [(n, b) for _, n, b in top.in_flight if n] and all(
            b == pytest.approx(layer) for _, n, b in top.in_flight if n)
        assert sum(n for _, n, _ in top.in_flight) == count
        before = top.static + top.dynamic + top.reserved
        assert (before <= top.capacity) is fits_before_allocator
        if fits_before_allocator:  # the overhead it would take: under expandable segments'
            assert 0.085 < (top.capacity - before) / top.dynamic < 0.092


def test_llama3_405b_stash_is_the_tensors_megatron_core_keeps(mb):
    """docs/accuracy.md, "Llama 3 405B memory, seventh pass": the one-layer stash the memory
    model charges the rows is, tensor by tensor, what Megatron-core with Transformer Engine
    keeps for the backward of a Llama block under TP 8 with SP and FlashAttention (TE's
    LayerNormLinear: the norm's input and its output at s/t, re-gathered for the weight
    gradient; flash: Q, K, V and the output; the fused SwiGLU: the fc1 output's gate and up
    halves, fc2 its product), none of which a backward can do without; and even the least
    allocator overhead the sweep's OOM labels allow at 95% accuracy (0.20) leaves the three
    rows' fullest rank over the capacity."""
    s, h, f, t, kv = 8192, 16384, 53248, 8, 8 * 128
    kept = {"attention norm input": s * h / t, "QKV input (norm output)": s * h / t,
            "Q": s * h / t, "K": s * kv / t, "V": s * kv / t, "attention output": s * h / t,
            "MLP norm input": s * h / t, "fc1 input (norm output)": s * h / t,
            "gate and up": 2 * s * f / t, "SwiGLU product (fc2 input)": s * f / t}
    layer = 2 * sum(kept.values())  # bf16
    assert layer == 508 * 2**20 == 0.49609375 * GiB
    for run in ("llama3-405b-8192gpu-cp1", "llama3-405b-16384gpu-cp1",
                "llama3-405b-16384gpu-cp16"):
        top = max(_llama3(mb, run), key=lambda m: m.peak)
        assert all(b == pytest.approx(layer) for _, n, b in top.in_flight if n)
        assert top.fragmentation == pytest.approx(0.24)
        assert top.static + top.dynamic * 1.20 + top.reserved > 1.08 * top.capacity



def test_nemo_launcher_5b_terms_as_documented(mb):
    """docs/memory-gaps.md, "NeMo-Megatron-Launcher 2022": GPT-3 5B (5,047,558,144 parameters)
    as the launcher's 5b.yaml at a2b2f83 configures it (TP 1) keeps bf16 weights and apex's
    whole fp32 gradient buffer (6 bytes a parameter) beside 12 / DP of Adam shards, 24 layers
    of 34 sbh + 5 a s^2 b and 1.92 GiB of loss buffers at the last forward; the 8-GPU run is
    over the A100's 79.3 GiB before any allocator overhead, the 16-256-GPU ones under it by
    3.8-11.2% of their dynamic memory (4.3-11.7% with the former constant 1 GiB reserved; the
    run's, sim/reserved.py, is 1.18 GiB here: an eagerly loaded context, NCCL's buffers). The
    shipped rows take the README's TP 2 instead (docs/accuracy.md, "The 5B memory"); this is
    the config file's TP 1 built from them."""
    n = 5_047_558_144
    layers = 24 * (34 + 5 * 32 * 2048 / 4096) * 2048 * 2 * 4096
    loss = 10 * 2048 * 2 * 50304  # bf16 logits, their fp32 copy, the shifted fp32 copy
    source = load_source(CORPUS_DIR / "nemo_megatron_launcher2022.csv")
    for dp, room in ((8, None), (16, 0.0384), (32, 0.0779), (64, 0.0976), (128, 0.1075),
                     (256, 0.1124)):
        row = next(r for r in source.rows if r.run == f"gpt3-5b-{dp}gpu")
        data = row.experiment()
        assert (data["parallel"]["tp"], data["parallel"]["dp"]) == (2, dp // 2)
        (shipped,) = mb.breakdown(build_experiment(data))
        assert shipped.static + shipped.dynamic + shipped.reserved < shipped.capacity
        data["parallel"] |= {"tp": 1, "dp": dp}
        data["model"]["vocab_size"] = 50304  # 50,257 padded to a multiple of 128 x TP 1
        (m,) = mb.breakdown(build_experiment(data))
        assert m.static == pytest.approx(6 * n + 12 * n / dp, rel=1e-3)
        assert m.dynamic == pytest.approx(layers + loss, rel=1e-6)
        before = m.static + m.dynamic + m.reserved
        if room is None:
            assert before > m.capacity
        else:
            assert (m.capacity - before) / m.dynamic == pytest.approx(room, abs=0.001)


@pytest.mark.parametrize("case", ["small-llama3", "sweep-0"])
def test_split_points_add_up_to_the_breakdown(mb, case):
    """The stash and the working memory apart, at every moment an op starts: their largest sum
    is the breakdown's dynamic memory at the peak, on every pipeline rank."""
    data = _small_llama3() if case == "small-llama3" else load_rows(SWEEP)[0].experiment()
    exp = build_experiment(data)
    for m, (static, stash, work) in zip(mb.breakdown(exp), mb.split_points(exp), strict=True):
        assert static == pytest.approx(m.static)
        assert float(np.max(stash + work)) == pytest.approx(m.dynamic, rel=1e-12)


def test_no_split_of_the_allocator_overhead_passes_sweep_rows_0_and_1(mb):
    """docs/memory-gaps.md, "Where the allocator overhead falls": with the shipped 0.24 on
    both the scan gives sim validate's 96.2% (96.4% with the former constant 1 GiB reserved;
    each run's own now, sim/reserved.py: rows 516 and 517, out of memory, drop to 78.8 GiB)
    and flags rows 0, 1, 846 and 851; every overhead on the stash and on the working memory
    apart, and every constant beside a fraction of the dynamic memory, that keeps the sweep's
    OOM accuracy at 95% or more flags rows 0 and 1, but one: 0.08 on the stash and 0.75 on
    the working memory (95.02%, since reserved memory is each run's own) passes them and flags
    seven other runs that ran (50, 51, 52, 130, 234, 256, 501): no split flags fewer."""
    from sim import reserved as resv
    from sim.gpu_profiles import generation_of
    from topologies.hardware import GPUS
    from topologies.presets import SERVERS

    capacity = GPUS[SERVERS["dgx-a100-80g"].gpu].hbm_capacity_bytes
    rows = [r for r in load_rows(SWEEP) if r.status in ("ok", "oom")]
    exps = [build_experiment(r.experiment()) for r in rows]
    points = [mb.split_points(exp) for exp in exps]
    reserved = [resv.per_stage(exp, generation_of) for exp in exps]
    statuses = [r.status for r in rows]

    def verdicts(stash, work, const):
        acc, false, _ = mb.split_verdicts(points, statuses, stash, work, const, reserved,
                                          capacity)
        return acc, {rows[i].index for i in false}

    acc, false = verdicts(0.24, 0.24, 0.0)
    assert acc == pytest.approx(927 / 964) and false == {0, 1, 846, 851}
    reached = 0
    for stash in [x / 50 for x in range(0, 21)]:  # 0 to 0.40
        for work in (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0):
            acc, false = verdicts(stash, work, 0.0)
            if acc >= 0.95:
                reached += 1
                if (stash, work) == (0.08, 0.75):
                    assert false == {50, 51, 52, 130, 234, 256, 501, 846, 851}
                    continue
                assert {0, 1} <= false, (stash, work)
    for const in range(0, 9):  # GiB
        for frac in [x / 50 for x in range(0, 16)]:  # 0 to 0.30
            acc, false = verdicts(frac, frac, float(const))
            if acc >= 0.95:
                reached += 1
                assert {0, 1} <= false, (const, frac)
    assert reached > 50

def _row(i: int, status: str, dp: int, mbs: int = 4) -> Row:
    return Row(i, "llama-65b", 2048, 8 * 4 * dp, 8, 4, dp, mbs, "none", "flash2", True, False,
               status, 1.0 if status == "ok" else None)


def test_contradicted_pairs_a_ran_run_with_a_larger_dp_that_did_not():
    rows = [_row(0, "ok", 2), _row(1, "oom", 4),  # contradicted
            _row(2, "oom", 1), _row(3, "ok", 8),  # fewer replicas out of memory: consistent
            _row(4, "ok", 2, mbs=2), _row(5, "oom", 8, mbs=8)]  # other micro-batch sizes
    assert contradicted(rows) == [(0, 1)]
    assert contradicted([rows[1], rows[0]]) == [(0, 1)]


def test_sweep_contradicts_itself_in_two_pairs():
    """Rows 846 and 851 (64 GPUs) ran with TP8 PP4 DP2 and TP8 PP8 DP1, micro-batch 4; rows 968
    and 983 (128 GPUs, another of the sweep's files) were recorded out of memory with the same
    layouts on twice the DP degree, which holds less on every GPU."""
    rows = load_rows(SWEEP)
    assert contradicted(rows) == [(846, 968), (851, 983)]
    with SWEEP.open(newline="", encoding="utf-8") as fh:
        files = [rec["source_file"] for rec in csv.DictReader(io.StringIO(fh.read()))]
    assert {files[846], files[851]} == {"llama_65B_bfloat16_64_GPUs_sequence_parallelism.xlsx"}
    assert {files[968], files[983]} == {"llama_65B_bfloat16_128_GPUs_all_runs.xlsx"}


def test_sweep_report_lists_the_contradicted_pairs():
    rows = [_row(0, "ok", 2), _row(1, "oom", 4)]
    preds = [Prediction(r, 1.0, 90.0, True) for r in rows]
    report = sweep_source_report(preds, "sweep", None)
    assert report["contradicted"] == [{"ran": 0, "oom": 1, "ran_predicted_oom": True,
                                       "oom_predicted_oom": True}]
    # the row that ran in a contradicted pair is reported there, not as a false OOM
    assert report["false_oom"] == 0 and report["false_oom_contradicted"] == 1


def test_false_oom_still_counts_rows_that_ran_outside_a_contradicted_pair():
    rows = [_row(0, "ok", 2), _row(1, "oom", 4), _row(2, "ok", 2, mbs=2)]
    preds = [Prediction(r, 1.0, 90.0, True) for r in rows]
    report = sweep_source_report(preds, "sweep", None)
    assert (report["false_oom"], report["false_oom_contradicted"]) == (1, 1)
    assert contradicted_ran(rows) == frozenset({0})


def test_sources_table_names_the_contradicted_rows():
    from sim.cli.validate import sources_table

    report = sweep_source_report([Prediction(r, 1.0, 90.0, True)
                                  for r in (_row(0, "ok", 2), _row(1, "oom", 4))], "sweep", None)
    text = sources_table([report])
    assert "sweep: rows 0 ran" in text and "(rows 1;" in text
    assert "not counted in its false OOM (predicted out of memory: 0)" in text


def test_the_optimizer_step_moment_adds_the_copy_to_the_static_state(mb) -> None:
    """--step-copy: at the optimizer step a rank holds its static state, the copy's bytes a
    parameter of its stages (with the allocator's overhead) and its reserved memory; 0 bytes
    leaves the static state and reserved memory alone, below the activation peak."""
    row = next(r for r in load_source(CORPUS_DIR / "korthikanti2022_megatron.csv").rows
               if r.run == "gpt-22b-8gpu-full")
    exp = build_experiment(row.experiment())
    ranks = mb.breakdown(exp)
    (rank, act, step), = mb.step_moment(exp, 4.0)
    (_, _, bare), = mb.step_moment(exp, 0.0)
    m = ranks[0]
    assert act == pytest.approx(m.peak) and bare == pytest.approx(m.static + m.reserved)
    n = exp.costs.stage_params(0)
    assert step - bare == pytest.approx(4.0 * n * (1 + m.fragmentation))
    assert bare < act < step  # this row peaks at the step (docs/memory-gaps.md)
