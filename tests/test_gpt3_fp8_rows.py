"""benchmarks/gpt3_fp8_rows.py: the rows it compares and the settings it swaps."""

from __future__ import annotations

import pytest
from conftest import load_benchmark

from sim.corpus import CORPUS_DIR, load_source


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("gpt3_fp8_rows")


def test_every_gpt3_175b_row_of_the_five_sources(bench):
    counts = {name: len(bench.gpt3_rows(name)) for name in bench.SOURCES}
    assert counts == {"mlperf_training_v30_gpt3": 5, "mlperf_training_v31_gpt3": 8,
                      "dgxc_benchmarking_2411": 10, "dgxc_benchmarking_2502": 10,
                      "nemo2412_fp8": 2}


def test_layers_times_microbatches(bench):
    rows = {r.run: r for r in bench.gpt3_rows("mlperf_training_v31_gpt3")}
    # 96 layers over PP 8; GBS 2048 over DP 16 at micro-batch 1
    assert bench.layer_microbatches(rows["gpt3-175b-512gpu-eos"]) == 12 * 128
    # GBS 2688 over DP 336
    assert bench.layer_microbatches(rows["gpt3-175b-10752gpu-eos"]) == 12 * 8


def test_a_swap_replaces_only_its_columns(bench):
    row = load_source(CORPUS_DIR / "mlperf_training_v31_gpt3.csv").rows[0]
    for values in bench.SWAPS.values():
        new = bench.replaced_row(row, **values)
        changed = {k for k, v in new.values if row.get(k) != v}
        assert changed <= set(values)
        assert all(new.get(k) == v for k, v in values.items())
        new.experiment()  # still a valid row


def test_swap_rows_exist(bench):
    for name, runs in bench.SWAP_ROWS.items():
        present = {r.run for r in load_source(CORPUS_DIR / f"{name}.csv").rows}
        assert set(runs) <= present


def test_recipe_userbuffers_settings(bench):
    from sim.tpoverlap import method_of

    v31 = bench.recipe_methods(4, bulk_margin=False)
    # every GEMM Transformer Engine overlaps, with the method its default gives it
    assert {name: m.name for name, m in v31.items()} == {
        name: method_of(name).name for name in v31}
    assert v31["fc2_fprop"].sms == 4 and v31["proj_fprop"].sms == 24
    assert not any(m.sm_margin for m in v31.values() if m.name == "bulk")
    assert all(m.sm_margin for m in bench.recipe_methods(20, True).values()
               if m.name != "ring_exchange")
