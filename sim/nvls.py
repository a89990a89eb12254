"""NVLS's chunk pipeline as NCCL runs it: how its time depends on the message size. Pure.

NCCL runs an NVLS (NVLink SHARP) all-reduce on ``channels`` channels (16 on Hopper), each
with one head per GPU of the server (NVLSTree: one per NIC, :func:`heads`); one loop of a
channel moves ``heads`` chunks, so the whole collective advances ``channels × heads ×
chunk`` bytes of the buffer per loop. The chunk is 128 KiB for large buffers and shrinks
below 64, 8 and 2 concurrent loops' worth (``calcCollChunking``, src/enqueue.cc). Every
chunk passes in turn through the kernel's warp groups (scatter into the NVLS buffer, reduce
and multicast through the NVSwitch, gather out of it: three stages; NVLSTree has four,
src/device/all_reduce.h), so the collective is a pipeline of stages over loops: it ends
``stages − 1`` loop times after the streamed transfer would, the fill and drain of the
pipeline, one loop time being the time a loop's bytes take at the rate of the pipeline's
slowest stage (the stages run in lock step, tied by NCCL's per-connection flow control). The
plans charge it as that many loops of bytes on every flow (:func:`fill_bytes`), so it is
paid at the rate each flow gets. A buffer smaller than one loop is one loop of its own size.
The numbers are in ``sim/data/nccl_tuning.toml``, each with its source; none is fitted to a
measurement.

What this gives on 8 H100 (one loop: 8 MiB below 1 GiB, 16 MiB from 1 GiB on): the fill is
two loops, 61 µs at 64 MiB (a quarter of the streamed time) and 122 µs at 1 GiB (3%), so
the busbw rises with the size as nccl-tests shows it and not only through the latency.
Not modelled: the per-chunk software cost inside a stage (the smaller chunks below 1 GiB
also lower the steady rate), the NVLS reduce-scatter's and all-gather's pipelines (no
published run to check them), Blackwell's 24 or 32 channels (Hopper's 16 are used),
and, for NVLSTree, which GPU NCCL's search makes a NIC's head (here the first GPU the NIC
serves; :func:`heads` gives their number, one per NIC as in NCCL).
"""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

DATA_FILE = Path(__file__).parent / "data" / "nccl_tuning.toml"
"""NCCL's NVLS and NVLSTree constants with their source (commit hash inside)."""

PIPELINED = {"nvls": "nvls", "nvls_tree": "nvls_tree"}
"""Algorithm -> its section of :data:`DATA_FILE`."""


@functools.cache
def tuning_data() -> dict:
    """All of :data:`DATA_FILE`, parsed once for its readers (this module,
    :mod:`sim.protocols`, :mod:`sim.treepipe`; read only)."""
    with DATA_FILE.open("rb") as fh:
        return tomllib.load(fh)


_data = tuning_data


def _section(algo: str) -> dict:
    data = _data()
    sec = dict(data[PIPELINED[algo]])
    sec.setdefault("channels", data["nvls"]["channels"])
    sec.setdefault("max_heads", data["nvls"]["max_heads"])
    sec.setdefault("stages", data["nvls"].get("all_reduce_stages"))
    return sec


def heads(algo: str, members: int, nics: int | None = None) -> int:
    """NVLS heads of a server of ``members`` GPUs: inside one server (``nics`` None) every
    GPU; across servers one per NIC (the GPU next to it), never more than the GPUs; both
    up to NCCL's arity (32). ``src/graph/search.cc``: ncclTopoSearchRecNet, NVLS pattern,
    adds a head per NIC (``net.localGpu``, no GPU twice) while ``nChannels < netCount``;
    ncclTopoCompute caps ``maxChannels`` at min(NCCL_MAX_NVLS_ARITY, GPUs)."""
    return min(members if nics is None else nics, members, _section(algo)["max_heads"])


def chunk_bytes(algo: str, nbytes: float, members: int, servers: int = 1,
                nics: int | None = None) -> int:
    """NCCL's chunk for an ``algo`` ("nvls" or "nvls_tree") all-reduce of ``nbytes`` over
    ``servers`` servers of ``members`` GPUs and ``nics`` NICs (:func:`heads`): the largest
    (NVLSTree on 4 servers or more: 64 KiB), cut while the buffer is below ``factor`` ×
    concurrent ops × chunk (``calcCollChunking``)."""
    sec = _section(algo)
    chunk = sec["chunk_bytes"]
    if servers >= sec.get("many_servers", servers + 1):
        chunk = sec["many_servers_chunk_bytes"]
    concurrent = sec["channels"] * heads(algo, members, nics)
    for factor, smaller in sec["chunk_cuts"]:
        if nbytes < factor * concurrent * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def loop_bytes(algo: str, nbytes: float, members: int, servers: int = 1,
               nics: int | None = None) -> float:
    """Bytes of the buffer one loop of every channel moves (at most the buffer)."""
    sec = _section(algo)
    loop = (sec["channels"] * heads(algo, members, nics)
            * chunk_bytes(algo, nbytes, members, servers, nics))
    return min(float(loop), nbytes)


def fill_bytes(algo: str, nbytes: float, members: int, servers: int = 1,
               nics: int | None = None) -> float:
    """The pipeline's fill and drain as bytes: ``stages − 1`` loops, which every flow of the
    collective carries on top of the buffer, so that the collective ends that many loop
    times later at whatever rate its slowest stage runs (the NVSwitch ports or, for
    NVLSTree, the NICs)."""
    if nbytes <= 0:
        return 0.0
    return (_section(algo)["stages"] - 1) * loop_bytes(algo, nbytes, members, servers, nics)
