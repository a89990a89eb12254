"""The TP collectives of the vocabulary-parallel input embedding and output layer
(:meth:`workloads.layer_work.LayerWork._embedding_tp` and ``_head_tp``): which appear, on which
stage, with how many bytes, per micro-batch."""

from __future__ import annotations

import pytest

from sim import api
from sim.experiment import build_experiment
from workloads.costs import CommSeg, ComputeSeg
from workloads.lowering.groups import tp_groups
from workloads.program import Collective
from workloads.schedules import BACKWARD, FORWARD, Op

HEAD_AND_EMBEDDING = ("embedding", "head", "logits")


def _exp(tp: int, sp: bool, pp: int = 2, framework: str = "megatron") -> dict:
    return {"name": "vp", "model": {"preset": "llama2-13b", "num_layers": 4, "seq_length": 4096},
            "cluster": {"preset": "dgx-h100", "num_gpus": tp * pp},
            "parallel": {"tp": tp, "pp": pp, "sequence_parallel": sp},
            "training": {"micro_batch_size": 1, "num_microbatches": 4, "recompute": "none",
                         "framework": framework}}


def _collectives(costs, op: Op) -> list[tuple[str, str, float]]:
    return [(s.label, s.op, s.nbytes) for s in costs.op_segments(op, False)
            if isinstance(s, CommSeg) and s.label.startswith(HEAD_AND_EMBEDDING)]


@pytest.mark.parametrize("sp", [False, True])
def test_megatron_embedding_and_head_collectives(sp: bool) -> None:
    """b·s·h bf16 each: the embedding's forward all-reduce (reduce-scatter under SP, rotary
    positions) and, under SP, its gradient's all-gather, on stage 0 only; the head's
    backward all-reduce of the input gradient (under SP: forward all-gather, backward
    second all-gather and reduce-scatter) on the last stage only."""
    costs = build_experiment(_exp(4, sp)).costs
    bsh = 2.0 * 4096 * 5120
    first = {k: _collectives(costs, Op(0, k, 0)) for k in (FORWARD, BACKWARD)}
    last = {k: _collectives(costs, Op(1, k, 0)) for k in (FORWARD, BACKWARD)}
    if sp:
        assert first[FORWARD] == [("embedding reduce-scatter", "reduce_scatter", bsh)]
        assert first[BACKWARD] == [("embedding bwd all-gather", "all_gather", bsh)]
        assert last[FORWARD] == [("head all-gather", "all_gather", bsh)]
        assert last[BACKWARD] == [("head bwd input all-gather", "all_gather", bsh),
                                  ("head bwd reduce-scatter", "reduce_scatter", bsh)]
    else:
        assert first[FORWARD] == [("embedding all-reduce", "all_reduce", bsh)]
        assert first[BACKWARD] == []
        assert last[FORWARD] == []
        assert last[BACKWARD] == [("head bwd all-reduce", "all_reduce", bsh)]
    # the embedding's comes first in the forward, the head's input gradient after its GEMMs
    fwd = costs.op_segments(Op(0, FORWARD, 0), False)
    assert isinstance(fwd[0], CommSeg) and fwd[0].label.startswith("embedding")
    bwd = costs.op_segments(Op(1, BACKWARD, 0), False)
    labels = [s.label for s in bwd]
    at = labels.index("head bwd reduce-scatter" if sp else "head bwd all-reduce")
    assert isinstance(bwd[at - 1], ComputeSeg) and labels[at + 1].startswith("L3")


def test_learned_positions_all_reduce_then_split_under_sp() -> None:
    """Megatron-core reduce-scatters the embedding only without learned positions
    (``reduce_scatter_embeddings``); with them it all-reduces and splits."""
    costs = build_experiment(_exp(4, True)).costs
    gpt = build_experiment(_exp(4, True) | {"model": {"preset": "gpt3-1.3b", "num_layers": 4,
                                                      "seq_length": 2048}}).costs
    assert gpt.model.position_embedding == "learned"
    assert [c[:2] for c in _collectives(gpt, Op(0, FORWARD, 0))] == [
        ("embedding all-reduce", "all_reduce")]
    assert costs.model.position_embedding != "learned"


def test_none_at_tp_1_and_per_micro_batch_in_the_program() -> None:
    """No such collective at TP 1; in the simulated program each GPU of a stage runs one set
    per micro-batch."""
    one = build_experiment(_exp(1, False))
    assert not any(i.name.split(" ", 1)[-1].startswith(HEAD_AND_EMBEDDING)
                   for i in api.simulate(one).program.instructions if isinstance(i, Collective))
    exp = build_experiment(_exp(2, True))
    names = [i.name.split(" ", 1)[1] for i in api.simulate(exp).program.instructions
             if isinstance(i, Collective) and i.gpu == 0]
    assert names.count("embedding reduce-scatter") == 4
    assert names.count("embedding bwd all-gather") == 4
    assert not any(n.startswith("head") for n in names)  # stage 0 holds no head
    tail = [i.name.split(" ", 1)[1] for i in api.simulate(exp).program.instructions
            if isinstance(i, Collective) and i.gpu == tp_groups(exp.placement, 1)[0][0]]
    for name in ("head all-gather", "head bwd input all-gather", "head bwd reduce-scatter"):
        assert tail.count(name) == 4


def test_logits_gathered_where_the_loss_is_not_vocabulary_parallel() -> None:
    """scaling's head all-gathers its logits (b·s·V bf16) before the loss."""
    costs = build_experiment(_exp(2, False, framework="scaling")).costs
    assert not costs.vocab_parallel_loss
    assert ("logits all-gather", "all_gather", 2.0 * 4096 * 32000) in _collectives(
        costs, Op(1, FORWARD, 0))
