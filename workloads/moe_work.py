"""The mixture-of-experts layer of the transformer cost model. Pure.

Sources:
- Mixture of experts: router + top-k experts per token, all-to-all dispatch and
  combine over the EP group (Fedus et al. 2021; Megatron-LM MoE); the flex dispatcher's
  destinations in :mod:`workloads.moe_dispatch`.
"""

from __future__ import annotations

from dataclasses import replace

from workloads.costs import BF16, CommSeg, ComputeSeg, Segment
from workloads.kernels import gemm
from workloads.moe_dispatch import expected_units
from workloads.program import EQUAL_VOLUMES


class MoEWork:
    """The mixture-of-experts MLP of a :class:`~workloads.transformer.TransformerCosts` (a
    mixin of it): router, routed and shared experts' GEMMs, the token copies each GPU routes,
    dispatches and computes, the EP all-to-alls and the expert TP gathers around them."""

    @property
    def _routed_rows(self) -> float:
        """Token copies routed from the tokens of this GPU's TP group per micro-batch:
        b·s/cp·k·max(c, 1) with a capacity factor; dropless, b·s/cp·k times the routing
        imbalance on the busiest EP rank (:meth:`workloads.models.MoESpec.load_factor`)."""
        moe = self.model.moe
        assert moe is not None
        return self._tokens * moe.top_k * moe.load_factor(self.ep)

    @property
    def _expert_rows(self) -> float:
        """Token copies this GPU's experts compute per micro-batch: :attr:`_routed_rows`
        times e/tp, the expert TP group's gathered share (all of them with e = tp)."""
        if self.expert_tp is None:
            return self._routed_rows
        return self._routed_rows * (self.expert_tp / self.tp)

    @property
    def _dispatched_rows(self) -> float:
        """Token copies one GPU's TP group dispatches per micro-batch: :attr:`_routed_rows`
        (``alltoall``, each routed copy), or with ``flex`` b·s/cp·D times the load factor, D the
        expected distinct destination units (:func:`workloads.moe_dispatch.expected_units`:
        the ep_servers servers when the EP group spans several, else its ep GPUs). As a
        pairwise all-to-all of b·s·D·h bytes per GPU, (N − 1)/N of them leave the server on
        N servers, b·s·h·D·(N − 1)/N: one copy to each remote destination server, as DeepEP's
        RDMA phase sends; the NVLink forwarding inside the destination server is taken as
        the pairwise plan's intra-server share (NVLink is rarely the bound)."""
        moe = self.model.moe
        assert moe is not None
        if self.moe_dispatcher == "alltoall":
            return self._routed_rows
        units = self.ep_servers if self.ep_servers > 1 else self.ep
        return self._tokens * moe.load_factor(self.ep) * expected_units(
            moe.num_experts, moe.top_k, units, moe.router_num_groups, moe.router_group_topk)

    def _expert_gemms(self) -> ComputeSeg:
        """Router and expert GEMMs of one MoE layer on one GPU (Fedus et al. 2021, sec. 2).

        Router: 2·n·h·E FLOPs on the GPU's n tokens (n/t, its sequence-parallel share, under
        :attr:`_moe_sp`: Megatron-core routes the tokens before any TP gather). Experts: each
        of the rows (:attr:`_expert_rows`: n·k·max(c, 1)·e/t) passes one expert MLP,
        2·rows·h·f_e·(2 or 3 matrices)/e FLOPs (e the expert TP degree, :attr:`_etp`); the
        E/ep local experts' weights (1/e of each) are read once. Shape: rows per local
        expert, rows·ep/E, against f_e/e.
        """
        m, t, n = self.model, self._etp, self._tokens
        moe = m.moe
        assert moe is not None
        h, f, mm = m.hidden_size, moe.expert_ffn_hidden_size, m.mlp_matrices
        rows = self._expert_rows
        router = gemm(n / self._sp_div if self._moe_sp else n, h, moe.num_experts)
        local = moe.num_experts / self.ep
        mid = f * (mm - 1) / t
        per_expert = rows / local  # rows each local expert computes: n·k·max(c, 1)·ep/E
        fc1 = gemm(per_expert, h, mid, count=local)
        fc2 = gemm(per_expert, f / t, h, count=local)
        nbytes = BF16 * (local * h * f * mm / t + h * moe.num_experts
                         + rows * (h + 2 * mid + 2 * f / t + h))
        dims = (router, fc1, fc2)
        if moe.shared_experts:
            shared = self._shared_expert_gemms()
            dims += shared.gemm_dims
            nbytes += shared.hbm_bytes
        return ComputeSeg("mlp", sum(d[1] for d in dims), nbytes, gemm_dims=dims)

    def _shared_expert_gemms(self) -> ComputeSeg:
        """The shared experts' GEMMs of one MoE layer on one TP rank: every token passes one
        dense MLP of shared·f_e (TP-split), its weights read once."""
        m, t, n = self.model, self.tp, self._tokens
        moe = m.moe
        assert moe is not None and moe.shared_experts
        h, mm = m.hidden_size, m.mlp_matrices
        fs = moe.shared_experts * moe.expert_ffn_hidden_size
        dims = (gemm(n, h, fs * (mm - 1) / t), gemm(n, fs / t, h))
        nbytes = BF16 * (h * fs * mm / t + n * (h + 2 * fs * (mm - 1) / t + 2 * fs / t + h))
        return ComputeSeg("shared experts", sum(d[1] for d in dims), nbytes, gemm_dims=dims)

    @property
    def _moe_sp(self) -> bool:
        """Whether a MoE layer's MLP is lowered as Megatron-core's all-to-all dispatcher runs
        it under sequence parallelism (or without TP): no b·s·h gather of the layer's input
        over the attention TP group (the router runs on the GPU's s/t tokens), the routed
        copies gathered over the expert TP group after the dispatch instead
        (:meth:`_expert_tp_gather`). Without SP (tp > 1) the input is whole on every TP rank
        and the MLP block keeps its all-reduce."""
        return (self.model.moe is not None and not self.model.parallel_blocks
                and (self.sequence_parallel or self.tp == 1))

    def _expert_tp_gather(self, seg: ComputeSeg | list[Segment], name: str
                          ) -> list[Segment]:
        """The expert TP collectives around a MoE layer's experts (Megatron-core
        core_v0.19.0, megatron/core/transformer/moe/token_dispatcher.py,
        ``MoEAlltoAllTokenDispatcher.dispatch_postprocess``: after the all-to-all,
        ``gather_from_sequence_parallel_region(..., group=self.tp_group,
        output_split_sizes=...)`` over the ``expt_tp`` group; ``combine_preprocess``: the
        matching ``reduce_scatter_to_sequence_parallel_region`` before the combine): an
        all-gather of the received copies over the e GPUs of the expert TP group, and a
        reduce-scatter of the experts' outputs, b·s/(cp·t)·D·e·h bf16 each (D the copies a
        token dispatches, :attr:`_dispatched_rows`, capacity or routing imbalance included;
        the busiest EP rank's group, whose members receive alike). The group is the
        attention TP group with e = t, the expert grid's ``etp`` group otherwise; with e = 1
        there is none. The flex dispatcher sends each copy to all e expert-TP ranks of its
        destination in its TP x EP all-to-all (``_initialize_metadata``); it is taken as the
        same all-to-all over EP followed by this gather, which delivers the same rows."""
        body = seg if isinstance(seg, list) else [seg]
        e = self._etp
        if e == 1:
            return body
        nbytes = BF16 * self._dispatched_rows * e / self._sp_div * self.model.hidden_size
        group = "tp" if self.expert_tp is None else "etp"
        return [CommSeg(f"{name} expert all-gather", "tp", "all_gather", nbytes, group=group),
                *body,
                CommSeg(f"{name} expert reduce-scatter", "tp", "reduce_scatter", nbytes,
                        group=group)]

    def _moe_body(self, seg: ComputeSeg, name: str, backward: bool) -> list[Segment]:
        """The MLP of a MoE layer: with ep > 1, all-to-all dispatch of the routed token
        copies to their experts' GPUs and all-to-all combine back (backward: the same two
        in reverse), b·s/cp·k·max(c, 1)·h bf16 per GPU each (REFERENCES.md), divided by t
        under sequence parallelism: Megatron-core's all-to-all dispatcher sends only the
        s/t tokens each TP rank holds, then gathers the received ones over the expert TP
        group (:meth:`_expert_tp_gather`, inside the all-to-alls).

        Dropless with a routing imbalance, ``nbytes`` is the busiest rank's volume and
        the others move their own share (:attr:`CommSeg.skew`): towards the busiest in
        the dispatch and the combine's gradient, from it in the combine and the
        dispatch's gradient. A host wait (:attr:`moe_host_wait_s`, not in a recomputed
        forward) opens the expert body, after the dispatch: where the host synchronises."""
        body: list[Segment] = (self._expert_tp_gather(seg, name) if self._moe_sp
                               else [seg])
        wait = self.moe_host_wait_s[1 if backward else 0]
        if wait > 0.0 and not name.startswith("recompute"):
            body = [ComputeSeg(f"{name} host wait", duration_s=wait), *body]
        if self.ep == 1:
            return body
        moe = self.model.moe
        assert moe is not None
        nbytes = BF16 * self._dispatched_rows * self.model.hidden_size / self._sp_div
        imbalance = moe.routing_imbalance if moe.capacity_factor is None else 1.0
        towards = from_busiest = EQUAL_VOLUMES
        if imbalance != 1.0:
            towards, from_busiest = (imbalance, False), (imbalance, True)
        first, second = ("combine grad", "dispatch grad") if backward else ("dispatch", "combine")
        exposed = dict(self.ep_comm_exposed_s)
        return [CommSeg(f"{name} {first}", "ep", "all_to_all", nbytes, group="ep",
                        duration_s=exposed.get(first), skew=towards), *body,
                CommSeg(f"{name} {second}", "ep", "all_to_all", nbytes, group="ep",
                        duration_s=exposed.get(second), skew=from_busiest)]

    def moe_layer_segments(self, backward: bool) -> list[Segment]:
        """One MoE layer's forward (or backward, weight gradients included) segments."""
        moe_layer = replace(self, model=self.model.layer_spec(self.model.first_dense_layers))
        return (moe_layer._layer_backward("moe", False) if backward
                else moe_layer._layer_forward("moe"))
