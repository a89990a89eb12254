"""Reserved memory from its sourced components (sim/reserved.py, sim/data/reserved_memory.toml):
each component in closed form, the communicators a rank creates, and the run's peak."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import reserved as R
from sim.calibration import default_profile
from sim.gpu_profiles import generation_of
from topologies.placement import Placement
from workloads.frameworks import FRAMEWORKS, load_profiles

MiB, GiB = 2**20, 2**30
CONN = 524_288 + 4_915_200 + 4_194_304
"""One NCCL connection: LL 8 x 512 x 8 x 16, LL128 120 x 640 x 8 x 8, Simple 4 MiB."""


def test_one_connection_is_one_buffer_per_protocol() -> None:
    assert R.connection_bytes() == CONN == 9_633_792


def test_context_is_pytorch_86509s_measurement_less_the_tensors_segment() -> None:
    assert R.context_bytes("eager") == 666_632_192 - 20 * MiB
    assert R.context_bytes("lazy") == 287_047_680 - 20 * MiB
    with pytest.raises(ValueError, match="eager, lazy"):
        R.context_bytes("LAZY")


def test_cublas_workspaces_by_generation() -> None:
    assert R.cublas_bytes("ampere") == (4096 * 2 + 16 * 8) * 1024 + 1024 * 1024
    assert R.cublas_bytes("hopper") == 2 * 32 * MiB
    assert R.cublas_bytes(None) == R.cublas_bytes("ampere")


@pytest.mark.parametrize("comm, gen, want", [
    (R.Communicator("tp", 2, 1, 2), "ampere", 24 * 1 * CONN),   # two ranks: one connection
    (R.Communicator("tp", 8, 1, 8), "ampere", 24 * 2 * CONN),   # ring + chain tree
    (R.Communicator("tp", 8, 1, 8), "hopper", 32 * 2 * CONN),
    (R.Communicator("dp", 32, 4, 8), "ampere", 16 * 2 * CONN),  # 8 NICs a server, 2 channels each
    (R.Communicator("dp", 16, 4, 4), "ampere", 8 * 2 * CONN),   # 4 local ranks use 4 NICs
    (R.Communicator("dp", 4, 4, 1), "ampere", 2 * 2 * CONN),    # one rank a server: one NIC
    (R.Communicator("pp", 2, 2, 1), "ampere", 2 * 1 * CONN),
    (R.Communicator("dp", 1024, 128, 8), "ampere", 16 * 2 * CONN),
    (R.Communicator("dp", 1, 1, 1), "ampere", 0),
])
def test_nccl_buffers_per_communicator(comm, gen, want) -> None:
    assert R.nccl_bytes(comm, gen, nics_per_server=8, gpus_per_server=8) == want


def test_channels_across_servers_follow_the_nics_and_stop_at_32() -> None:
    comm = R.Communicator("dp", 64, 4, 16)
    assert R.channels(comm, "ampere", nics_per_server=16, gpus_per_server=16) == 32
    assert R.channels(R.Communicator("dp", 16, 2, 8), "ampere", 2, 8) == 4


@pytest.mark.parametrize("nccl, per_head", [
    ("2.16", 0), ("2.17", 16 * 2 * (4 * MiB + 2 * MiB)), ("2.20", 16 * 2 * (4 * MiB + 2 * MiB)),
    ("2.21", 16 * 2 * (128 * 1024 * 8 + 2 * MiB)), ("2.22", 16 * 2 * (128 * 1024 * 8 + 2 * MiB)),
    ("2.23", 16 * 2 * 128 * 1024 * 8), ("2.28", 16 * 2 * 128 * 1024 * 8)])
def test_nvls_head_by_nccl_version(nccl: str, per_head: int) -> None:
    assert R.nvls_head_bytes(nccl) == per_head


def test_nvls_only_on_nvswitch_hopper_with_more_than_two_local_ranks() -> None:
    per_head = 16 * 2 * (4 * MiB + 2 * MiB)
    tp8 = R.Communicator("tp", 8, 1, 8)
    # within a server a head a GPU
    assert R.nvls_bytes(tp8, "hopper", 8, 8, enabled=True, nccl_version="2.18") == 8 * per_head
    assert R.nvls_bytes(tp8, "hopper", 8, 8, enabled=True, nccl_version="2.12") == 0
    assert R.nvls_bytes(tp8, "hopper", 8, 8, enabled=False, nccl_version="2.18") == 0
    assert R.nvls_bytes(tp8, "ampere", 8, 8, enabled=True, nccl_version="2.18") == 0
    assert R.nvls_bytes(R.Communicator("tp", 2, 1, 2), "hopper", 8, 8, True, "2.18") == 0
    # across servers: a head a NIC its local ranks use (4 local ranks of 8, 8 NICs: 4 heads)
    dp = R.Communicator("dp", 32, 8, 4)
    assert R.nvls_bytes(dp, "hopper", 8, 8, enabled=True, nccl_version="2.18") == 4 * per_head


def test_from_nccl_2_22_only_the_ring_is_connected() -> None:
    tp8 = R.Communicator("tp", 8, 1, 8)
    assert R.nccl_bytes(tp8, "ampere", 8, 8, nccl_version="2.21") == 24 * 2 * CONN
    assert R.nccl_bytes(tp8, "ampere", 8, 8, nccl_version="2.22") == 24 * 1 * CONN
    with pytest.raises(ValueError, match="nccl_version"):
        R.nccl_bytes(tp8, "ampere", 8, 8, nccl_version="latest")


def _hosts(gpus_per_server: int):
    return lambda g: g // gpus_per_server


def test_megatrons_communicators_of_a_tp2_pp2_dp2_layout() -> None:
    pl = Placement.from_order("tp-cp-dp-pp", tp=2, cp=1, dp=2, pp=2)
    groups = FRAMEWORKS["megatron"].nccl_groups
    first = R.communicators(pl, pl.gpu(pp=0), groups, _hosts(8), tied_embeddings=True)
    assert [(c.group, c.ranks, c.servers) for c in first] == [
        ("world", 8, 1), ("dp", 2, 1), ("tp", 2, 1), ("pp", 2, 1), ("model_parallel", 4, 1),
        ("embedding", 2, 1)]
    untied = R.communicators(pl, pl.gpu(pp=0), groups, _hosts(8), tied_embeddings=False)
    assert "embedding" not in [c.group for c in untied]
    # four servers of two GPUs: DP and PP cross servers, TP stays in one
    spread = {c.group: (c.servers, c.local_ranks)
              for c in R.communicators(pl, 0, groups, _hosts(2), tied_embeddings=True)}
    assert spread["tp"] == (1, 2) and spread["dp"] == (2, 1) and spread["pp"] == (2, 1)
    assert spread["world"] == (4, 2)


def test_context_parallelism_joins_the_dp_group_and_adds_its_own() -> None:
    pl = Placement.from_order("tp-cp-dp-pp", tp=1, cp=2, dp=2, pp=1)
    comms = {c.group: c.ranks
             for c in R.communicators(pl, 0, ("dp", "cp"), _hosts(8), tied_embeddings=False)}
    assert comms == {"dp": 4, "cp": 2}


def test_a_profiles_nccl_groups_and_module_loading_are_checked() -> None:
    base = ('["x"]\nsummary = "s"\n' + "\n".join(
        f'{f} = {v}\n{f}_source = "s"' for f, v in (
            ("dp_wire_bytes", 3.0), ("grad_reduce_bytes", 4.0), ("grad_buffer_bytes", 4.0),
            ("vocab_parallel_loss", "true"), ("stage_split", '"even"'),
            ("sp_saves_gathered_input", "false"), ("kept_stage_outputs", 0),
            ("allocator", '"caching"'), ("fused_cross_entropy", "false"),
            ("zero3_gather_copy_bytes", 0), ("zero3_reduce_copy_bytes", 0),
            ("attention_copy_bytes", 0), ("dropout", "false"), ("fp8_cast_bytes", 0),
            ("zero3_unsharded_under_pp", "false"), ("vocab_parallel_loss_buffers", 0),
            ("grad_accum_bytes", 0), ("tied_grad_reduce_bytes", 0), ("rope_bytes", 0),
            ("swiglu_bytes", 0), ("fp8_norm_cast_fused", "false"),
            ("zero2_reduce_every_microbatch", "false"), ("cp_kv_all_gather", "false"),
            ("swiglu_stash_bytes", 6))) + "\n")
    ok = load_profiles(base)["x"]
    assert ok.nccl_groups == FRAMEWORKS["megatron"].nccl_groups
    assert ok.cuda_module_loading == "lazy" and ok.nccl_nvls
    with pytest.raises(ValueError, match="nccl_groups"):
        load_profiles(base + 'nccl_groups = ["dp", "expert"]\nnccl_groups_source = "s"\n')
    with pytest.raises(ValueError, match="cuda_module_loading"):
        load_profiles(base + 'cuda_module_loading = "LAZY"\ncuda_module_loading_source = "s"\n')
    with pytest.raises(ValueError, match="nccl_version"):
        load_profiles(base + 'nccl_version = "2.18.1"\nnccl_version_source = "s"\n')
    assert ok.nccl_version == "2.12"


def test_framework_choices() -> None:
    assert FRAMEWORKS["nemo-launcher-2022"].cuda_module_loading == "eager"
    assert FRAMEWORKS["megatron"].cuda_module_loading == "lazy"
    assert FRAMEWORKS["fsdp-compile"].nccl_version == FRAMEWORKS["fsdp"].nccl_version == "2.21"
    assert FRAMEWORKS["fsdp"].nccl_groups == ("dp", "tp", "cp", "pp")
    assert FRAMEWORKS["llm-foundry"].nccl_groups == ("dp",)
    assert FRAMEWORKS["llm-foundry"].nccl_version == "2.18"


def test_the_shipped_profiles_take_reserved_memory_from_the_run() -> None:
    for gpu in ("A100-80GB", "H100"):
        assert default_profile(gpu).reserved_from_run


def test_a_runs_peak_carries_each_stages_reserved_memory() -> None:
    """``sim run``'s peak per stage is the memory model's terms plus that stage's reserved
    memory: the first and last stage hold the tied-embedding communicator, the others not."""
    from sim import api
    from sim.experiment import Experiment

    exp = Experiment.from_dict({
        "name": "reserved", "model": {"preset": "gpt3-1.3b", "seq_length": 1024},
        "cluster": {"preset": "dgx-a100-80g", "num_gpus": 8},
        "parallel": {"tp": 2, "pp": 4, "dp": 1},
        "training": {"micro_batch_size": 1, "global_batch_size": 8}, "schedule": "1f1b"})
    per = R.per_stage(exp, generation_of)
    assert len(per) == 4 and per[0] == per[3] > per[1] == per[2]
    emb = R.nccl_bytes(R.Communicator("embedding", 2, 1, 1), "ampere", 8, 8)
    assert per[0] - per[1] == pytest.approx(emb)
    r = api.simulate(exp, fidelity="full")
    bare = api.simulate(exp, profile=replace(default_profile("A100-80GB"),
                                             reserved_from_run=False, reserved_bytes=0.0),
                        fidelity="full")
    got = [a - b for a, b in zip(r.stats["peak_memory_per_stage_gib"],
                                 bare.stats["peak_memory_per_stage_gib"], strict=True)]
    assert got == pytest.approx([p / GiB for p in per], rel=1e-9)


def test_a_breakdown_is_worked_out_once_per_experiment_and_lookup() -> None:
    """What ``sim.api`` and then ``sim.validate`` / ``sim.corpus`` ask of one experiment is
    worked out once (the same tuple), equal to :func:`by_rank` afresh; another generation
    lookup, or another experiment, is worked out anew."""
    from sim.experiment import Experiment

    data = {"name": "kept", "model": {"preset": "gpt3-1.3b", "seq_length": 1024},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": 16},
            "parallel": {"tp": 2, "pp": 4, "dp": 2},
            "training": {"micro_batch_size": 1, "global_batch_size": 8}, "schedule": "1f1b"}
    exp = Experiment.from_dict(data)
    first = R.breakdown(exp, generation_of)
    assert R.breakdown(exp, generation_of) is first
    cfg = exp.config
    assert first == R.by_rank(exp.placement, exp.cluster, exp.framework, exp.model,
                              cfg.parallel.tp_comm_overlap, cfg.model.seq_length,
                              cfg.training.micro_batch_size, False, generation_of)
    assert R.per_stage(exp, generation_of) == tuple(r.total for r in first)
    hopper = R.breakdown(exp, lambda name: "hopper")
    assert hopper is not first and hopper[0].cublas == R.cublas_bytes("hopper")
    again = Experiment.from_dict(data)
    assert R.breakdown(again, generation_of) == first
    assert again.__dict__["_reserved_breakdown"][1] == first


def test_userbuffers_a_buffer_per_overlapped_gemm_and_three_workspaces() -> None:
    tokens, hidden = 8192, 4096
    assert R.userbuffers_bytes(tokens, hidden, fp8=False) == 10 * 2 * tokens * hidden
    assert R.userbuffers_bytes(tokens, hidden, fp8=True) == (6 * 1 + 4 * 2) * tokens * hidden
    assert R.te_workspace_bytes("hopper") == 3 * 32 * MiB
    assert R.te_workspace_bytes("ampere") == 3 * 4 * MiB


def test_tp_overlap_adds_userbuffers_to_every_stage() -> None:
    from sim.experiment import Experiment

    data = {"name": "ub", "model": {"preset": "gpt3-1.3b", "seq_length": 2048},
            "cluster": {"preset": "dgx-h100", "num_gpus": 8},
            "parallel": {"tp": 4, "pp": 2, "dp": 1, "sequence_parallel": True},
            "training": {"micro_batch_size": 2, "global_batch_size": 8}, "schedule": "1f1b"}
    off = R.per_stage(Experiment.from_dict(data), generation_of)
    data["parallel"]["tp_comm_overlap"] = True
    on = R.per_stage(Experiment.from_dict(data), generation_of)
    want = R.userbuffers_bytes(2048 * 2, 2048, fp8=False) + R.te_workspace_bytes("hopper")
    assert [b - a for a, b in zip(off, on, strict=True)] == pytest.approx([want, want])


def test_an_allocator_reserved_peak_is_compared_without_what_the_allocator_does_not_hold(
        tmp_path) -> None:
    """torchtitan publishes PyTorch's peak reserved bytes: the predicted peak is compared less
    the CUDA context and NCCL buffers (the cuBLAS workspaces are the allocator's)."""
    from sim.corpus import (
        CORPUS_DIR,
        CorpusPrediction,
        compared_peak_gib,
        load_source,
        simulate_corpus_row,
    )
    from sim.experiment import build_experiment

    src = load_source(CORPUS_DIR / "torchtitan_llama31.csv")
    row = src.rows[0]
    assert row.get("peak_memory_measure") == "allocator_reserved"
    p = simulate_corpus_row((row, (1.0, 1.0)))
    r = R.breakdown(build_experiment(row.experiment()), generation_of)[0]
    assert p.outside_allocator_gib * GiB == pytest.approx(r.context + r.nccl + r.nvls)
    assert compared_peak_gib(p) == pytest.approx(p.peak_memory_gib - p.outside_allocator_gib)
    device = CorpusPrediction(load_source(CORPUS_DIR / "dubey2024_llama3_405b.csv").rows[0],
                              1.0, 90.0, True, outside_allocator_gib=3.0)
    assert compared_peak_gib(device) == 90.0
    bad = tmp_path / "bad.csv"
    text = (CORPUS_DIR / "torchtitan_llama31.csv").read_text()
    bad.write_text(text.replace("allocator_reserved", "max_reserved", 1))
    with pytest.raises(Exception, match="peak_memory_measure"):
        load_source(bad)


_DIMS = ("tp", "cp", "dp", "pp")


@st.composite
def _layouts(draw):
    """A placement (any order, degrees 1-4), a GPU of it, every GPU's server (arbitrary
    server ids, not contiguous), groups in any order and whether embeddings are tied."""
    degrees = {d: draw(st.integers(1, 4)) for d in _DIMS}
    order = "-".join(draw(st.permutations(_DIMS)))
    pl = Placement.from_order(order, **degrees)
    n = pl.num_gpus
    hosts = tuple(draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)))
    groups = tuple(draw(st.lists(st.sampled_from(R.NCCL_GROUPS), unique=True)))
    return pl, draw(st.integers(0, n - 1)), hosts, groups, draw(st.booleans())


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_layouts())
def test_communicators_by_strides_are_the_gpu_by_gpu_ones(layout) -> None:
    """The fast path of :func:`by_rank` (each group's GPUs by their strides, the servers read
    by position) describes the same communicators, in the same order, as the reference, with
    the world described there or handed in."""
    pl, gpu, hosts, groups, tied = layout
    want = R.communicators(pl, gpu, groups, hosts.__getitem__, tied)
    assert R._communicators_fast(pl, gpu, groups, hosts, tied, None) == want
    world = R._describe("world", range(pl.num_gpus), hosts.__getitem__)
    assert R._communicators_fast(pl, gpu, groups, hosts, tied, world) == want


@settings(max_examples=150, deadline=None, derandomize=True)
@given(_layouts(), st.randoms(use_true_random=False))
def test_communicators_described_once_per_group_are_the_reference(layout, rng) -> None:
    """:func:`_communicators_fast` with the groups described for other GPUs handed on (one
    dict through every GPU of the placement, in any order, as :func:`by_rank` hands it
    through the stages) describes each GPU's communicators as the reference does."""
    pl, _, hosts, groups, tied = layout
    gpus = list(range(pl.num_gpus))
    rng.shuffle(gpus)
    described: dict = {}
    for gpu in gpus:
        want = R.communicators(pl, gpu, groups, hosts.__getitem__, tied)
        assert R._communicators_fast(pl, gpu, groups, hosts, tied, None, described) == want


@pytest.mark.parametrize("preset, gpus, layout, order, framework, overlap", [
    ("dgx-a100-80g", 64, (2, 1, 4, 8), "tp-cp-dp-pp", "megatron", False),
    ("dgx-a100-80g", 64, (4, 2, 2, 4), "pp-dp-cp-tp", "deepspeed", False),
    ("dgx-h100", 64, (8, 1, 2, 4), "tp-cp-dp-pp", "megatron", True),
    ("dgx-h100", 32, (2, 2, 4, 2), "dp-tp-pp-cp", "fsdp", False),
    ("dgx-h100", 16, (4, 1, 4, 1), "tp-cp-dp-pp", "llm-foundry", True),
])
def test_by_rank_kept_per_layout_equals_the_reference(preset, gpus, layout, order, framework,
                                                      overlap) -> None:
    """:func:`by_rank` (kept per cluster, the communicators by strides) gives
    :func:`by_rank_plain`'s records, a second time the kept tuple; another micro-batch size
    under userbuffers is another key."""
    from sim.experiment import Experiment

    tp, cp, dp, pp = layout
    data = {"name": "k", "model": {"preset": "gpt3-1.3b", "seq_length": 2048},
            "cluster": {"preset": preset, "num_gpus": gpus},
            "parallel": {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "placement": order,
                         "sequence_parallel": tp > 1, "tp_comm_overlap": overlap},
            "training": {"micro_batch_size": 1, "global_batch_size": 8 * dp * cp,
                         "framework": framework},
            "schedule": "1f1b"}
    exp = Experiment.from_dict(data)
    cfg = exp.config
    exp.cluster.memo.pop("reserved_by_rank", None)
    for mbs in (1, 2):
        args = (exp.placement, exp.cluster, exp.framework, exp.model, overlap,
                cfg.model.seq_length, mbs, False, generation_of)
        first = R.by_rank(*args)
        assert first == R.by_rank_plain(*args)
        assert R.by_rank(*args) is first
