"""The tree's chunk pipeline as NCCL runs it under Simple: the fill a tree all-reduce pays on
top of its streamed time. Pure.

NCCL moves a tree all-reduce in chunks of one step, ``NCCL_BUFFSIZE / NCCL_STEPS`` bytes a
channel (uncut for small buffers since v2.20), each chunk climbing from the end of a
server's chain to the root and back down, stored and forwarded at every hop. The
collective ends after its bytes' streamed time plus the pipeline's fill, which
:func:`fill_bytes` charges as ``depth`` loops (a loop: one chunk on every tree), with
NCCL's tree depth (:func:`depth`): the first chunk crosses 2·depth hops while the links
carry about half their steady load (``sim/data/nccl_tuning.toml``, ``[tree]``, which says
why). The plans add it to the buffer, so every tree carries ``depth`` chunks more and the
fill is paid at whatever rate the trees get.

Where it applies: every tree all-reduce under Simple. The chunk is a step of the buffer:
the ``NCCL_BUFFSIZE`` a transport fixes (:mod:`sim.transports`; Google's GPUDirect-TCPXO,
8 MiB: 1 MiB chunks), else NCCL's default, 4 MiB (:func:`buffsize`; 512 KiB chunks on
InfiniBand, RoCE and inside a server). The chunk rule is NCCL's from v2.20 on (the version
of the tuning model, ``[tuning]``); before it, NCCL halved the chunk of a buffer under
depth x 8 loops, which made the fill at most about an eighth of the buffer.
"""

from __future__ import annotations

from sim.nvls import tuning_data


def _data() -> dict:
    return tuning_data()["tree"]


def buffsize() -> int:
    """NCCL's default ``NCCL_BUFFSIZE`` for the Simple protocol (``[tree]`` ``buffsize``)."""
    return int(_data()["buffsize"])


def chunk_bytes(buffsize: int) -> int:
    """The tree's chunk under Simple: one step of the buffer (``NCCL_STEPS`` a buffer)."""
    return buffsize // _data()["steps"]


def depth(members: int, servers: int) -> int:
    """NCCL's tree depth over ``servers`` servers of ``members`` GPUs each
    (``src/graph/connect.cc``): members − 1 + ⌊log2 servers⌋."""
    return members - 1 + max(servers, 1).bit_length() - 1


def fill_bytes(nbytes: float, tree_depth: int, loop: float) -> float:
    """The fill as bytes added to the buffer: ``tree_depth`` loops of ``loop`` bytes (one
    chunk on every tree; a buffer smaller than a loop is one loop of its own size)."""
    if nbytes <= 0:
        return 0.0
    return tree_depth * min(loop, nbytes)
