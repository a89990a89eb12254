"""NeMo-Megatron-Launcher's release-performance CI memory records
(sim/data/validation/nemo_megatron_launcher_ci2022_memory.csv): which are measurements, the
memory model's terms against them, and the bound they put on the caching allocator's overhead
of the ``nemo-launcher-2022`` profile (docs/memory-gaps.md, "Eighth pass")."""

from __future__ import annotations

import csv

import pytest

from sim.corpus import CORPUS_DIR, corpus_files, load_source
from sim.experiment import build_experiment
from tests.conftest import load_benchmark
from workloads.frameworks import FRAMEWORKS

MiB, GiB = 2**20, 2**30
RECORDS = CORPUS_DIR / "nemo_megatron_launcher_ci2022_memory.csv"
CI = CORPUS_DIR / "nemo_megatron_launcher_ci2022.csv"


@pytest.fixture(scope="module")
def records() -> list[dict]:
    with RECORDS.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def sourced(records) -> dict[str, object]:
    """Each corpus row with a valid record: rank 0's breakdown (the first node holds pipeline
    stage 0 in every layout: TP x DP >= 8)."""
    mb = load_benchmark("memory_breakdown")
    rows = {r.run: r for r in load_source(CI).rows}
    return {rec["corpus_run"]: mb.breakdown(build_experiment(rows[rec["corpus_run"]]
                                                             .experiment()))[0]
            for rec in records if rec["valid"] == "true" and rec["corpus_run"]}


def test_the_records_file_is_not_a_corpus_source(records) -> None:
    """Every gpt3 memory record the CI published (78 at 4665f400's history: 39 of build
    22.08.11, 39 of build 22.09), kept beside the corpus but not read as a source."""
    assert RECORDS not in corpus_files()
    assert len(records) == 78
    builds = [r["build"] for r in records]
    assert builds.count("nvcr.io/nvidian/bignlp-training:22.08.11-py") == 39
    assert builds.count("nvcr.io/nvidian/bignlp-train:22.09-5befb680") == 39


def test_only_caching_off_records_of_the_timing_build_are_valid(records) -> None:
    """Valid: build 22.08.11 (the timing rows' build), measured before ec6a30b6 (2022-10-05
    01:30 UTC) changed the memory job's allocator setting, so with
    PYTORCH_NO_CUDA_MEMORY_CACHING=1; O2 jobs that trained, at least 5B. The 22.09 records
    (the setting not established) and the O1 jobs (which never trained) are not."""
    valid = [r for r in records if r["valid"] == "true"]
    assert len(valid) == 19
    for r in valid:
        assert r["build"].endswith("22.08.11-py") and r["amp"] == "O2"
        assert r["measured_utc"] < "2022-10-05 01:30"
        assert r["allocator_setting"] == "PYTORCH_NO_CUDA_MEMORY_CACHING=1"
    for r in records:
        if r["build"].endswith("22.09-5befb680"):
            assert r["valid"] == "false" and r["allocator_setting"] == "not established"
        if r["amp"] == "O1":
            assert r["valid"] == "false"
    assert sum(1 for r in valid if r["corpus_run"]) == 18


def test_the_memory_models_terms_sit_just_under_every_valid_record(records, sourced) -> None:
    """The memory model's peak without the allocator's overhead (weights, gradient buffer,
    optimizer shards, stash, working memory and the run's reserved memory: eager-loaded CUDA
    context, cuBLAS workspaces, NCCL's ring and tree buffers of each communicator,
    sim/reserved.py) against the caching-off record of the same layout: below it everywhere,
    by 0.86-1.81 GiB (1.2-2.5 GiB with the former constant 1 GiB reserved): no term
    overcounted, and about 1.3 GiB still missing on this stack (docs/reserved-memory.md)."""
    gaps = {}
    for rec in records:
        if rec["valid"] == "true" and rec["corpus_run"]:
            m = sourced[rec["corpus_run"]]
            gaps[rec["corpus_run"]] = (int(rec["memory_used_mib"]) * MiB
                                       - (m.static + m.dynamic + m.reserved)) / GiB
    assert len(gaps) == 18
    assert all(0.85 < g < 1.85 for g in gaps.values()), gaps
    assert sum(gaps.values()) / len(gaps) == pytest.approx(1.27, abs=0.01)
    assert gaps["gpt3-5b-tp1-pp1-32gpu"] == pytest.approx(1.75, abs=0.01)
    assert gaps["gpt3-5b-tp1-pp1-128gpu"] == pytest.approx(1.37, abs=0.01)


def test_the_profiles_allocator_overhead_is_within_the_records_bound(records, sourced) -> None:
    """The 22.08.11 timing run of 5B TP 1 PP 1 on 4 nodes (caching allocator on) ran on the
    80 GB GPUs; the same layout's caching-off record reads 79,434 MiB, so the caching
    allocator added at most capacity - record: 1.73 GiB, 0.0387 of the memory model's dynamic
    memory (16 nodes: 0.077). The profile's own overhead is set just under the tightest bound;
    the fitted 0.24 of the A100 sweep (10.7 GiB here) is outside both TP 1 bounds. With it
    both TP 1 rows fit."""
    bounds = {}
    for rec in records:
        if rec["valid"] == "true" and rec["corpus_run"]:
            m = sourced[rec["corpus_run"]]
            bounds[rec["corpus_run"]] = (m.capacity - int(rec["memory_used_mib"]) * MiB) / m.dynamic
    tight = min(bounds, key=bounds.get)
    assert tight == "gpt3-5b-tp1-pp1-32gpu"
    assert bounds[tight] == pytest.approx(0.0387, abs=1e-4)
    assert bounds["gpt3-5b-tp1-pp1-128gpu"] == pytest.approx(0.0767, abs=1e-4)
    frag = FRAMEWORKS["nemo-launcher-2022"].fragmentation
    assert frag == 0.038 and bounds[tight] - 0.001 < frag <= bounds[tight]
    assert 0.24 > max(bounds[r] for r in ("gpt3-5b-tp1-pp1-32gpu", "gpt3-5b-tp1-pp1-128gpu"))
    for run in ("gpt3-5b-tp1-pp1-32gpu", "gpt3-5b-tp1-pp1-128gpu"):
        m = sourced[run]
        assert m.fragmentation == frag and m.peak < m.capacity
    assert "79,434 MiB" in FRAMEWORKS["nemo-launcher-2022"].source("fragmentation")
