"""GPU presets as data (topologies/gpus.toml, read by topologies.hardware.load_gpus)."""

from __future__ import annotations

from importlib.resources import files

import pytest

from topologies.hardware import GB, GPUS, TB, cuda_visible, load_gpus


def test_every_preset_has_its_peaks_and_source() -> None:
    assert list(GPUS)[:3] == ["A100-40GB", "A100-80GB", "H100"]
    for name, spec in GPUS.items():
        assert spec.name == name and spec.source.strip()
        assert spec.peak_bf16_flops > 0 and spec.hbm_bandwidth_Bps > 0
    h100 = GPUS["H100"]
    assert (h100.peak_bf16_flops, h100.peak_fp8_flops) == (989e12, 1979e12)
    assert h100.hbm_capacity_bytes == cuda_visible(80)
    assert h100.hbm_bandwidth_Bps == 3.35 * TB and h100.nvlink_bandwidth_Bps == 450 * GB
    assert GPUS["A100-80GB"].peak_fp8_flops is None


GOOD = ('[X]\npeak_bf16_tflops = 1\nhbm_gb = 1\nhbm_tbps = 1.0\nnvlink_gbps = 1\n'
        'source = "s"\n')


def test_fp8_and_tdp_are_optional() -> None:
    spec = load_gpus(GOOD)["X"]
    assert spec.peak_fp8_flops is None and spec.tdp_w is None


@pytest.mark.parametrize(("text", "message"), [
    (GOOD + "sparse_tflops = 1\n", r"\[X\]: unknown key 'sparse_tflops'"),
    (GOOD.replace("hbm_tbps = 1.0\n", ""), r"\[X\]: no hbm_tbps"),
])
def test_a_bad_table_is_refused_naming_it(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_gpus(text)


def test_the_shipped_file_is_what_the_presets_are() -> None:
    text = files("topologies").joinpath("gpus.toml").read_text(encoding="utf-8")
    assert load_gpus(text) == GPUS
