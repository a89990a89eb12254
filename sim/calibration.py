"""Calibrated device profiles, with what was fitted, on which rows, by which command.

The constants are few and physical (achievable fractions of peak per kernel
class; memory the framework holds outside tensors) and shared by every row.
They were fitted by ``benchmarks/calibrate.py`` against Hagemann et al. 2023's
measured sweep (``../shared/data/hagemann2023_sweep.csv``, A100-80GB, NCCL's
link efficiencies fixed from nccl-tests reports in ``topologies/presets.py``);
no per-row factor exists anywhere. Efficiencies are bounded to physical ranges
in the fit; the batched-matmul attention (0.85) sits at its upper bound in both fits.

Refitted on 2026-12-03 after four model corrections (issue 5): GEMMs timed at their
real M x K x N shapes (the efficiency curve sees the cube side (M·K·N)^(1/3),
:func:`workloads.transformer._gemm`, instead of min(tokens, h/t)); SwiGLU stashing
6·f/h and the cross-entropy buffer counted once; fragmentation on dynamic memory only;
the sweep's loss over gathered logits and eager RMSNorm's fp32 saved input
(:data:`sim.validate.VOCAB_PARALLEL_LOSS`, :meth:`TransformerCosts.layer_activation_bytes`).
Collectives: the lowering's NCCL-like ``auto`` algorithm choice.

Refitted again on 2026-12-03 after three corrections that model the sweep's framework
(Aleph Alpha's ``scaling``, read from its source; :mod:`sim.validate`): its pipeline
split (:func:`sim.validate.framework_stage_layers`: the embedding, final norm and head
take layer slots, so first and last stages run fewer layers), its sequence parallelism
saving the all-gathered GEMM inputs (``sp_saves_gathered_input``), the two fp32
logit-sized buffers of PyTorch's cross-entropy backward
(:meth:`workloads.transformer.TransformerCosts.transient_bytes`) and its fp32 gradient
all-reduce with a bf16 parameter all-gather after the step (``dp_wire_bytes`` = 5).
Command: ``python benchmarks/calibrate.py --cache sens.npz`` (12 min on 2 shared cores).

Memory refitted (fragmentation only; the step-time constants are unchanged, as memory does
not change step times) after two memory corrections: the last stage's backward holds the
larger of its loss phase and its layers' phase, not their sum (the loss's backward frees
the stashed logits before the layers' backward runs), and the sweep's framework keeps the
previous micro-batch's bf16 logits in its pipeline buffer (``kept_stage_outputs``, read
from ``scaling``'s ``ParallelModule``: the last stage never takes its output out of the
buffer; :data:`sim.validate.FRAMEWORK`).
"""

from __future__ import annotations

from sim.device import DeviceProfile

GiB = 2**30
MEMORY_RESERVED_GIB = 1.0
"""Not fitted: memory outside tensors, from documented sizes: the CUDA context (about
0.3-1 GiB on A100 depending on CUDA version and lazy module loading), NCCL's buffers
(NCCL_BUFFSIZE 4 MiB per channel and peer, for the TP, DP and PP communicators: a few
hundred MiB) and cuBLAS workspaces (PyTorch's default 8 x 4 MiB). An estimate: the OOM
labels barely constrain it (the best accuracy varies by 0.3 points from 0 to 2.5 GiB)."""
MEMORY_FRAGMENTATION = 0.42
"""Fitted: the caching allocator's overhead, and the working buffers of ops the memory
model does not list, as a fraction of the dynamic memory (activations and working
buffers above the static model state), on the OOM labels of all 964 runs: 97.8%, the
best accuracy, reached from 0.42 to 0.43 (``fit_memory`` takes the smallest; 0.40-0.48 all
give 97.5-97.8% and 7 best-layout hits). Fitted against what CUDA gives the framework on
an A100-80GB, 79.3 GiB (:data:`topologies.hardware.CUDA_VISIBLE_FRACTION`); it was 0.31
(97.3%) against 80e9 bytes (74.5 GiB), which undercounted the binary-sized HBM, before that
0.35 (97.1%) before the last stage's backward counted the larger of its loss and layer
phases and the framework's kept logits
(:meth:`workloads.transformer.TransformerCosts.transient_bytes`), and 0.32 (96.3%)
before the framework corrections of 2026-12-03. Step times do not depend on it."""

_TIME_FIT = (
    "benchmarks/calibrate.py --cache ({date}): bounded least squares on the relative "
    "step-time error of {rows}, linearised around the defaults by finite differences"
)
_MEMORY_FIT = ("fragmentation of dynamic memory: grid search on the OOM labels of all 964 runs; "
               "reserved bytes from documented sizes")

def _fitted(x: tuple[float, ...], rows: str, date: str = "2026-12-02") -> DeviceProfile:
    """A profile from the fit's x = (1/η_gemm, d½/η_gemm, 1/η_flash2, 1/η_flash1, 1/η_bmm,
    1/η_elementwise), as benchmarks/calibrate.py prints it."""
    return DeviceProfile(
        gemm_efficiency=1 / x[0],
        gemm_half_dim=x[1] / x[0],
        flash2_efficiency=1 / x[2],
        flash1_efficiency=1 / x[3],
        bmm_attention_efficiency=1 / x[4],
        hbm_efficiency=0.85,
        elementwise_efficiency=1 / x[5],
        reserved_bytes=MEMORY_RESERVED_GIB * GiB,
        fragmentation=MEMORY_FRAGMENTATION,
        source=_TIME_FIT.format(rows=rows, date=date) + "; " + _MEMORY_FIT,
    )


A100_HAGEMANN = _fitted((1.1091, 2524.885, 1.4734, 3.3459, 1.1765, 1.9653),
                        "all 401 successful runs", "2026-12-03")
"""A100-80GB profile fitted on the whole sweep: the default on A100s; other GPUs carry it over
by published kernel ratios (:mod:`sim.gpu_profiles`, :func:`default_profile`)."""

"""η_gemm 0.902, d½ 2277 (cube side), η_flash2 0.679, η_flash1 0.299, η_bmm 0.85 (at its
bound), η_elementwise 0.509. Linearised MAPE 5.25% on its rows (simulated: 5.25%). Before
the framework corrections the same fit gave (1.0762, 2458.9793, 1.25, 3.5831, 1.4524,
1.9541), 5.74%, with FlashAttention-2 at its 0.80 bound; the fit of 2026-12-02 on the
min(tokens, h/t) GEMM shape (1.2028, 714.6956, 1.25, 3.1509, 1.1765, 2.1087) gave 5.94%."""

A100_HAGEMANN_13B = _fitted((1.2691, 1097.6884, 1.9267, 3.5192, 1.1765, 1.9293),
                            "the 165 successful LLaMA-13B runs only", "2026-12-03")
"""The same fit restricted to the LLaMA-13B rows, for cross-validation on 30B and 65B
(linearised MAPE 4.83% on its rows, 7.07% simulated on the held-out 30B and 65B runs;
7.51% before the framework corrections)."""


def default_profile(gpu_name: str) -> DeviceProfile:
    """The profile ``sim run`` uses for ``gpu_name``: the A100 fit on A100s; on H100, H200,
    B200, GB200 and MI300X the A100 fit carried over by published kernel benchmarks.

    Each compute efficiency of :data:`A100_HAGEMANN` is multiplied by the ratio of the two
    GPUs' measured fractions of peak for that kernel class (matmul, FlashAttention), from one
    source per class; classes without a public benchmark follow one conservative rule. The
    numbers, sources and which classes are measured or inferred per GPU are in
    :mod:`sim.gpu_profiles`.
    """
    from sim.gpu_profiles import profile_for

    return profile_for(gpu_name, A100_HAGEMANN)
