"""GPU presets as data (topologies/gpus.toml, read by topologies.hardware.load_gpus)."""

from __future__ import annotations

import tomllib
from importlib.resources import files

import pytest

from topologies.hardware import GB, GPUS, TB, GiB, cuda_visible, load_gpus


def test_every_preset_has_its_peaks_and_source() -> None:
    assert list(GPUS)[:3] == ["A100-40GB", "A100-80GB", "H100"]
    for name, spec in GPUS.items():
        assert spec.name == name and spec.source.strip()
        assert spec.peak_bf16_flops > 0 and spec.hbm_bandwidth_Bps > 0
    h100 = GPUS["H100"]
    assert (h100.peak_bf16_flops, h100.peak_fp8_flops) == (989e12, 1979e12)
    assert h100.hbm_capacity_bytes == 79.11 * GiB
    assert h100.hbm_bandwidth_Bps == 3.35 * TB and h100.nvlink_bandwidth_Bps == 450 * GB
    assert GPUS["A100-80GB"].peak_fp8_flops is None


GOOD = ('[X]\npeak_bf16_tflops = 1\nhbm_gb = 1\nhbm_tbps = 1.0\nnvlink_gbps = 1\n'
        'source = "s"\n')


def test_fp8_and_tdp_are_optional() -> None:
    spec = load_gpus(GOOD)["X"]
    assert spec.peak_fp8_flops is None and spec.tdp_w is None


@pytest.mark.parametrize(("text", "message"), [
    (GOOD + "sparse_tflops = 1\n", r"\[X\]: unknown key 'sparse_tflops'"),
    (GOOD + "cuda_total_gib = 0.9\n", r"\[X\]: cuda_total_gib and cuda_total_source go together"),
    (GOOD + 'cuda_total_source = "s"\n', r"\[X\]: cuda_total_gib and cuda_total_source"),
    (GOOD.replace("hbm_tbps = 1.0\n", ""), r"\[X\]: no hbm_tbps"),
])
def test_a_bad_table_is_refused_naming_it(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_gpus(text)


def test_the_shipped_file_is_what_the_presets_are() -> None:
    text = files("topologies").joinpath("gpus.toml").read_text(encoding="utf-8")
    assert load_gpus(text) == GPUS


MEASURED = {"A100-40GB": 39.39, "H100": 79.11, "H200": 139.81, "B200": 178.35, "MI300X": 191.98,
            "H100-NVL": 93.00, "T4": 14.75}
"""Each preset's CUDA total as its source prints it (gpus.toml cuda_total_source): issue 19."""


def test_a_measured_capacity_is_its_sources_figure_and_the_rest_keep_the_fraction() -> None:
    """A preset with a measured total (PyTorch's "total capacity of X GiB" or deviceQuery's
    totalGlobalMem, on the GPU model its source names) gets exactly that many GiB, and the
    figure is in the source text; one without keeps hbm_gb GiB x CUDA_VISIBLE_FRACTION. The
    A100-80GB, the fraction's own measurement, stays at 79.3 GiB to the byte, so no A100-80GB
    verdict (the Hagemann sweep) can move."""
    tables = tomllib.loads(files("topologies").joinpath("gpus.toml").read_text(encoding="utf-8"))
    measured = {n: t["cuda_total_gib"] for n, t in tables.items() if "cuda_total_gib" in t}
    assert measured == MEASURED
    for name, gib in MEASURED.items():
        assert GPUS[name].hbm_capacity_bytes == gib * GiB
        assert f"{gib:.2f}" in tables[name]["cuda_total_source"], name
        assert GPUS[name].hbm_capacity_bytes != cuda_visible(tables[name]["hbm_gb"]), name
    for name in set(GPUS) - set(MEASURED):
        assert GPUS[name].hbm_capacity_bytes == cuda_visible(tables[name]["hbm_gb"]), name
    assert GPUS["A100-80GB"].hbm_capacity_bytes == 80 * GiB * (79.3 / 80)


def test_power_caps_and_speed_variants_keep_the_measured_capacity() -> None:
    """Variants of a preset (a power cap, a slower die) are copies of its spec: an H100 capped
    at 500 W holds the H100's measured 79.11 GiB, not the fraction's 79.3."""
    from topologies.power import capped
    h100 = GPUS["H100"]
    assert capped(h100, 500).hbm_capacity_bytes == h100.hbm_capacity_bytes == 79.11 * GiB
