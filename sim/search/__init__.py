"""Layout search: enumerate an experiment's valid layouts, screen them, simulate, rank.

``sim search`` answers "which layout should I run?" for an experiment's model,
cluster and global batch (issue 6). Four steps:

1. **Enumerate** (:func:`enumerate_layouts`): tp, pp, dp, cp, ep, vpp,
   micro-batch size, sequence parallelism, ZeRO stage, recomputation and
   schedule, keeping combinations that divide correctly: ``tp·pp·cp·dp`` =
   GPUs, ``micro_batch_size·dp`` divides the global batch, tp divides the
   attention heads (and, with sequence parallelism, the sequence), ``pp·vpp``
   stages fit in the layers, and the schedule builder accepts ``(pp, m, vpp)``.
   CP needs a flash kernel and ``2·cp`` equal sequence chunks; EP a
   mixture-of-experts model whose experts it divides (with any ZeRO stage).
   Values the simulator does not support (e.g. EP on a dense model, ZeRO-3
   on a synthetic one) are found by probing a tiny experiment once
   (:func:`probe_support`) and are left out, counted as ``unsupported``.
   Exact duplicates are dropped unless pinned: sequence parallelism without
   TP (a no-op), several ZeRO stages with ``dp = 1`` (identical), schedules
   other than 1F1B with ``pp = 1`` (one rank: the same order of work, GPipe
   only holding more), interleaving with ``vpp = 1`` (plain 1F1B).
   ``vpp`` of the interleaved schedule ranges over ``v >= 2`` with
   ``pp·v`` dividing the layers (Megatron-LM's rule); V schedules use 2.
   Unless pinned, CP degrees whose ring attention cannot hide its K/V
   passes on the fastest link are left out (fewer than ``(kv/h)·F/B``
   tokens per rank, :func:`cp_min_tokens`: ``cp = 1`` only for GPT-3's
   2,048 tokens on A100, 522,456 layouts down to 90,360). A
   ``parallel.layers_per_stage`` list in the file fixes the stage count ``pp·vpp``;
   ``balanced`` splits each layout's layers as ``sim run`` does
   (:func:`sim.experiment.balanced_layers`, on the real cluster).
2. **Screen and judge** (:class:`Screener`) with bounds that need no simulation,
   on the executor's workers (:class:`SearchWorker`): screening in compact
   chunks of whole ``(tp, cp, micro-batch)`` groups (:func:`~sim.search.execution.screen_chunks`: a
   group's op times and TP collectives are computed by one worker), with several
   workers after a first round that computes each family's model-state terms once
   (:func:`~sim.search.execution.family_chunks`), judging in chunks ahead of the
   sweep's frontier. Screening chunks name layouts by their index in the
   enumeration: workers forked inside :func:`~sim.search.execution.shared_space`
   inherit the caller's context and layouts, others enumerate them again.
   Screening is cheap and schedule-free: the average static state per rank
   plus one micro-batch of activations must fit, and a loose step-time bound
   (compute of the first and last pipeline rank, the forward chain before
   them, their TP collectives, optimizer and ZeRO gather) orders the
   layouts best first. When a layout's turn comes it is judged: its schedule
   is built and walked in program order as the engine allocates memory (an
   exact lower bound of the peak memory, :meth:`Screener.memory_bound_gib`),
   and with pruning a list schedule of its ops gives a tight lower bound of
   the step time (:meth:`Screener.step_bound_s`); layouts that cannot fit, or
   whose throughput bound is below the K-th best already simulated, are not
   simulated. Property tests check every bound against the simulator.
3. **Simulate** the rest (collapsed fidelity by default) on an executor of
   :mod:`sim.executors`; idle workers simulate ahead, speculatively, what the
   sweep will probably want (:class:`~sim.search.sweep._Sweep`). Every wanted result (or error)
   goes to a :class:`ResultStore` (SQLite, one transaction per result) as it
   arrives; a restarted sweep with the same store skips what is there.
4. **Rank** feasible layouts by throughput (tokens/s; ties: less memory, then
   the layout key).

The package, one concept a module: :mod:`~sim.search.layouts` (a layout, pins),
:mod:`~sim.search.space` (the experiment's context, enumeration, support probes),
:mod:`~sim.search.plan` (a built schedule indexed for the bounds, its list schedule),
:mod:`~sim.search.bounds` (memory and step-time lower bounds, on the memory model of
:mod:`workloads.memory`), :mod:`~sim.search.screening` (verdicts from the bounds),
:mod:`~sim.search.evaluation` (simulating one layout), :mod:`~sim.search.execution`
(work items and workers), :mod:`~sim.search.store` (the SQLite result store),
:mod:`~sim.search.results` (rows, ranking, CSV, the JSON summary) and
:mod:`~sim.search.sweep` (the rounds, and :func:`search`).

Mixed-GPU clusters (``cluster.nodes``): each pipeline rank's ops are timed in the
bounds on the fastest GPU type among its GPUs (every GPU of the rank takes at
least that long, so the bounds stay bounds), and the memory walk checks each
rank against the smallest memory among its GPUs (a layout fits only if every
GPU fits). A layout whose pipeline ranks mix GPU types cannot be collapsed
(:func:`sim.api.simulate`): with fidelity ``collapsed`` it is ``invalid``
without simulation; ``auto`` simulates it in full. Without a given device
profile every GPU type is timed with its own, as ``sim run`` does.

Pins (:func:`parse_pins`, :func:`pins_from_file`) restrict any dimension to
given values. Pruning happens in rounds of ``round_size`` layouts, each round
judged on the results of the rounds before it, so the set of simulated
layouts (not only the top K), every bound and every figure are the same
whatever executor or number of workers runs the sweep (work done ahead that
the rounds do not want is discarded, never stored).
"""

from __future__ import annotations

from sim.search.evaluation import Evaluation, Evaluator
from sim.search.execution import JudgeChunk, ScreenChunk, SearchWorker, SimulateOne, WorkerSpec
from sim.search.layouts import DIMS, Layout, parse_pins, pins_from_file
from sim.search.results import CSV_FIGURES, Row, SearchResult, rows_csv
from sim.search.screening import Candidate, Screener
from sim.search.space import SearchContext, cp_min_tokens, enumerate_layouts, probe_support
from sim.search.store import ResultStore
from sim.search.sweep import search

__all__ = ["CSV_FIGURES", "DIMS", "Candidate", "Evaluation", "Evaluator", "JudgeChunk", "Layout",
           "ResultStore", "Row", "ScreenChunk", "SearchContext", "SearchResult", "SearchWorker",
           "Screener", "SimulateOne", "WorkerSpec", "cp_min_tokens", "enumerate_layouts",
           "parse_pins", "pins_from_file", "probe_support", "rows_csv", "search"]
