"""Lanes the engine may step as one (:meth:`sim.engine._Run._lanes`): the blocks of a packed
program's DAG whose instructions are copies of one another, shifted by their place.

The GPUs of a TP group run the same instruction stream: the full lowering adds an op's
copies on a replica's TP lanes at once, as consecutive ids of one template
(:meth:`workloads.packed.PackedBuilder.chain`), and so do a collective's members. A block
``b, b + 1, ..., b + L - 1`` (``L >= 2``) qualifies when every lane ``k`` is lane 0 shifted
by ``k``:

- the same template, and the same number of successors, at most :data:`MAX_HEADS`;
- its ``e``-th successor is lane 0's ``e``-th successor plus ``k`` (so each successor of lane 0
  heads a block of ``L`` consecutive ids, lane ``k``'s successor in lane ``k``), and those
  successor blocks are each of one template;
- the successor blocks do not overlap one another nor the block itself (lane 0's successors
  in ascending order, each at least ``L`` after the one before, as the DAG lists them).

Then completing the block's lanes in a row, as a heap entry or a collective's members do,
acts on every lane alike (the same successors' counters, at the same places): whether it
may be done as one step is decided when it runs (the counters equal across lanes, at most
one successor block freed, a start that acts alike on each lane; :meth:`_Run._lanes`).
:func:`lane_blocks` finds the blocks on arrays; :func:`lane_blocks_reference` is the loop
it must equal (``tests/test_lanes.py``).
"""

from __future__ import annotations

from array import array

import numpy as np

MAX_LANES = 255
"""A block's longest (one byte a instruction); a longer run is cut into blocks of at most this."""
MAX_HEADS = 4
"""A lane's most successors (a TP group's lanes have two: the next op and the collective)."""


def lane_blocks_reference(tpl: array, succ: array, first: array) -> bytearray:
    """Per instruction, ``L`` where a block of ``L`` lanes begins there, else 0: the rules of
    the module, one instruction at a time."""
    n = len(tpl)
    out = bytearray(n)

    def follows(i: int) -> bool:  # lane i is lane i - 1 shifted by one
        if i == 0 or tpl[i] != tpl[i - 1]:
            return False
        mine, theirs = succ[first[i]:first[i + 1]], succ[first[i - 1]:first[i]]
        return len(mine) == len(theirs) <= MAX_HEADS and all(
            s == r + 1 and tpl[s] == tpl[s - 1] for s, r in zip(mine, theirs, strict=True))

    b = 0
    while b < n:
        length = 1
        while b + length < n and length < MAX_LANES and follows(b + length):
            length += 1
        heads = succ[first[b]:first[b + 1]]
        apart = all(abs(s - b) >= length for s in heads) and all(
            y - x >= length for x, y in zip(heads, heads[1:], strict=False))
        if length >= 2 and len(heads) <= MAX_HEADS and apart:
            out[b] = length
        b += length
    return out


_CHUNK = 1 << 16
"""Instructions :func:`lane_blocks` checks at a time."""


def _follows(t: np.ndarray, s: np.ndarray, f: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Whether each lane ``lo`` ... ``hi - 1`` (``lo >= 1``) is the one before it shifted by one
    (:func:`lane_blocks_reference`'s ``follows``)."""
    deg = np.diff(f[lo - 1:hi + 1])
    d = deg[1:]
    out = (t[lo:hi] == t[lo - 1:hi - 1]) & (d == deg[:-1]) & (d <= MAX_HEADS)
    if not len(s):
        return out
    last = len(s) - 1
    for e in range(min(int(d.max()), MAX_HEADS)):
        head = s[np.minimum(f[lo - 1:hi] + e, last)]
        kind = t[head[1:]]
        same = (head[1:] == head[:-1] + 1) & (kind == t[head[1:] - 1])
        out &= same | (d <= e)
    return out


def lane_blocks(tpl: array, succ: array, first: array) -> bytearray:
    """:func:`lane_blocks_reference` on arrays (the same bytes): the successors' ``e``-th
    column, one ``e`` at a time."""
    n = len(tpl)
    out = bytearray(n)
    if n < 2:
        return out
    t = np.frombuffer(tpl, dtype=np.int32)
    s = np.frombuffer(succ, dtype=np.int32)
    f = np.frombuffer(first, dtype=np.int64)
    follows = np.zeros(n, dtype=bool)
    for lo in range(1, n, _CHUNK):  # a slice at a time: its temporaries stay in the cache
        hi = min(lo + _CHUNK, n)
        follows[lo:hi] = _follows(t, s, f, lo, hi)
    # runs of following lanes, cut every MAX_LANES
    starts = np.flatnonzero(~follows)
    del follows
    lengths = np.diff(np.append(starts, n))
    if (lengths > MAX_LANES).any():
        pieces = -(-lengths // MAX_LANES)
        starts = np.repeat(starts, pieces) + MAX_LANES * (
            np.arange(pieces.sum()) - np.repeat(np.cumsum(pieces) - pieces, pieces))
        lengths = np.diff(np.append(starts, n))
    d = f[starts + 1] - f[starts]
    keep = (lengths >= 2) & (d <= MAX_HEADS)
    starts, lengths, d = starts[keep], lengths[keep], d[keep]
    # the successor blocks apart from one another and from the block, in ascending order
    last = max(len(s) - 1, 0)
    apart = np.ones(len(starts), dtype=bool)
    before = None
    for e in range(min(int(d.max()), MAX_HEADS) if len(d) else 0):
        has = d > e
        head = np.where(has, s[np.minimum(f[starts] + e, last)], 0).astype(np.int64)
        apart &= ~has | (np.abs(head - starts) >= lengths)
        if before is not None:
            apart &= ~has | (head - before >= lengths)
        before = head
    np.frombuffer(out, dtype=np.uint8)[starts[apart]] = lengths[apart]
    return out
