"""The H100's attention rates read at matched conditions from the kernel papers' figures.

    python benchmarks/hopper_attention.py

The H100 profile rates FlashAttention-2 by the ratio of two abstracts (35% of peak on H100,
Shah et al. 2024, over 73% on A100, Dao 2023: ``[H100.flash2]`` of sim/profiles/hopper.toml).
This prints, for sequence 512-16k at head dimension 128 (the corpus's dense models'), the
matched-conditions readings of the figures recorded in the data files (``[A100.flash2_benchmark]``,
``[H100.flash2_benchmark]``, ``[H100.fa3_paper_benchmark]``): FA2's fraction of peak on each GPU,
forward + backward, causal, and their ratio; the same ratio with the FA3 paper's later FA2 build
on H100; cuDNN's fused attention and FA3 over FA2 within the FA3 paper, and chained onto the
matched FA2 ratio. Beside them, the shipped ratios. Nothing here is read by the simulator
(docs/hopper-attention.md says why the matched readings are not shipped).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.gpu_profiles import RATIOS  # noqa: E402
from sim.profiles import load  # noqa: E402

BACKWARD_FLOPS = 2.5
"""A backward pass's FLOPs over its forward's, as the FlashAttention papers count them."""


def forward_backward(forward: float, backward: float) -> float:
    """The throughput of a forward and its backward run together, each at its own rate."""
    return (1 + BACKWARD_FLOPS) / (1 / forward + BACKWARD_FLOPS / backward)


def readings() -> list[dict[str, float]]:
    """One row per sequence length of the figures: the matched-conditions readings."""
    a100 = load("ampere")["A100"]["flash2_benchmark"]
    h100 = load("hopper")["H100"]
    fa2, fa3p = h100["flash2_benchmark"], h100["fa3_paper_benchmark"]
    assert a100["sequence"] == fa2["sequence"] == fa3p["sequence"]
    rows = []
    for i, seq in enumerate(a100["sequence"]):
        a = a100["causal_tflops"][i] / a100["peak_tflops"]
        h = fa2["causal_tflops"][i] / fa2["peak_tflops"]
        both = {k: forward_backward(fa3p[f"{k}_forward_causal_tflops"][i],
                                    fa3p[f"{k}_backward_tflops"][i])
                for k in ("flash2", "cudnn", "flash3")}
        ratio = h / a
        rows.append({
            "sequence": seq, "a100_fa2": a, "h100_fa2": h, "flash2": ratio,
            "flash2_fa3_paper": both["flash2"] / fa3p["peak_tflops"] / a,
            "cudnn_over_fa2": both["cudnn"] / both["flash2"],
            "flash3_over_fa2": both["flash3"] / both["flash2"],
            "cudnn": ratio * both["cudnn"] / both["flash2"],
            "flash3": ratio * both["flash3"] / both["flash2"],
        })
    return rows


def main() -> None:
    shipped = RATIOS["H100"]
    print("seq    A100 FA2  H100 FA2  FA2 ratio  (FA3 paper's FA2)  cuDNN/FA2  FA3/FA2  "
          "cuDNN ratio  FA3 ratio")
    for r in readings():
        print(f"{r['sequence']:5d}  {r['a100_fa2']:8.3f}  {r['h100_fa2']:8.3f}  {r['flash2']:9.3f}"
              f"  {r['flash2_fa3_paper']:17.3f}  {r['cudnn_over_fa2']:9.3f}  "
              f"{r['flash3_over_fa2']:7.3f}  {r['cudnn']:11.3f}  {r['flash3']:9.3f}")
    print(f"shipped                     {shipped.flash2:9.3f}  {'':17s}  "
          f"{shipped.cudnn / shipped.flash2:9.3f}  {shipped.flash3 / shipped.flash2:7.3f}  "
          f"{shipped.cudnn:11.3f}  {shipped.flash3:9.3f}")


if __name__ == "__main__":
    main()
