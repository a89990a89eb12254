"""The schedule registry: every built-in pipeline schedule, by experiment-file name.

One table (:data:`SCHEDULES`) and one builder signature, ``build(p, m, v, k) ->
Schedule`` (pipeline ranks, micro-batches, chunks per rank, sequence chunks), as the
Zero Bubble reference code keeps one generator per schedule. The order of ops is
the builder's; the dependencies between ops are not written per schedule but follow
from one rule (:func:`workloads.schedules.op_deps`) and each schedule's data:
whether it splits the backward into ``B`` and ``W`` and whether it cuts micro-batches
into sequence chunks. What the rest of the simulator needs to know about a schedule
(how many chunks per rank it runs, whether its step time is the period of
back-to-back steps, ...) is a property here, read by callers instead of testing
names.

To add a schedule: write its builder (the order of ops on each rank, nothing else;
:mod:`workloads.schedules_advanced` has the examples), add one :class:`ScheduleKind`
row to ``_KINDS`` with its properties, and ``tests/test_registry.py`` checks them
against what the builder builds; experiments, ``sim compare`` and the random
experiments of ``tests/strategies.py`` pick it up from the table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from base.collector import gc_paused
from workloads import schedules_advanced as adv
from workloads import schedules_multimodal as mm
from workloads.schedules import Schedule, gpipe, one_f_one_b, validate
from workloads.schedules_multimodal import EncoderPlan

EncoderBuilder = Callable[[int, int, EncoderPlan | None], Schedule]
"""``build(p, m, plan)``: a multimodal schedule for pipeline ranks, micro-batches and the
encoder's layout and estimated costs (None: no encoder, plain 1F1B)."""

GroupedBuilder = Callable[[int, int, int, int], Schedule]
"""``build(p, m, v, n)``: a multi-chunk schedule for pipeline ranks, micro-batches, chunks per
rank and ``n`` consecutive micro-batches per chunk (Megatron-core's
``microbatch_group_size_per_vp_stage``, ``parallel.microbatch_group_size``)."""

Builder = Callable[[int, int, int, int], Schedule]
"""``build(p, m, v, k)``: pipeline ranks, micro-batches per step, chunks per rank and
sequence chunks per micro-batch (``k`` is read only where :attr:`ScheduleKind.seq_chunks`)."""


@dataclass(frozen=True)
class ScheduleKind:
    """A built-in schedule: its builder and the properties other code depends on."""

    name: str
    """Name in the experiment file (``schedule:``)."""
    build: Builder
    """The builder (:data:`Builder`); raises ScheduleError for arguments it cannot take."""
    default_vpp: int
    """Chunks per rank when the experiment gives no ``parallel.vpp``."""
    fixed_vpp: int | None
    """The only number of chunks per rank the schedule runs (2 for a V placement, 1 for
    one chunk per rank); None: any (interleaved)."""
    split_backward: bool
    """Whether ``B`` is the input gradient only and ``W`` ops carry the weight gradient
    (the dependency rule's ``W(s, m)`` after ``B(s, m)``)."""
    seq_chunks: bool
    """Whether micro-batches run as sequence chunks (Seq1F1B: ``k`` from
    ``training.seq_chunks``); context parallelism does not compose with them."""
    steady_period: bool
    """Whether consecutive steps overlap, so that the step time is the period of
    back-to-back steps (the Zero Bubble paper's optimizer post-validation, Qi et al.
    2024, sec. 4: ZB-H2 and ZB-V; DESIGN.md ``step_time_s``); else the step barrier
    holds and the period is one isolated step."""
    source: str
    """Where the schedule comes from."""
    encoder: EncoderBuilder | None = None
    """Builds the schedule with a multimodal model's encoder ops placed
    (:mod:`workloads.schedules_multimodal`): ``encoder(p, m, plan)``, the same builder as
    :attr:`build`, which passes no plan; None: the schedule has no place for an encoder
    (``model.encoder`` is refused with it)."""
    grouped: GroupedBuilder | None = None
    """Builds the schedule with a given micro-batch group size (:data:`GroupedBuilder`,
    ``parallel.microbatch_group_size``); None: the schedule has no such setting (the
    experiment refuses it)."""

    def __call__(self, p: int, m: int, v: int | None = None, k: int = 1) -> Schedule:
        """The schedule for ``p`` ranks and ``m`` micro-batches, ``v`` chunks per rank
        (default :attr:`default_vpp`), ``k`` sequence chunks (:attr:`seq_chunks` only)."""
        return self.build(p, m, self.default_vpp if v is None else v, k)


def _one_chunk(builder: Callable[[int, int], Schedule]) -> Builder:
    """A ``(p, m)`` builder as a :data:`Builder`: ``v`` and ``k`` are not its to check (the
    experiment rejects ``vpp > 1`` for a one-chunk schedule)."""
    def build(p: int, m: int, v: int, k: int) -> Schedule:
        return builder(p, m)
    return build


def _multimodal(builder: EncoderBuilder) -> Builder:
    """A multimodal builder as a :data:`Builder`, without an encoder (one chunk per rank)."""
    def build(p: int, m: int, v: int, k: int) -> Schedule:
        return builder(p, m, None)
    return build


def _chunked(builder: Callable[[int, int, int], Schedule]) -> Builder:
    """A ``(p, m, v)`` builder as a :data:`Builder` (no sequence chunks)."""
    def build(p: int, m: int, v: int, k: int) -> Schedule:
        return builder(p, m, v)
    return build


_KINDS = (
    ScheduleKind("gpipe", _one_chunk(gpipe), 1, 1, False, False, False,
                 "Huang et al. 2019"),
    ScheduleKind("1f1b", _one_chunk(one_f_one_b), 1, 1, False, False, False,
                 "Narayanan et al. 2021"),
    ScheduleKind("interleaved", _chunked(adv.interleaved), 2, None, False, False, False,
                 "Narayanan et al. 2021, sec. 2.2; Megatron-core "
                 "microbatch_group_size_per_vp_stage", grouped=adv.interleaved),
    ScheduleKind("zb-h1", _chunked(adv.zb_h1), 1, 1, True, False, False,
                 "Qi et al. 2024, sec. 2.1"),
    ScheduleKind("zb-h2", _chunked(adv.zb_h2), 1, 1, True, False, True,
                 "Qi et al. 2024, sec. 2.2"),
    ScheduleKind("zb-v", _chunked(adv.zb_v), 2, 2, True, False, True,
                 "Qi et al. 2024, sec. 6"),
    ScheduleKind("dualpipe-v", _chunked(adv.dualpipe_v), 2, 2, True, False, False,
                 "DeepSeek-AI 2024, sec. 3.2.1"),
    ScheduleKind("seq1f1b", adv.seq1f1b, 1, 1, False, True, False,
                 "Sun et al. 2024, sec. 3"),
    ScheduleKind("encoder-first", _multimodal(mm.encoder_first), 1, 1, False, False, False,
                 "Feng et al. 2024, sec. 2.2 (baseline)", mm.encoder_first),
    ScheduleKind("optimus", _multimodal(mm.optimus), 1, 1, False, False, False,
                 "Feng et al. 2024, sec. 4.2", mm.optimus),
)

SCHEDULES: Mapping[str, ScheduleKind] = MappingProxyType({s.name: s for s in _KINDS})
"""Every built-in schedule by experiment-file name, in the order the docs list them."""

LLM_SCHEDULES: tuple[str, ...] = tuple(s.name for s in _KINDS if s.encoder is None)
"""The schedules of a model without an encoder: what ``sim search`` tries (a multimodal
schedule without an encoder is 1F1B under another name)."""

DEFAULT_SCHEDULES = ("1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipe-v", "seq1f1b")
"""What ``sim compare`` runs without ``--schedules`` (:mod:`sim.compare`; kept here so that
the ``sim`` command's parser names them without importing the comparison)."""
MULTIMODAL_SCHEDULES: tuple[str, ...] = tuple(s.name for s in _KINDS if s.encoder is not None)
"""What ``sim compare`` runs by default for a model with an encoder (the only schedules
that place one)."""


SCHEDULE_CACHE = 16
"""Built schedules :func:`built_schedule` keeps (the least recently used go first); one
of a million ops, with its symbolic run, holds some hundred MB."""


@lru_cache(maxsize=SCHEDULE_CACHE)
def built_schedule(name: str, p: int, m: int, v: int, k: int,
                   group: int | None = None) -> Schedule:
    """``SCHEDULES[name](p, m, v, k)`` (with micro-batch groups of ``group``:
    ``SCHEDULES[name].grouped(p, m, v, group)``), validated
    (:func:`workloads.schedules.validate`), built once per arguments: a schedule depends on
    nothing else, is immutable, and keeps its symbolic run and the arrays derived from it
    (read-only) for the next experiment with the same pipeline (a search's layouts, a
    sweep's, a repeated run)."""
    kind = SCHEDULES[name]
    if group is not None and kind.grouped is None:
        raise ValueError(f"schedule {name!r} has no micro-batch groups")
    with gc_paused():  # hundreds of thousands of ops and their symbolic run: no cycles
        sched = kind(p, m, v, k) if group is None else kind.grouped(p, m, v, group)
        validate(sched)
    return sched


def overlaps_steps(name: str) -> bool:
    """Whether the schedule called ``name`` lets consecutive steps overlap
    (:attr:`ScheduleKind.steady_period`); a schedule file never does."""
    kind = SCHEDULES.get(name)
    return kind is not None and kind.steady_period
