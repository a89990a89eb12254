"""Seq1F1B on transformer models: equal-FLOPs sequence chunks from the real model, exact
totals over the chunks, per-chunk memory and messages, bubble and memory against 1F1B."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLE

from base.errors import ConfigError
from sim.cli import main
from sim.compare import compare
from sim.experiment import build_experiment
from workloads.costs import CommSeg, ComputeSeg, Segment
from workloads.memory import stash_bytes
from workloads.models import PRESETS
from workloads.schedules import BACKWARD, FORWARD, WEIGHT_GRAD, Op, list_schedule
from workloads.seqchunks import chunk_cost, equal_cost_bounds, layer_work_shares, rounded_bounds
from workloads.transformer import TransformerCosts

REL = 1e-9


def costs_of(preset: str, seq: int, k: int, **fields: object) -> TransformerCosts:
    model = replace(PRESETS[preset], seq_length=seq)
    base = {"micro_batch_size": 1, "tp": 1, "dp": 1, "stage_layers": (2, 2)}
    return TransformerCosts(model, **{**base, **fields}, seq_chunks=k)  # type: ignore[arg-type]


def totals(segs: tuple[Segment, ...]) -> dict[str, float]:
    out = {"flops": 0.0, "attn_flops": 0.0, "hbm_bytes": 0.0, "elementwise_bytes": 0.0,
           "comm_bytes": 0.0}
    for seg in segs:
        if isinstance(seg, ComputeSeg):
            for key in ("flops", "attn_flops", "hbm_bytes", "elementwise_bytes"):
                out[key] += getattr(seg, key)
        elif isinstance(seg, CommSeg):
            out["comm_bytes"] += seg.nbytes
    return out


CASES = [  # (preset, seq, k, fields): dense GPT, GQA + SwiGLU + RoPE, TP + SP, MoE with EP,
    # recomputation, ZeRO-3 markers, the zero-bubble split of the backward
    ("gpt3-1.3b", 4096, 4, {}),
    ("llama3-8b", 8192, 3, {"tp": 2, "sequence_parallel": True}),
    ("llama2-70b", 4096, 5, {"tp": 4, "recompute": "selective"}),
    ("mixtral-8x7b", 4096, 4, {"tp": 2, "dp": 4, "ep": 2, "sequence_parallel": True}),
    ("gpt3-2.7b", 2048, 2, {"tp": 2, "recompute": "full", "attention": "flash1"}),
    ("llama2-7b", 4096, 4, {"dp": 2, "zero_stage": 3}),
]


@pytest.mark.parametrize("preset,seq,k,fields", CASES)
def test_chunk_totals_equal_the_whole_micro_batch(preset: str, seq: int, k: int,
                                                  fields: dict) -> None:
    """FLOPs, attention FLOPs, memory-bound bytes, TP/EP collective bytes, pipeline
    messages, stashed activations and working memory of the k chunks add up to the whole
    micro-batch's, on every stage (the last holds the head) and for every kind of op."""
    costs = costs_of(preset, seq, k, **fields)
    empty = replace(costs, seq_chunks=1, seq_window=(0.5, 0.5))  # no tokens: weights only
    for stage in (0, 1):
        for kind, split in ((FORWARD, False), (BACKWARD, False), (BACKWARD, True),
                            (WEIGHT_GRAD, True)):
            whole = totals(costs.op_segments(Op(stage, kind, 0), split))
            parts = [totals(costs.op_segments(Op(stage, kind, 0, c), split)) for c in range(k)]
            for key in ("flops", "attn_flops", "elementwise_bytes", "comm_bytes"):
                got = sum(p[key] for p in parts)
                assert got == pytest.approx(whole[key], rel=REL, abs=1e-6), (stage, kind, key)
            # every chunk's GEMMs re-read the weights: all else adds up exactly
            weights = totals(empty.op_segments(Op(stage, kind, 0), split))["hbm_bytes"]
            assert weights > 0
            assert sum(p["hbm_bytes"] for p in parts) == pytest.approx(
                whole["hbm_bytes"] + (k - 1) * weights, rel=REL)
            if kind != WEIGHT_GRAD:
                marked = [totals(costs.op_segments(Op(stage, kind, 0, c), split, markers=True))
                          for c in range(k)]
                assert sum(p["flops"] for p in marked) == pytest.approx(whole["flops"], rel=REL)
        stash = [stash_bytes(costs, Op(stage, FORWARD, 0, c)) for c in range(k)]
        assert sum(stash) == pytest.approx(costs.activation_bytes_per_mb(stage), rel=REL)
        assert all(a > b for a, b in zip(stash, stash[1:], strict=False))  # shorter chunks
        if costs.zero_stage < 3:  # ZeRO-3's gathered parameters are per op, not per token
            for kind in (FORWARD, BACKWARD):
                parts_t = sum(costs.transient_bytes(Op(stage, kind, 0, c)) for c in range(k))
                assert parts_t == pytest.approx(costs.transient_bytes(Op(stage, kind, 0)),
                                                rel=REL)
    messages = sum(costs.seq_p2p_bytes(Op(0, FORWARD, 0, c)) for c in range(k))
    assert messages == pytest.approx(costs.p2p_bytes(), rel=REL)


def layer_work(costs: TransformerCosts, c: int | None = None) -> float:
    """FLOPs (GEMM and attention) of one stage-0 layer, forward plus backward, of sequence
    chunk ``c`` (None: the whole micro-batch, or the cost model's own window)."""
    segs = (costs.op_segments(Op(0, FORWARD, 0, -1 if c is None else c), False)
            + costs.op_segments(Op(0, BACKWARD, 0, -1 if c is None else c), False))
    t = totals(segs)
    return t["flops"] + t["attn_flops"]


def window_work(costs: TransformerCosts, lo: float, hi: float) -> float:
    return layer_work(replace(costs, seq_chunks=1, seq_window=(lo, hi)))


@pytest.mark.parametrize("preset,seq,k,fields", CASES)
def test_chunks_have_equal_flops_up_to_whole_tokens(preset: str, seq: int, k: int,
                                                    fields: dict) -> None:
    """Each chunk of a layer does the same FLOPs forward plus backward, as far as whole tokens
    (multiples of t with sequence parallelism) allow: as in the reference code, every chunk
    but the first is the longest multiple of ``mod`` tokens that does not exceed the
    per-chunk share, and the first holds the rest; later chunks are shorter (their queries
    attend to a longer prefix)."""
    costs = costs_of(preset, seq, k, **fields)
    mod = costs.tp if costs.sequence_parallel else 1
    x = costs.seq_bounds()
    assert len(x) == k + 1 and x[0] == 0.0 and x[-1] == 1.0
    tokens = [round(v * seq) for v in x]
    assert [t / seq for t in tokens] == list(x)  # whole tokens
    assert all((b - a) % mod == 0 for a, b in zip(tokens[1:], tokens[2:], strict=False))
    assert all(b - a > c - b for a, b, c in zip(x, x[1:], x[2:], strict=False))
    work = [layer_work(costs, c) for c in range(k)]
    share = layer_work(costs) / k
    assert sum(work) == pytest.approx(k * share, rel=REL)
    for c in range(1, k):
        assert work[c] <= share * (1 + REL)
        longer = window_work(costs, x[c] - mod / seq, x[c + 1])  # mod more tokens overshoot
        assert longer > share
    assert work[0] >= share * (1 - REL)
    # the first chunk holds fewer than (k - 1) * mod extra tokens, each costing about k/s
    # of a chunk's share
    assert work == pytest.approx([share] * k, rel=k * k * mod / seq)


def test_sequence_parallel_rounds_chunks_to_multiples_of_tp() -> None:
    """With sequence parallelism every chunk's tokens are sharded over the t TP ranks, so the
    reference code (thunlp/Seq1F1B, solve_partition with mod = t) rounds each chunk but the
    first down to a multiple of t; without SP, to whole tokens."""
    for tp in (2, 4, 8):
        sp = costs_of("llama3-8b", 8192, 4, tp=tp, sequence_parallel=True)
        plain = replace(sp, sequence_parallel=False)
        xs, xp = sp.seq_bounds(), plain.seq_bounds()
        lengths = [round((b - a) * 8192) for a, b in zip(xs, xs[1:], strict=False)]
        assert sum(lengths) == 8192 and all(n % tp == 0 for n in lengths)
        plain_lengths = [round((b - a) * 8192) for a, b in zip(xp, xp[1:], strict=False)]
        assert lengths != plain_lengths
        # rounding the later chunks down moves every cut towards the end, by less than
        # (k - 1) t tokens: the first chunk grows, the last shrinks
        assert all(0 <= (q - p) * 8192 < 3 * tp for p, q in zip(xp, xs, strict=False))
        assert lengths[0] > plain_lengths[0] and lengths[-1] < plain_lengths[-1]


def test_rounded_bounds_closed_forms() -> None:
    """Per-token work only: equal chunks of s/k tokens, rounded down to multiples of mod from
    the last chunk back, the first chunk taking the rest."""
    assert rounded_bounds(equal_cost_bounds(3, 0.0), 100, 8, 0.0) == (0.0, 0.36, 0.68, 1.0)
    assert rounded_bounds(equal_cost_bounds(4, 0.0), 64, 8, 0.0) == (0.0, 0.25, 0.5, 0.75, 1.0)
    assert rounded_bounds(equal_cost_bounds(1, 0.4), 64, 8, 0.4) == (0.0, 1.0)
    # causal work: each chunk is the longest multiple of mod whose cost stays within 1/k,
    # found here by scanning lengths (independent of chunk_start's quadratic)
    for a, r, s, k, mod in ((0.3, 0.0, 4096, 4, 8), (0.6, 0.0, 2048, 5, 4),
                            (0.0, 0.3, 4096, 3, 2)):
        ideal = equal_cost_bounds(k, a, r)
        target = chunk_cost(ideal[0], ideal[1], a, r)
        expect = [s]
        for _ in range(k - 1):
            end = expect[0]
            n = 0
            while chunk_cost((end - n - mod) / s, end / s, a, r) <= target * (1 + 1e-12):
                n += mod
            expect.insert(0, end - n)
        assert rounded_bounds(ideal, s, mod, a, r) == pytest.approx(
            [0.0] + [e / s for e in expect], abs=1e-15)


def test_chunks_too_short_for_tp_are_a_config_error() -> None:
    """Eight chunks of a 64-token sequence with TP 8 and SP: the last chunks hold fewer than
    eight tokens, which rounding would leave empty."""
    costs = costs_of("gpt3-1.3b", 64, 8, tp=8, sequence_parallel=True)
    with pytest.raises(ConfigError, match="training.seq_chunks=8.*multiples of parallel.tp"):
        costs.seq_bounds()
    assert len(replace(costs, sequence_parallel=False).seq_bounds()) == 9


def test_attention_share_of_a_gpt_layer() -> None:
    """GPT layer, flash2: GEMMs 3 x 24 s h^2 forward + backward, causal attention
    2 s^2 h forward and 2.5 x that backward (Narayanan et al. 2021; Dao 2023): the share of
    attention is 7 s / (72 h + 7 s), growing with s."""
    for seq in (2048, 8192, 32768):
        costs = costs_of("gpt3-1.3b", seq, 4)
        h = costs.model.hidden_size
        assert layer_work_shares(costs) == pytest.approx((7 * seq / (72 * h + 7 * seq), 0.0),
                                                         rel=REL)
    gqa = costs_of("llama3-8b", 8192, 4)  # narrower K/V GEMMs: a larger attention share
    dense_kv = replace(gqa, model=replace(gqa.model, num_kv_heads=gqa.model.num_attention_heads))
    assert layer_work_shares(gqa)[0] > layer_work_shares(dense_kv)[0]
    sel = replace(gqa, recompute="selective")  # the recomputed core adds attention work
    assert layer_work_shares(sel)[0] > layer_work_shares(gqa)[0]


def test_non_flash_kernels_compute_each_chunks_score_block() -> None:
    """Without flash, a chunk computes its queries against its whole prefix: the blocks right
    of each chunk's end are skipped, so the chunks do less attention work than the whole
    s x s matrix; the boundaries still equalise each chunk's FLOPs."""
    k = 4
    costs = costs_of("gpt3-1.3b", 4096, k, attention="unfused")
    causal, rect = layer_work_shares(costs)
    assert causal == 0.0 and 0 < rect < 1
    x = costs.seq_bounds()
    assert x == rounded_bounds(equal_cost_bounds(k, 0.0, rect), 4096, 1, 0.0, rect)
    assert x == pytest.approx(equal_cost_bounds(k, 0.0, rect), abs=(k - 1) / 4096)
    whole = totals(costs.op_segments(Op(0, FORWARD, 0), False))
    parts = [totals(costs.op_segments(Op(0, FORWARD, 0, c), False)) for c in range(k)]
    blocks = sum((x[c + 1] - x[c]) * x[c + 1] for c in range(k))
    assert 0.5 < blocks < 1
    assert sum(p["attn_flops"] for p in parts) == pytest.approx(whole["attn_flops"] * blocks,
                                                                rel=REL)
    assert sum(p["flops"] for p in parts) == pytest.approx(whole["flops"], rel=REL)
    # its stashed score matrix is its own block too
    assert sum(stash_bytes(costs, Op(0, FORWARD, 0, c)) for c in range(k)) < (
        costs.activation_bytes_per_mb(0))


def test_equal_cost_bounds() -> None:
    assert equal_cost_bounds(1, 0.3) == (0.0, 1.0)
    assert equal_cost_bounds(1, 0.0, 0.3) == (0.0, 1.0)
    assert equal_cost_bounds(4, 0.0) == (0.0, 0.25, 0.5, 0.75, 1.0)
    assert equal_cost_bounds(4, 0.0, 0.0) == equal_cost_bounds(4, 0.0)
    for a, r, k in ((0.0, 0.4, 3), (0.2, 0.3, 5), (0.0, 1.0, 4), (0.5, 0.0, 6)):
        x = equal_cost_bounds(k, a, r)
        cost = [(1 - a - r) * (x[c + 1] - x[c]) + a * (x[c + 1] ** 2 - x[c] ** 2)
                + r * (x[c + 1] - x[c]) * x[c + 1] for c in range(k)]
        assert cost == pytest.approx([cost[0]] * k, rel=1e-12)
        assert all(u > v for u, v in zip(x[1:], x, strict=False))
    with pytest.raises(ValueError, match="k=0"):
        equal_cost_bounds(0, 0.2)
    with pytest.raises(ValueError, match="sum to at most 1"):
        equal_cost_bounds(2, 0.7, 0.6)


def test_chunk_ops_keep_their_names() -> None:
    costs = costs_of("gpt3-1.3b", 4096, 4, tp=2)
    segs = costs.op_segments(Op(1, BACKWARD, 3, 2), False)
    assert segs[0].label == "1B3.2"
    one = costs_of("gpt3-1.3b", 4096, 1, tp=2)  # k = 1: a chunk suffix is the whole
    for kind in (FORWARD, BACKWARD):
        chunk = one.op_segments(Op(0, kind, 0, 0), False)
        whole = one.op_segments(Op(0, kind, 0), False)
        # a leading compute segment carries the op's name (the forward's leads with the
        # embedding's TP all-reduce)
        named = [i for i, seg in enumerate(chunk) if seg.label == f"0{kind}0.0"]
        assert named == [i for i, seg in enumerate(whole) if seg.label == f"0{kind}0"]
        assert ([s for i, s in enumerate(chunk) if i not in named]
                == [s for i, s in enumerate(whole) if i not in named]) and len(chunk) > 1


# ----------------------------------------------------------------------------- engine


def experiment(schedule: str, k: int = 4, seq: int = 4096, m: int = 8, **training: object
               ) -> dict:
    """GPT-3 1.3B (a 512-token vocabulary, so the last stage's head does not unbalance the
    stages) on 4 H100 over an ideal network: 1e9 GB/s, latency-free links, one GPU per
    node. Compute takes real time; the ``ideal`` preset's infinitely fast GPUs would not."""
    return {
        "name": f"seq-{schedule}",
        "model": {"preset": "gpt3-1.3b", "seq_length": seq, "vocab_size": 512},
        "cluster": {"topology": "switch", "gpu": "H100", "num_gpus": 4, "gpus_per_node": 1,
                    "link_bandwidth_GBps": 1e9, "link_latency_us": 0.0},
        "parallel": {"pp": 4, "zero_stage": 0},
        "training": {"micro_batch_size": 1, "global_batch_size": m, "seq_chunks": k,
                     **training},
        "schedule": schedule,
    }


@pytest.fixture(scope="module")
def runs() -> dict:
    out = {}
    for name, k in (("1f1b", 4), ("seq1f1b", 2), ("seq1f1b", 4)):
        exp = build_experiment(experiment(name, k))
        rows, results = compare(exp, (name,))
        out[(name, k)] = (rows[0], results[0])
    return out


def _durations(result: object) -> dict:
    """Each compute op's duration in an engine run (its span on the compute stream)."""
    spans = {s.name: s for s in result.timeline.spans if s.stream == "compute"}
    return {op: spans[str(op)].end_s - spans[str(op)].start_s
            for ops in result.experiment.schedule.rank_ops for op in ops}


def _list_bubble_ratio(schedule: object, durations: dict) -> float:
    """Idle over busy time of the list schedule of ``durations`` (all ranks together)."""
    spans = list_schedule(schedule, durations.__getitem__)
    makespan = max(e for _, e in spans.values()) - min(s for s, _ in spans.values())
    busy = sum(durations[op] for op in spans)
    idle = len(schedule.rank_ops) * makespan - busy
    return idle / busy


def _equalized(durations: dict) -> dict:
    """``durations`` with every op of one stage and kind given their mean: chunks of equal
    time, the assumption behind Sun et al.'s 1/k."""
    groups: dict = {}
    for op, d in durations.items():
        groups.setdefault((op.stage, op.kind), []).append(d)
    return {op: sum(groups[op.stage, op.kind]) / len(groups[op.stage, op.kind])
            for op in durations}


@pytest.mark.parametrize("k", [2, 4])
def test_bubble_is_one_kth_of_1f1b_for_equal_chunks(runs: dict, k: int) -> None:
    """Sun et al. 2024: Seq1F1B's bubble is (p - 1)/(k m) of ideal, 1/k of 1F1B's, for
    chunks of equal time. The equal-FLOPs cut leaves real chunks' times apart (a chunk's
    attention runs at the attention kernel's rate, its GEMMs at the GEMM curve's), which
    costs bubble in the steady state too, by how far apart they are, so by the device
    constants (1.23/k and 1.54/k for k = 2 and 4 at the A100 fit of 2026-12-06, 1.14/k and
    1.29/k at the one of 2026-12-03; with equal chunks 1.01/k and 1.06/k at both). So:
    with each stage's chunk times set to their mean, the list schedule's bubble is 1/k of
    1F1B's (within 10%); with the real ones, the engine's bubble is the list schedule's
    (the excess over 1/k is the chunks' imbalance, nothing else); and the step is shorter
    than 1F1B's."""
    base, seq = runs[("1f1b", 4)][1], runs[("seq1f1b", k)][1]
    assert base.stats["bubble_ratio"] == pytest.approx(3 / 8, rel=0.05)  # (p - 1)/m
    base_eq = _list_bubble_ratio(base.experiment.schedule, _equalized(_durations(base)))
    seq_eq = _list_bubble_ratio(seq.experiment.schedule, _equalized(_durations(seq)))
    assert 1.0 / k <= seq_eq / base_eq <= 1.1 / k
    real = (_list_bubble_ratio(seq.experiment.schedule, _durations(seq))
            / _list_bubble_ratio(base.experiment.schedule, _durations(base)))
    assert seq.stats["bubble_ratio"] / base.stats["bubble_ratio"] == pytest.approx(
        real, rel=0.02)
    assert real >= seq_eq / base_eq
    assert seq.stats["step_time_s"] < base.stats["step_time_s"]


def test_peak_activation_memory_is_lower_than_1f1bs(runs: dict) -> None:
    """Rank r holds p - r + k - 1 chunks instead of p - r micro-batches (Sun et al. 2024):
    the peak (rank 0's) drops with k. The last rank may hold about as much as under 1F1B:
    in its steady state it keeps the first, longest, chunks of two micro-batches."""
    base = runs[("1f1b", 4)][0]
    for k in (2, 4):
        row = runs[("seq1f1b", k)][0]
        assert max(row.peak_activation_gib) < 0.7 * max(base.peak_activation_gib)
        assert all(s < b for s, b in zip(row.peak_activation_gib[:-1],
                                         base.peak_activation_gib[:-1], strict=True))
    assert max(runs[("seq1f1b", 4)][0].peak_activation_gib) < max(
        runs[("seq1f1b", 2)][0].peak_activation_gib)
    # the same pipeline bytes in all: each chunk's messages carry its own tokens
    assert runs[("seq1f1b", 4)][0].pp_bytes_sent == pytest.approx(base.pp_bytes_sent, rel=REL)


def test_engine_runs_the_chunks_as_the_list_schedule_oracle(runs: dict) -> None:
    """Each chunk op lasts its own chunk's time and runs where the list schedule puts it
    (the messages over the ideal network take a few nanoseconds)."""
    result = runs[("seq1f1b", 4)][1]
    spans = {s.name: s for s in result.timeline.spans if s.stream == "compute"}
    durations = {op: spans[str(op)].end_s - spans[str(op)].start_s
                 for ops in result.experiment.schedule.rank_ops for op in ops}
    lengths = [durations[Op(0, FORWARD, 0, c)] for c in range(4)]
    assert len(set(lengths)) == 4 and max(lengths) / min(lengths) < 1.15
    oracle = list_schedule(result.experiment.schedule, durations.__getitem__)
    for op, (_, end) in oracle.items():
        assert spans[str(op)].end_s == pytest.approx(end, abs=1e-6), op


def test_peak_memory_follows_the_chunks_kv_kept_until_their_backward(runs: dict) -> None:
    """Walk each rank's program as the allocator does: a chunk's activations (its keys and
    values among them) from its forward until its own backward, which runs after every
    later chunk's; working memory while an op runs. The engine's peak per rank matches."""
    row, result = runs[("seq1f1b", 4)]
    exp = result.experiment
    costs = exp.costs
    for r, ops in enumerate(exp.schedule.rank_ops):
        held = peak = 0.0
        for op in ops:
            generic = Op(op.stage, op.kind, 0, op.seq)
            extra = costs.transient_bytes(generic)
            if op.kind == FORWARD:
                held += stash_bytes(costs, generic)
            peak = max(peak, held + extra)
            if op.kind == BACKWARD:
                held -= stash_bytes(costs, generic)
        assert held == pytest.approx(0.0, abs=1.0)
        assert row.peak_activation_gib[r] * 2**30 == pytest.approx(peak, rel=1e-6), r


def test_run_and_compare_on_a_transformer_example(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["training"]["global_batch_size"] = 16
    data["training"]["seq_chunks"] = 2
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["compare", str(path), "--schedules", "1f1b,seq1f1b", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["schedules"]
    assert [r["schedule"] for r in rows] == ["1f1b", "seq1f1b"]
    assert rows[1]["peak_activation_gib"] < rows[0]["peak_activation_gib"]
    data["schedule"] = "seq1f1b"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["schedule"] == "seq1f1b" and stats["step_time_s"] > 0


def test_context_parallel_and_too_many_chunks_are_config_errors(tmp_path: Path) -> None:
    data = experiment("seq1f1b")
    data["cluster"]["num_gpus"] = 8
    data["parallel"]["cp"] = 2
    with pytest.raises(ConfigError, match="parallel.cp=2: not supported with schedule "
                                          "'seq1f1b'"):
        build_experiment(data)
    # a custom schedule file with sequence chunks, too
    (tmp_path / "chunks.txt").write_text("\n".join(
        f"{r}F0.0 {r}F0.1 {r}B0.1 {r}B0.0" for r in range(4)))
    data["schedule"] = str(tmp_path / "chunks.txt")
    data["training"]["global_batch_size"] = 1
    with pytest.raises(ConfigError, match=r"parallel.cp=2: not supported with sequence "
                                          r"chunks \(schedule=.* has k=2\)"):
        build_experiment(data)
    data["parallel"]["cp"] = 1
    data["cluster"]["num_gpus"] = 4
    assert build_experiment(data).costs.seq_chunks == 2  # without CP the file runs
    with pytest.raises(ConfigError, match=r"training.seq_chunks=64 exceeds "
                                          r"model.seq_length=32"):
        build_experiment(experiment("seq1f1b", k=64, seq=32))


@pytest.mark.parametrize("tp,pp,dp,extra", [
    (2, 4, 2, {"sp": True}),                      # TP/SP collectives per chunk
    (1, 4, 2, {"zero": 3}),                       # per-chunk parameter gathers (pieces)
    (1, 2, 4, {"overlap_grad_reduce": True}),     # buckets in the last chunk's backward
])
def test_collapsed_and_full_agree(tp: int, pp: int, dp: int, extra: dict) -> None:
    """Chunk ops through the collapsed lowering (folded TP collectives, per-chunk message
    sizes in the send cache) match the full simulation on a full mesh."""
    from test_collapse import EXACT, MESH, assert_agree
    from test_collapse import experiment as mesh_experiment

    assert_agree(mesh_experiment(tp, pp, dp, "seq1f1b", cluster=MESH, **extra), EXACT,
                 skip=("exposed_pp", "exposed_dp"))
