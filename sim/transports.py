"""Network transports other than InfiniBand or RoCE: the NCCL settings their environment
fixes, as data (``sim/data/nccl_tuning.toml``, ``[transport.NAME]``). Pure.

A server preset names its NICs' transport (:attr:`topologies.presets.ServerPreset.transport`,
a NIC attribute of the graph). Two things follow from it here: the ``NCCL_BUFFSIZE`` the
transport's NCCL runs with, which sets the tree's chunk (:mod:`sim.treepipe`), and the rules
of the tuner plugin that ships with it, which take the algorithm instead of NCCL's cost
model where one matches (:func:`tuner_algorithm`). Its rate, efficiency and latency are the
preset's, its required protocol the preset's ``protocol``.
"""

from __future__ import annotations

import functools
import tomllib
from typing import TYPE_CHECKING

from sim.nvls import DATA_FILE
from topologies.presets import TRANSPORT_ATTR

if TYPE_CHECKING:
    from topologies.cluster import Cluster


@functools.cache
def _data() -> dict:
    with DATA_FILE.open("rb") as fh:
        return tomllib.load(fh)["transport"]


def transport_of(cluster: Cluster, hosts: set[int] | frozenset[int]) -> str | None:
    """The transport of the NICs of servers ``hosts`` if they all share one named
    transport, else None (InfiniBand or RoCE, or a mix)."""
    names = {d.get(TRANSPORT_ATTR) for h in hosts for d in cluster.nics_of(h) or ({},)}
    return names.pop() if len(names) == 1 else None


def buffsize(name: str) -> int:
    """``NCCL_BUFFSIZE`` of transport ``name``."""
    return int(_data()[name]["buffsize"])


def tuner_algorithm(name: str, op: str, servers: int, per_server: int,
                    nbytes: float) -> str | None:
    """The algorithm transport ``name``'s tuner plugin takes for ``op`` of ``nbytes`` over
    ``servers`` servers of ``per_server`` GPUs each (its first matching rule), or None."""
    for rule in _data()[name].get("tuner", ()):
        low, high = rule["servers"]
        b_low, b_high = rule["bytes"]
        if (rule["op"] == op and low <= servers < high
                and per_server >= rule["min_gpus_per_server"]
                and b_low <= nbytes < b_high):
            return str(rule["algo"])
    return None
