"""benchmarks/dgxc_fp8_gap.py: the work it spreads the DGX Cloud FP8-specific gap over."""

from __future__ import annotations

import pytest
from conftest import load_benchmark

from sim.corpus import CORPUS_DIR, load_source


@pytest.fixture(scope="module")
def gap():
    return load_benchmark("dgxc_fp8_gap")


@pytest.mark.parametrize("source", ["dgxc_benchmarking_2411", "dgxc_benchmarking_2502"])
def test_layers_times_microbatches_follow_each_rows_layout(gap, source):
    rows = {r.run: r for r in load_source(CORPUS_DIR / f"{source}.csv").rows}
    # Llama 3.1 70B: 80 layers over PP 4, GBS 128 over DP 2 at micro-batch 1
    assert gap.layer_microbatches(rows["llama3.1-70b-64gpu-fp8"]) == 20 * 64
    # GPT-3 175B: 96 layers over PP 8, GBS 256 over DP 4
    assert gap.layer_microbatches(rows["gpt3-175b-128gpu-fp8"]) == 12 * 64
    # Llama 3.1 405B on 32 GPUs: configure.sh's 7 layers at PP 1, GBS 126 over DP 2
    assert gap.layer_microbatches(rows["llama3.1-405b-32gpu-fp8"]) == 7 * 63
    # every BF16 row has its FP8 twin, which the script pairs by name
    bf16 = [run for run in rows if run.endswith("-bf16")]
    assert len(bf16) == 22 and all(run[:-5] + "-fp8" in rows for run in bf16)
