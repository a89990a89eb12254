"""NCCL's three protocols (LL, LL128, Simple): per-step latency and bandwidth as data.

NCCL moves a ring's or a tree's chunks with one of three protocols and picks, per
operation and size, the (algorithm, protocol) pair its tuning model predicts fastest
(``ncclTopoTuneModel``, ``src/graph/tuning.cc`` of NVIDIA/nccl, read at commit
5067397c, June 2026): LL sends 8-byte lines of 4 data bytes and a 4-byte flag (no
fence, the lowest latency, half the bandwidth or less), LL128 128-byte lines of 120
data bytes, Simple large chunks behind a memory fence (full bandwidth, the highest
per-step latency). The model there is ``baseLatencies[algo][proto] + steps ×
hwLatencies[link][algo][proto] + size / (busBw × fraction[algo][proto])``.

Here the cluster's hop latencies and launch latency stand for the ring under Simple (a
preset's NVLink ring step is 3.4 µs and its launch 8.4 µs, NCCL's Simple numbers), so an
algorithm's protocol scales them by NCCL's ratio to the ring's Simple (a tree's Simple
NVLink step is 4.0 µs, so 4.0/3.4; between servers both are 14 µs): a route inside one
server (NVLink) by ``hwLatencies[NVLINK]``'s, a route between servers by
``hwLatencies[NET]``'s; the launch by ``baseLatencies``'. Its transfers carry their
bytes / its bandwidth fraction, as bytes on the wire, so the flow simulation and the
estimate agree. Only ring (with the pipelined broadcast and reduce chains) and tree take
LL and LL128, as in NCCL; every other algorithm runs Simple. NCCL's per-channel caps
(``llMaxBws``, ``perChMaxRingLL128Bws``, ...) are not modelled. The constants are in
``sim/data/nccl_tuning.toml`` (``[tuning]``), with their source.

A ring over several servers (its all-reduce, all-gather and reduce-scatter) pays at least
the host's network post overhead for each step inside a server (:func:`net_overhead_us`,
``getNetOverhead``: 1 µs on Intel hosts, 2 µs on AMD ones, × 3 under Simple): NCCL raises
its intra-server per-step latency to it, so a DGX A100 ring over two servers takes 6 µs
(not 3.4) per NVLink step under Simple, a DGX H100 ring 1 µs (not 0.6) under LL.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from base.errors import ConfigError
from sim.nvls import tuning_data

PROTOCOLS = ("simple", "ll128", "ll")
"""Protocols, Simple first (the fallback)."""
AUTO_PROTOCOL = "auto"
PROTOCOL_ALGOS = ("ring", "tree")
"""Algorithms that run LL and LL128; the others always run Simple."""
DATA_FILE = Path(__file__).parent / "data" / "nccl_tuning.toml"
"""NCCL's tuning constants (section ``[tuning]``) with their source (commit hash inside)."""
NCCL_ORDER = ("ll", "ll128", "simple")
"""The order of the protocols in :data:`DATA_FILE`'s lists (NCCL's ``NCCL_PROTO_*``)."""


@dataclass(frozen=True)
class ProtocolCosts:
    """One protocol's costs for one algorithm (ring or tree), in NCCL's units."""

    base_us: float
    """``baseLatencies[algo][proto]``: the per-operation latency."""
    nvlink_us: float
    """``hwLatencies[NVLINK][algo][proto]``: per step inside a server."""
    net_us: float
    """``hwLatencies[NET][algo][proto]``: per step between servers."""
    fraction_one_node: float
    """Bandwidth relative to the links' rate (a ring's under Simple) within one server."""
    fraction_nodes: float
    """Bandwidth relative to the links' rate across servers."""


def _tuning() -> dict:
    return tuning_data()["tuning"]


def source() -> str:
    """Where the constants come from: NCCL's file, commit and the refinements used."""
    return _tuning()["source"]


@functools.cache
def costs(algo: str, protocol: str) -> ProtocolCosts:
    """NCCL's tuning constants for ``algo`` ("ring" or "tree") under ``protocol``
    (:func:`source`); a tree's bandwidth is its all-reduce's."""
    t = _tuning()
    k = NCCL_ORDER.index(protocol)
    bw = t["bus_bw"]
    if algo == "ring":
        one_node = nodes = bw["ring"][k]
    else:
        (n1, d1), (n2, d2) = bw["tree_one_node"][k], bw["tree_nodes"][k]
        one_node = bw["tree_all_reduce"] * n1 / d1
        nodes = bw["tree_all_reduce"] * n2 / d2
    return ProtocolCosts(float(t["base_latency_us"][algo][k]),
                         float(t["nvlink_latency_us"][algo][k]),
                         float(t["net_latency_us"][algo][k]),
                         float(one_node), float(nodes))


def check_protocol(protocol: str) -> None:
    """ConfigError unless ``protocol`` is one of :data:`PROTOCOLS` or ``auto``."""
    if protocol != AUTO_PROTOCOL and protocol not in PROTOCOLS:
        raise ConfigError(f"collective protocol {protocol!r} is not one of "
                          f"{', '.join((AUTO_PROTOCOL, *PROTOCOLS))}")


def protocols_for(algo: str) -> tuple[str, ...]:
    """The protocols ``algo`` can run (Simple only outside :data:`PROTOCOL_ALGOS`)."""
    return PROTOCOLS if algo in PROTOCOL_ALGOS else ("simple",)


def _costs(algo: str, protocol: str) -> tuple[ProtocolCosts, ProtocolCosts]:
    """(algo's costs under the protocol, the ring's under Simple): the cluster's latencies
    stand for the ring's Simple ones, so a tree under Simple scales its NVLink steps by
    NCCL's 4.0 / 3.4 µs as well."""
    key = algo if algo in PROTOCOL_ALGOS else "ring"
    return costs(key, protocol), costs("ring", "simple")


def launch_scale(algo: str, protocol: str) -> float:
    """The protocol's per-operation latency over the ring's under Simple."""
    p, s = _costs(algo, protocol)
    return p.base_us / s.base_us


def latency_scale(algo: str, protocol: str, inter_node: bool) -> float:
    """The protocol's per-step latency over the ring's under Simple, inside a server or
    between servers."""
    p, s = _costs(algo, protocol)
    return p.net_us / s.net_us if inter_node else p.nvlink_us / s.nvlink_us


def bandwidth_fraction(algo: str, protocol: str, multi_node: bool) -> float:
    """The fraction of the links' rate ``algo`` reaches under the protocol (a ring under
    Simple: 1, the rate the link efficiencies of the presets measure)."""
    p, _ = _costs(algo, protocol)
    return p.fraction_nodes if multi_node else p.fraction_one_node


HOST_CPUS = ("intel", "amd", "arm")
"""Host CPUs a server preset may name (:attr:`topologies.presets.ServerPreset.host_cpu`)."""


def net_overhead_us(host_cpu: str | None, protocol: str) -> float:
    """NCCL's floor on the per-step latency inside a server of a ring over several servers
    (``getNetOverhead`` in ``ncclTopoTuneModel``, :data:`DATA_FILE` ``[tuning.net_overhead]``),
    in µs: the host CPU's overhead (``intel``, ``amd``; any other host, None for hosts of
    different vendors, NCCL's default), times 3 under Simple."""
    t = _tuning()["net_overhead"]
    us = float(t["us"].get(host_cpu or "default", t["us"]["default"]))
    return us * float(t["simple_factor"]) if protocol == "simple" else us
