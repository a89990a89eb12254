"""NCCL's network overhead on the ring's steps inside a server when the ring spans several
servers (``getNetOverhead`` in ``ncclTopoTuneModel``, src/graph/tuning.cc; sim.protocols)."""

from __future__ import annotations

import pytest

from sim.engine import simulate_program
from sim.protocols import HOST_CPUS, net_overhead_us
from sim.selection import ring_net_overhead_s
from topologies.cluster import Cluster
from topologies.hardware import GPUS
from topologies.presets import (
    HOST_CPU_ATTR,
    SERVERS,
    CollectiveSettings,
    explicit_cluster,
    server_cluster,
)
from workloads.program import Program, ProgramBuilder
from workloads.schedules import gpipe

US = 1e-6
MiB = 2**20


def _time(cluster: Cluster, op: str, algo: str, n: int, nbytes: float) -> float:
    b = ProgramBuilder()
    b.collective(tuple(range(n)), {}, kind="dp", name="c", op=op, nbytes=nbytes, algo=algo)
    m = cluster.num_gpus
    tl = simulate_program(Program(m, b.build(), (0.0,) * m, gpipe(1, 1)), cluster,
                          lambda _: 0.0)
    return max(s.end_s for s in tl.spans if s.name == "c")


def _with_host_cpu(preset: str, n: int, cpu: str | None, protocol: str) -> Cluster:
    """``n`` GPUs of ``preset`` whose GPUs name ``cpu`` as their host (None: none)."""
    c = server_cluster(preset, n, collectives=CollectiveSettings(protocol=protocol))
    for r in range(n):
        d = c.node_attrs[c.node(r)]
        if cpu is None:
            d.pop(HOST_CPU_ATTR, None)
        else:
            d[HOST_CPU_ATTR] = cpu
    return c


def test_overheads_are_nccls() -> None:
    """getNetOverhead: 1 µs on x86 Intel, 2 µs on x86 AMD, 1 µs on any other host or on
    hosts of different vendors; x 3 under Simple."""
    assert net_overhead_us("intel", "simple") == 3.0
    assert net_overhead_us("amd", "simple") == 6.0
    assert net_overhead_us("amd", "ll") == net_overhead_us("amd", "ll128") == 2.0
    assert net_overhead_us("intel", "ll") == net_overhead_us("arm", "ll128") == 1.0
    assert net_overhead_us(None, "simple") == net_overhead_us("unstated", "simple") == 3.0


def test_presets_name_their_host_cpu_with_a_source() -> None:
    assert SERVERS["dgx-a100-80g"].host_cpu == SERVERS["dgx-a100-40g"].host_cpu == "amd"
    assert SERVERS["dgx-h100"].host_cpu == SERVERS["dgx-h200"].host_cpu == "intel"
    for name, p in SERVERS.items():
        assert p.host_cpu in (*HOST_CPUS, "unstated"), name
        assert (p.host_cpu == "unstated") == (not p.host_cpu_source), name
    c = server_cluster("dgx-a100-80g", 16)
    assert {c.node_attrs[c.node(r)][HOST_CPU_ATTR] for r in range(16)} == {"amd"}


def test_floor_applies_to_rings_over_several_servers_only() -> None:
    a100 = server_cluster("dgx-a100-80g", 16)
    g16, g8 = tuple(range(16)), tuple(range(8))
    assert ring_net_overhead_s(a100, "all_reduce", "ring", g16, "simple") == pytest.approx(6 * US)
    assert ring_net_overhead_s(a100, "all_gather", "ring", g16, "ll") == pytest.approx(2 * US)
    assert ring_net_overhead_s(a100, "all_reduce", "ring", g8, "simple") == 0.0  # one server
    assert ring_net_overhead_s(a100, "broadcast", "ring", g16, "simple") == 0.0  # NCCL's chain
    assert ring_net_overhead_s(a100, "all_reduce", "tree", g16, "simple") == 0.0
    h100 = server_cluster("dgx-h100", 16)
    assert ring_net_overhead_s(h100, "all_reduce", "ring", g16, "ll") == pytest.approx(1 * US)
    # no host modelled on an explicit topology
    sw = explicit_cluster("switch", 16, GPUS["A100-80GB"], 25e9, 1e-6, gpus_per_node=8,
                          nvlink_bandwidth_Bps=300e9)
    assert ring_net_overhead_s(sw, "all_reduce", "ring", g16, "simple") == 0.0


def test_amd_hosts_raise_a_two_server_rings_nvlink_steps_to_6_us() -> None:
    """16 DGX A100 GPUs, ring all-reduce under Simple: each NVLink step costs 6 µs (2 µs x 3)
    instead of the preset's 3.4. The stream ring's last step waits for its 30 steps'
    latencies: 30 consecutive edges of a 16-edge ring with 2 NIC edges hold 4 NIC edges and
    26 NVLink ones, so the time grows by 26 x 2.6 µs. An Intel host's 3 µs stays below 3.4:
    no change; one server: no change."""
    t = {cpu: _time(_with_host_cpu("dgx-a100-80g", 16, cpu, "simple"), "all_reduce", "ring",
                    16, MiB) for cpu in ("amd", "intel", None)}
    assert t["intel"] == t[None]
    assert t["amd"] - t[None] == pytest.approx(26 * 2.6 * US, rel=1e-6)
    one = {cpu: _time(_with_host_cpu("dgx-a100-80g", 8, cpu, "simple"), "all_reduce", "ring",
                      8, MiB) for cpu in ("amd", None)}
    assert one["amd"] == one[None]


def test_intel_hosts_raise_the_ll_nvlink_step_to_1_us() -> None:
    """16 DGX H100 GPUs, ring all-reduce under LL: NCCL's 0.6 µs NVLink step becomes 1 µs."""
    t = {cpu: _time(_with_host_cpu("dgx-h100", 16, cpu, "ll"), "all_reduce", "ring", 16, MiB)
         for cpu in ("intel", None)}
    assert t["intel"] - t[None] == pytest.approx(26 * 0.4 * US, rel=1e-6)
