"""What one kernel's segment is made of, for the cost model's modules
(:mod:`workloads.transformer` and its mixins). Pure.

A GEMM's FLOPs and the shape its efficiency is read at (:func:`gemm`), a segment's GEMMs on
FP8 tensor cores (:func:`on_fp8`) or repeated (:func:`scaled`), and the memo that keeps a
frozen cost model's answers on it (:func:`per_instance`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import wraps
from typing import Any, TypeVar

from workloads.costs import ComputeSeg

_T = TypeVar("_T")


def per_instance(method: Callable[[Any], _T]) -> Callable[[Any], _T]:
    """Keep a no-argument method's result on its instance (a frozen cost model never
    changes, and ``replace`` makes a new one): one layer's GEMMs are asked for once per
    layer of every op, the same answer each time. The entry lives in the instance's
    ``__dict__``, outside the fields that equality, hashing and ``replace`` read."""
    name = f"_memo_{method.__name__}"

    @wraps(method)
    def cached(self: Any) -> _T:
        memo = self.__dict__
        if name not in memo:
            memo[name] = method(self)
        return memo[name]
    return cached


def per_instance_by(method: Callable[..., _T]) -> Callable[..., _T]:
    """:func:`per_instance` for a method of hashable positional arguments: its result kept
    on the instance per argument tuple (a stage's parameters are asked for by the gradient
    collectives, the optimizer and the static memory of every layout on the cost model)."""
    name = f"_memo_{method.__name__}"

    @wraps(method)
    def cached(self: Any, *args: Any) -> _T:
        memo = self.__dict__.get(name)
        if memo is None:
            memo = self.__dict__[name] = {}
        if args not in memo:
            memo[args] = method(self, *args)
        return memo[args]
    return cached


def gemm(m: float, k: float, n: float, count: float = 1.0) -> tuple[float, float]:
    """``(shape dimension, FLOPs)`` of ``count`` GEMMs of an M x K input by a K x N weight.

    FLOPs 2·M·K·N each. The dimension the device model's efficiency curve
    (:meth:`sim.device.DeviceProfile.gemm_efficiency_at`, 1/η(d) = (1 + d½/d + (d₂/d)^p)/η)
    sees is the side of the cube of equal work, (M·K·N)^(1/3):
    a GEMM runs below peak when it is small overall (few output tiles for the
    SMs, a short main loop over K), not because one of its sides is shorter than
    the others (a 2048 x 5120 x 5120 GEMM fills an A100's 108 SMs several times
    over). The cube side is symmetric in M, K and N, so a layer's two backward
    GEMMs (input gradient N x K, weight gradient K x M against M x N) see the
    forward's dimension, and the token count M (micro-batch x sequence) enters
    only as one factor of three: a thin TP shard (K or N = h/t) with few tokens
    is slow, many tokens against a whole weight matrix are not.
    """
    return (m * k * n) ** (1 / 3), 2.0 * m * k * n * count


def on_fp8(seg: ComputeSeg, speedup: float) -> ComputeSeg:
    """``seg``'s GEMMs on FP8 tensor cores, ``speedup`` times the bf16 rate: FLOPs in
    bf16-equivalent units (divided by it) for the device model, which times GEMMs against
    the bf16 peak; the shape dimensions the efficiency curve sees are unchanged."""
    return replace(seg, flops=seg.flops / speedup,
                   gemm_dims=tuple((d, f / speedup) for d, f in seg.gemm_dims))


def scaled(seg: ComputeSeg, label: str, factor: float, **fields: float) -> ComputeSeg:
    """``seg``'s GEMM work times ``factor`` under a new label, other fields as given."""
    return replace(seg, label=label, flops=seg.flops * factor, hbm_bytes=seg.hbm_bytes * factor,
                   gemm_dims=tuple((d, f * factor) for d, f in seg.gemm_dims),
                   attn_flops=fields.get("attn_flops", 0.0),
                   elementwise_bytes=fields.get("elementwise_bytes", 0.0))
