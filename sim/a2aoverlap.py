"""MoE all-to-all overlap (``parallel.moe_a2a_overlap``): Megatron-core's EP communication
overlap, ``--overlap-moe-expert-parallel-comm`` (``moe_a2a_overlap`` in Megatron-Bridge's
recipes; ``megatron/core/pipeline_parallel/combined_1f1b.py`` and
``megatron/core/models/common/model_chunk_schedule_plan.py``).

In the 1F1B steady state Megatron merges the forward of one micro-batch with the backward of
another, layer by layer, and runs each one's all-to-alls on a communication stream while
the other computes (the DeepSeek-V3 report's overlap of two micro-batches, DeepSeek-AI 2024,
sec. 3.2.1): the backward's combine gradient under the forward's attention, the forward's
dispatch under the backward's expert MLP, the backward's dispatch gradient under the
forward's expert MLP, the forward's combine under the backward's attention. Each all-to-all
is then exposed only by what its partner compute leaves; the lowering runs it for that fixed
time (:attr:`TransformerCosts.ep_comm_exposed_s`). The all-to-all kernels take ``k`` of the
GPU's ``S`` SMs while they run (DeepEP's, ``sim/data/a2a_overlap.toml``), so a partner of
``g`` seconds alone runs on the rest meanwhile: the pair takes max(c, g + c·k/S) for an
all-to-all of ``c`` seconds, and the all-to-all is exposed by max(c − g, c·k/S); NCCL's
all-to-all dispatcher takes the share :mod:`sim.contention` gives NCCL's kernels (18.9%)
for k/S.

Simplifications: the all-to-all is timed alone on pipeline rank 0's EP groups (the partner's
own traffic is not on the network); the pipeline's warm-up forwards and cool-down backwards,
which have no partner, are treated as overlapped as well; the partner compute is a MoE
layer's (a chunk's dense first layers have no all-to-all); a backward that recomputes the
MoE block (``recompute_modules`` ``moe``) exposes its rerun forward's all-to-alls as the
forward's.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from base.errors import ConfigError
from base.replaced import replaced
from sim.commtime import CollectiveTimer
from sim.contention import mechanism, share
from sim.tpoverlap import sm_count
from workloads.costs import CommSeg, ComputeSeg, Segment
from workloads.lowering.groups import ALL_TO_ALL_ALGO, ep_groups
from workloads.transformer import TransformerCosts

if TYPE_CHECKING:
    from sim.experiment import Experiment

DATA_FILE = Path(__file__).parent / "data" / "a2a_overlap.toml"
"""SMs each MoE dispatcher's all-to-all kernels take, with their source."""


@cache
def dispatcher_sms(dispatcher: str) -> int:
    """SMs the all-to-all kernels of ``dispatcher`` (``parallel.moe_dispatcher``) run on (0:
    not given)."""
    with DATA_FILE.open("rb") as fh:
        return int(tomllib.load(fh)[dispatcher]["sms"])


def sm_share(dispatcher: str, gpu: str) -> float:
    """k/S: the share of GPU ``gpu``'s SMs the dispatcher's all-to-all kernels take (0 where
    either count is not known); for NCCL's all-to-all (``moe_alltoall`` in
    :mod:`sim.contention`'s table), NCCL's measured contention share."""
    if mechanism(f"moe_{dispatcher}") == "nccl":
        return share(f"moe_{dispatcher}")
    sms = sm_count(gpu)
    return dispatcher_sms(dispatcher) / sms if sms else 0.0

def _phases(segs: Sequence[Segment], compute_s: Callable[[ComputeSeg], float]
            ) -> tuple[float, float, float, CommSeg]:
    """Compute seconds before the layer's own first all-to-all, between its two, after the
    second, and the first all-to-all. The own two are the last two: a backward that
    recomputes the MoE block (``recompute_modules`` ``moe``) reruns the forward's two before
    them, and those count as compute before."""
    ep = [i for i, seg in enumerate(segs) if isinstance(seg, CommSeg) and seg.group == "ep"]
    assert len(ep) in (2, 4), "a MoE layer has two all-to-alls (four with the block recomputed)"
    ep = ep[-2:]

    def busy(part: Sequence[Segment]) -> float:
        return sum(compute_s(seg) for seg in part if isinstance(seg, ComputeSeg))
    first = segs[ep[0]]
    assert isinstance(first, CommSeg)
    return (busy(segs[:ep[0]]), busy(segs[ep[0] + 1:ep[1]]), busy(segs[ep[1] + 1:]), first)


def exposed_s(costs: TransformerCosts, compute_s: Callable[[ComputeSeg], float],
              a2a_s: Callable[[CommSeg], float], share: float = 0.0
              ) -> tuple[tuple[str, float], ...]:
    """Exposed seconds of each all-to-all of a MoE layer under the combined 1F1B overlap
    (module docstring), by the name :attr:`TransformerCosts.ep_comm_exposed_s` keys;
    ``share``: k/S, the SMs the all-to-all kernels take from the partner compute."""
    attn_f, mlp_f, _, dispatch = _phases(costs.moe_layer_segments(False), compute_s)
    _, mlp_b, attn_b, combine_grad = _phases(costs.moe_layer_segments(True), compute_s)
    t_fwd, t_bwd = a2a_s(dispatch), a2a_s(combine_grad)

    def exposed(c: float, g: float) -> float:
        return max(0.0, c - g, c * share)
    return (("dispatch", exposed(t_fwd, mlp_b)), ("combine", exposed(t_fwd, attn_b)),
            ("combine grad", exposed(t_bwd, attn_f)),
            ("dispatch grad", exposed(t_bwd, mlp_f)))


def check(ep: int, moe: bool) -> None:
    """ConfigError where there is no all-to-all to overlap."""
    if not moe or ep == 1:
        raise ConfigError(f"parallel.moe_a2a_overlap: needs a mixture-of-experts model with "
                          f"expert parallelism (parallel.ep={ep}): there is no all-to-all")


def lowering_costs(exp: Experiment, costs: Any,
                   compute_s: Callable[[ComputeSeg], float]) -> Any:
    """``costs`` with the all-to-alls' exposed times under ``parallel.moe_a2a_overlap``
    (unchanged without it), each all-to-all timed as the lowering times it (pairwise, its
    dropless imbalance's unequal volumes) alone on pipeline rank 0's EP groups, the compute
    by ``compute_s``, the dispatcher's SMs taken from it (:func:`sm_share`)."""
    if not exp.config.parallel.moe_a2a_overlap or not isinstance(costs, TransformerCosts):
        return costs
    groups = ep_groups(exp.placement, 0, costs.ep, costs.expert_tp)

    def a2a_s(seg: CommSeg) -> float:
        timer = (CollectiveTimer.shared(exp.cluster, ALL_TO_ALL_ALGO) if seg.skew[0] == 1.0
                 else CollectiveTimer(exp.cluster, ALL_TO_ALL_ALGO, skew=seg.skew))
        return timer(seg.op, groups, seg.nbytes)
    share = sm_share(costs.moe_dispatcher, exp.cluster.gpu.name)
    return replaced(costs, ep_comm_exposed_s=exposed_s(costs, compute_s, a2a_s, share))
