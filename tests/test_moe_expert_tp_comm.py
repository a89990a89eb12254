"""A MoE layer's TP traffic as Megatron-core's all-to-all dispatcher sends it (issue 19/20):
no b·s·h gather of the layer's input over the attention TP group, the dispatched copies
gathered (and the experts' outputs reduce-scattered) over the expert TP group instead."""

from __future__ import annotations

import pytest
from test_expert_tp import _collectives, _data

from sim.experiment import build_experiment
from workloads.costs import CommSeg

TOKENS, H, K = 1024, 4096, 2
BF16 = 2


def _moe_comm(d: dict) -> list[CommSeg]:
    costs = build_experiment(d).costs
    segs = costs._layer(0).moe_layer_segments(backward=False)
    return [s for s in segs if isinstance(s, CommSeg)]


@pytest.mark.parametrize(("etp", "tp", "dp", "ep"), [(None, 2, 4, 4), (4, 2, 4, 2), (2, 4, 2, 2)])
def test_expert_gather_bytes_closed_form(etp: int | None, tp: int, dp: int, ep: int) -> None:
    """All-gather and reduce-scatter of b·s/(cp·t)·k·e·h bf16 over the expert TP group, the
    dense MLP's b·s·h ones gone; the all-to-alls move b·s/(cp·t)·k·h."""
    e = tp if etp is None else etp
    comm = _moe_comm(_data(etp, tp=tp, dp=dp, ep=ep))
    group = "tp" if etp is None else "etp"
    tp_ops = [(s.op, s.group, s.nbytes) for s in comm if s.kind == "tp"]
    gathered = BF16 * TOKENS / tp * K * e * H
    assert tp_ops[-2:] == [("all_gather", group, gathered), ("reduce_scatter", group, gathered)]
    assert [s.nbytes for s in comm if s.kind == "ep"] == [BF16 * TOKENS / tp * K * H] * 2


def test_expert_tp_one_has_no_tp_collective_in_the_moe_mlp() -> None:
    """e = 1: the attention's TP collectives only."""
    comm = _moe_comm(_data(1))
    assert [s.label.split()[-1] for s in comm if s.kind == "tp"] == ["all-gather",
                                                                     "reduce-scatter"]
    assert all("attn" in s.label for s in comm if s.kind == "tp")


def test_etp_collectives_run_over_the_expert_tp_groups() -> None:
    """e = 4 over tp = 2: the expert gathers span two TP groups (4 GPUs, L mod 4)."""
    groups = {i.group for i in _collectives(_data(4, tp=2, dp=4, ep=2))
              if "expert all-gather" in i.name}
    assert groups == {(0, 1, 2, 3), (4, 5, 6, 7)}
