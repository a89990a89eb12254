"""Validation against published measurements: Hagemann et al. 2023's layout sweep.

Every row of ``hagemann2023_sweep.csv`` (REFERENCES.md) becomes an experiment:
LLaMA 13B/30B/65B with the shapes of REFERENCES.md and a 128,000-token untied
vocabulary (inferred: it reproduces the sheets' MFU to 0.01%), DGX A100-80GB
nodes with two HDR ports each (:data:`NICS_PER_NODE`), ZeRO-1, 1F1B, global batch
4,194,304 tokens, and the sweep's framework (:data:`FRAMEWORK`, Aleph Alpha's
``scaling``, a profile of :mod:`workloads.frameworks` read from its source: its pipeline
split, its sequence parallelism, its fp32 gradient all-reduce, its loss over gathered
logits). The simulator predicts its step time and whether it runs out of memory; :func:`evaluate`
compares with what was measured. Nothing here is fitted per row.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from base.errors import ConfigError
from sim.device import DeviceProfile
from sim.executors import map_ordered
from workloads.models import PRESETS

HAGEMANN_SWEEP = Path(__file__).parent / "data" / "validation" / "hagemann2023_sweep.csv"
"""The 984 measured runs of Hagemann et al. 2023, shipped with the package (source:
docs/REFERENCES.md, "The validation data"; sim/data/validation/README.md)."""

GLOBAL_BATCH_TOKENS = 4_194_304
"""Tokens per optimizer step in the sweep (2048 sequences of 2k, 512 of 8k; unverified)."""
VOCAB_SIZE = 128_000
"""Vocabulary that reproduces the sheets' parameter counts (N = 14.0B / 33.8B / 66.9B)."""
CLUSTER_PRESET = "dgx-a100-80g"
"""The sweep's servers: eight A100-80GB on NVSwitch (REFERENCES.md), with :data:`NICS_PER_NODE`."""
NICS_PER_NODE = 2
"""Scale-out NICs per server of the sweep's cluster, each a 200 Gb/s HDR InfiniBand port
shared by four GPUs (:func:`topologies.graphs.nvswitch_cluster`), 50 GB/s per node where a
DGX A100 has eight ports, 200 GB/s. The sweep's report gives "200 Gb/s HDR InfiniBand
between nodes" and not the port count, so it is chosen from the four counts that divide
eight GPUs by the step-time fit (``benchmarks/calibrate.py --nics K``, the compute
efficiencies refitted for each, :mod:`sim.calibration` has the table): with eight ports the
fit misses by the most exactly where the gradient all-reduce crosses the most servers
(LLaMA-30B on 32 servers, TP x PP <= 4: 10-30% slower than predicted), and no compute
constant can absorb
a cost that grows with the bytes each GPU reduces."""
FRAMEWORK = "scaling"
"""The sweep's framework, Aleph Alpha's ``scaling`` (``training.framework``): its pipeline split,
sequence parallelism, fp32 gradient all-reduce, loss over gathered logits and kept pipeline
buffers are that profile's (:mod:`workloads.frameworks`, ``frameworks.toml``, each with the
place in scaling's source it was read from)."""


SOFTWARE = "scaling (Aleph Alpha)"
"""The sweep's training software, as ``sim validate --json`` names it in ``sources``."""

BEST_WITHIN = 0.02
"""A predicted best layout counts as a hit if its measured step time is within 2% of the best."""


@dataclass(frozen=True)
class Row:
    """One measured run of the sweep."""

    index: int
    model: str
    seq_length: int
    num_gpus: int
    tp: int
    pp: int
    dp: int
    micro_batch_size: int
    recompute: str
    attention: str
    fused_norm: bool
    sequence_parallel: bool
    status: str
    """``ok``, ``oom``, ``kernel_unavailable`` or ``error``."""
    step_time_s: float | None
    nics_per_node: int | None = None
    """NICs per server of the run's cluster; None: :data:`NICS_PER_NODE` (a field, so that
    ``benchmarks/calibrate.py --nics`` reaches worker processes whatever their start method)."""

    @property
    def layout(self) -> str:
        """The run's layout in a few words, e.g. ``tp2 pp4 dp32 mbs1 none flash2 fused-norm``."""
        return " ".join([f"tp{self.tp} pp{self.pp} dp{self.dp} mbs{self.micro_batch_size}",
                         self.recompute, self.attention,
                         *(["fused-norm"] if self.fused_norm else []),
                         *(["sp"] if self.sequence_parallel else [])])

    @property
    def group(self) -> tuple[str, int, int]:
        """(model, sequence length, GPUs): the sweep's unit of comparison."""
        return (self.model, self.seq_length, self.num_gpus)

    def experiment(self) -> dict:
        """The experiment mapping that describes this run."""
        return {
            "name": f"hagemann-row{self.index}",
            "model": {"preset": self.model, "seq_length": self.seq_length,
                      "vocab_size": VOCAB_SIZE},
            "cluster": {"preset": CLUSTER_PRESET, "num_gpus": self.num_gpus,
                        "nics_per_node": self.nics_per_node or NICS_PER_NODE},
            "parallel": {"tp": self.tp, "pp": self.pp, "dp": self.dp, "zero_stage": 1,
                         "sequence_parallel": self.sequence_parallel},
            "training": {"micro_batch_size": self.micro_batch_size,
                         "global_batch_size": GLOBAL_BATCH_TOKENS // self.seq_length,
                         "recompute": self.recompute, "attention": self.attention,
                         "fused_norm": self.fused_norm, "framework": FRAMEWORK},
            "schedule": "1f1b",
        }


STATUSES = ("ok", "oom", "kernel_unavailable", "error")
"""A sweep run's outcome as the CSV's ``status`` column gives it."""


def load_rows(path: str | Path) -> list[Row]:
    """Read the sweep CSV; ConfigError naming the row and column if it is missing, empty,
    not UTF-8 text, or has a malformed row (a missing field, an unknown model or status, a
    non-positive degree, or a successful run whose step time is not a positive number)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--data: file {str(p)!r} does not exist")
    rows = []
    try:
        with p.open(newline="", encoding="utf-8") as fh:
            rows = [_row(i, rec, p) for i, rec in enumerate(csv.DictReader(fh))]
    except UnicodeDecodeError:
        raise ConfigError(f"--data: file {str(p)!r} is not UTF-8 text (a CSV file is)") from None
    except csv.Error as exc:
        raise ConfigError(f"--data: file {str(p)!r} is not a valid CSV file: {exc}") from None
    if not rows:
        raise ConfigError(f"--data: file {str(p)!r} has no runs (an empty file, or a header "
                          "without rows)")
    return rows


def _row(i: int, rec: dict, path: Path) -> Row:
    """Row ``i`` of the CSV (line ``i + 2``), checked."""
    where = f"--data: row {i + 2} of {str(path)!r}"
    missing = [k for k in _COLUMNS if rec.get(k) is None]
    if missing:
        raise ConfigError(f"{where} is malformed: no value for {', '.join(missing)}")
    try:
        ints = {k: int(rec[k]) for k in ("seq_length", "num_gpus", "tp", "pp", "dp",
                                         "micro_batch_size")}
        step = float(rec["step_time_s"]) if rec["step_time_s"] else None
    except ValueError as exc:
        raise ConfigError(f"{where} is malformed: {exc}") from None
    bad = [f"{k}={v}" for k, v in ints.items() if v < 1]
    if bad:
        raise ConfigError(f"{where} is malformed: {', '.join(bad)} (must be >= 1)")
    if rec["model"] not in PRESETS:
        raise ConfigError(f"{where}: model={rec['model']!r} is not a known preset")
    if rec["status"] not in STATUSES:
        raise ConfigError(f"{where}: status={rec['status']!r}: expected one of "
                          f"{', '.join(STATUSES)}")
    if rec["status"] == "ok" and (step is None or not math.isfinite(step) or step <= 0):
        raise ConfigError(f"{where}: step_time_s={rec['step_time_s']!r}: a run that ran needs a "
                          "positive, finite step time")
    return Row(i, rec["model"], ints["seq_length"], ints["num_gpus"], ints["tp"], ints["pp"],
               ints["dp"], ints["micro_batch_size"], rec["recompute"], rec["attention"],
               rec["fused_norm"] == "true", rec["sequence_parallel"] == "true", rec["status"],
               step)


_COLUMNS = ("model", "seq_length", "num_gpus", "tp", "pp", "dp", "micro_batch_size",
            "recompute", "attention", "fused_norm", "sequence_parallel", "status", "step_time_s")


@dataclass(frozen=True)
class Prediction:
    row: Row
    step_time_s: float
    peak_memory_gib: float
    oom: bool
    memory_parts: tuple[tuple[float, ...], ...] = ()
    """Per simulated GPU, (static bytes, peak dynamic bytes, reserved bytes): the first two
    before the allocator's fragmentation, the third the run's reserved memory
    (:mod:`sim.reserved`) on that GPU: what benchmarks/calibrate.py fits the fragmentation
    on."""
    capacity_gib: float | None = None
    """The memory the GPU gives the framework (``sim run``'s ``memory_capacity_gib``): what
    :mod:`sim.oomband` measures the peak's margin against."""


def simulate_row(row: Row, profile: DeviceProfile, idle: bool = True):
    """The run ``row`` simulated with ``profile`` (its experiment selects the sweep's
    framework, :data:`FRAMEWORK`), collapsed fidelity: a :class:`sim.api.Result` (without
    ``idle``, its stats lack the idle breakdown, which validation does not read)."""
    from sim.api import simulate
    from sim.experiment import build_experiment

    return simulate(build_experiment(row.experiment()), profile, fidelity="collapsed",
                    idle=idle)


def _predict_one(args: tuple[Row, DeviceProfile], reference: bool = False) -> Prediction:
    """The row's prediction with the profile; ``reference``: its memory floors read from the
    timeline's samples (:func:`memory_floors`), not the engine's summary (the same floats)."""
    from sim import reserved
    from sim.api import simulate
    from sim.experiment import build_experiment
    from sim.gpu_profiles import generation_of
    from topologies.placement import coordinate_columns

    row, profile = args
    exp = build_experiment(row.experiment())
    result = simulate(exp, profile, fidelity="collapsed", idle=False)
    stats, timeline = result.stats, result.timeline
    # each GPU's smallest allocated bytes: the engine's summary (a collapsed run's timeline
    # then makes no records, a third of a sweep row's time)
    floor = memory_floors(timeline) if reference else timeline.memory_floor_by_gpu
    if profile.reserved_from_run and exp.model is not None:
        stage = coordinate_columns(exp.placement)["pp"]
        per = reserved.per_stage(exp, generation_of)
        resv = {g: per[stage[g]] for g in floor}
    else:
        resv = dict.fromkeys(floor, profile.reserved_bytes)
    parts = tuple((floor[g], timeline.peak_memory_bytes(g) - floor[g], resv[g])
                  for g in sorted(floor))
    return Prediction(row, stats["step_time_s"], stats["peak_memory_gib"], stats["oom"], parts,
                      stats["memory_capacity_gib"])


def memory_floors(timeline) -> dict[int, float]:
    """Per GPU with memory samples, its smallest allocated bytes, read sample by sample from
    ``timeline.memory`` (the first of equal ones kept): the reference of what
    :func:`_predict_one` reads, :attr:`sim.timeline.Timeline.memory_floor_by_gpu`
    (``tests/test_valfast.py`` holds the predictions to it)."""
    floor: dict[int, float] = {}
    for m in timeline.memory:
        floor[m.gpu] = min(floor.get(m.gpu, m.bytes), m.bytes)
    return floor


def predict(rows: Sequence[Row], profile: DeviceProfile, workers: int = 1,
            progress: Callable[[int, int], None] | None = None) -> list[Prediction]:
    """Simulate every row (collapsed fidelity); results in row order whatever ``workers``."""
    todo = [(r, profile) for r in rows if r.status in ("ok", "oom")]
    return map_ordered(_predict_one, todo, workers, progress, chunksize=4)


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman rank correlation (average ranks for ties); None below 3 points."""
    if len(a) < 3:
        return None
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = math.sqrt(sum((x - ma) ** 2 for x in ra))
    vb = math.sqrt(sum((y - mb) ** 2 for y in rb))
    return cov / (va * vb) if va and vb else None


def _mape(preds: Sequence[Prediction]) -> float | None:
    ok = [p for p in preds if p.row.status == "ok"]
    if not ok:
        return None
    return sum(abs(p.step_time_s / p.row.step_time_s - 1) for p in ok) / len(ok)


def evaluate(preds: Sequence[Prediction]) -> dict:
    """Accuracy figures of ``preds`` against the measurements (see ``sim validate``)."""
    groups: dict[tuple, list[Prediction]] = {}
    for p in preds:
        groups.setdefault(p.row.group, []).append(p)
    per_group = []
    hits = 0
    for key in sorted(groups):
        gp = groups[key]
        ok = [p for p in gp if p.row.status == "ok"]
        best = min(ok, key=lambda p: (p.row.step_time_s, p.row.index)) if ok else None
        best_measured = best.row.step_time_s if best else None
        feasible = [p for p in gp if not p.oom]
        pick = min(feasible, key=lambda p: (p.step_time_s, p.row.index)) if feasible else None
        # how much slower the pick ran than the best (None: it did not run, or nothing did)
        gap = (pick.row.step_time_s / best_measured - 1
               if pick and pick.row.status == "ok" and best_measured else None)
        hit = gap is not None and pick.row.step_time_s <= best_measured * (1 + BEST_WITHIN)
        hits += hit
        rho = spearman([p.row.step_time_s for p in ok], [p.step_time_s for p in ok])
        per_group.append({
            "model": key[0], "seq_length": key[1], "num_gpus": key[2],
            "runs": len(gp), "ok_runs": len(ok),
            "step_time_mape": _mape(gp),
            "oom_accuracy": sum(p.oom == (p.row.status == "oom") for p in gp) / len(gp),
            "spearman": rho,
            "best_measured_s": best_measured,
            "predicted_best_row": pick.row.index if pick else None,
            "predicted_best_measured_s": pick.row.step_time_s if pick else None,
            "best_layout_hit": hit,
            "measured_best_row": best.row.index if best else None,
            "measured_best_layout": best.row.layout if best else None,
            "predicted_best_layout": pick.row.layout if pick else None,
            "predicted_best_status": pick.row.status if pick else None,
            "predicted_best_gap": gap,
        })
    return {
        "step_time_mape": _mape(preds),
        "oom_accuracy": sum(p.oom == (p.row.status == "oom") for p in preds) / len(preds),
        "runs_compared": len(preds),
        "ok_runs": sum(p.row.status == "ok" for p in preds),
        "best_layout_hits": hits,
        "num_groups": len(per_group),
        "groups": per_group,
    }


_SAME_GPU_WORK = ("model", "seq_length", "tp", "pp", "micro_batch_size", "recompute", "attention",
                  "fused_norm", "sequence_parallel")
"""The fields of a sweep run that fix what one GPU holds, but for the DP degree."""


def contradicted(rows: Sequence[Row]) -> list[tuple[int, int]]:
    """Pairs (ran, out of memory) of sweep rows that no memory model can both get right: the
    second was recorded out of memory although it differs from the first, which ran, only in
    a larger DP degree, so every one of its GPUs holds no more. The sweep's runs are ZeRO-1
    (:meth:`Row.experiment`): more DP replicas shard the optimizer state finer and, the global
    batch fixed, leave fewer micro-batches a pipeline, never more in flight; the weights,
    gradients and each micro-batch's activations on a GPU are the same. Row indices, sorted."""
    by_work: dict[tuple, list[Row]] = {}
    for r in rows:
        by_work.setdefault(tuple(getattr(r, k) for k in _SAME_GPU_WORK), []).append(r)
    pairs = [(a.index, b.index) for same in by_work.values() for a in same if a.status == "ok"
             for b in same if b.status == "oom" and b.dp > a.dp]
    return sorted(pairs)


def contradicted_ran(rows: Sequence[Row]) -> frozenset[int]:
    """Indices of the rows that ran in a :func:`contradicted` pair: left out of ``false_oom``
    (a model that flags such a row gets its twin, recorded out of memory with no more memory
    a GPU, right; no model gets both), reported under ``contradicted`` instead."""
    return frozenset(a for a, _ in contradicted(rows))


def sweep_source_report(preds: Sequence[Prediction], name: str, loso_mape: float | None) -> dict:
    """The sweep's entry in ``sim validate --json``'s ``sources`` (the keys of
    :func:`sim.corpus.source_report`): runs compared (ran or out of memory), step-time errors
    of those that ran, how many that ran are predicted out of memory (``false_oom``, not
    counting the rows that ran in a contradicted pair), its leave-one-source-out MAPE; and
    ``contradicted``: the pairs of rows the sweep records against each other
    (:func:`contradicted`), as ``{"ran": i, "oom": j, "ran_predicted_oom": bool,
    "oom_predicted_oom": bool}``, with ``false_oom_contradicted``, how many of their rows that
    ran are predicted out of memory (docs/accuracy.md, "Contradicted rows")."""
    from sim.corpus import error_figures
    from topologies.presets import SERVERS

    ok = [p for p in preds if p.row.status == "ok"]
    pairs = contradicted([p.row for p in preds])
    twins = frozenset(a for a, _ in pairs)
    flagged = {p.row.index: bool(p.oom) for p in preds}
    return {"name": name, "framework": SOFTWARE, "gpu": SERVERS[CLUSTER_PRESET].gpu,
            "runs": len(preds),
            **error_figures([p.step_time_s / p.row.step_time_s - 1 for p in ok]),
            "false_oom": sum(bool(p.oom) for p in ok if p.row.index not in twins),
            "loso_mape": loso_mape,
            "rows_in_file": len(preds), "skipped": [],
            "contradicted": [{"ran": a, "oom": b, "ran_predicted_oom": flagged[a],
                              "oom_predicted_oom": flagged[b]} for a, b in pairs],
            "false_oom_contradicted": sum(flagged[a] for a in twins)}


def source_entries(sweep_name: str, preds: Sequence[Prediction], sources: Sequence,
                   cpreds: Sequence, loso: dict) -> tuple[list[dict], dict]:
    """``sources`` and ``oom_band`` of ``sim validate``'s report: the sweep's entry
    (:func:`sweep_source_report` of ``preds``, named ``sweep_name``), then each corpus
    source's (:func:`sim.corpus.source_report` of its rows in ``cpreds``, the predictions of
    every source's rows), each with its leave-one-source-out MAPE and scales from ``loso``
    (:func:`sim.loso.leave_one_source_out`; an empty mapping without the fits: None), and
    the OOM verdict's resolution over all of them (:func:`oom_band`)."""
    from sim.corpus import source_report

    fold = loso.get(sweep_name)
    entries = [sweep_source_report(preds, sweep_name, fold["loso_mape"] if fold else None)]
    entries[0]["loso_scales"] = fold["scales"] if fold else None
    for source in sources:
        mine = [p for p in cpreds if p.row.source == source.name]
        fold = loso.get(source.name)
        entry = source_report(source, mine, fold["loso_mape"] if fold else None)
        entry["loso_scales"] = fold["scales"] if fold else None
        entries.append(entry)
    return entries, oom_band(entries, preds, cpreds)


def oom_band(entries: list[dict], preds: Sequence[Prediction], cpreds: Sequence) -> dict:
    """The OOM verdict's resolution (:mod:`sim.oomband`, ``sim/data/oom_band.toml``): its
    half-width, measured on ``cpreds`` (the corpus's predictions) where the rule names a
    measure; each entry of ``entries`` (the sweep's first, then the corpus sources' in the
    order of ``cpreds``) gains the band's figures (:func:`sim.oomband.figures`), and each
    corpus row its ``memory_margin`` and ``oom_verdict``. The hard verdicts and counts stay
    as they are."""
    from sim import oomband
    from sim.corpus import compared_peak_gib

    ran = [p for p in cpreds if p.skipped is None]
    band, measured_on = oomband.half_width(
        oomband.RULE, [(compared_peak_gib(p), p.row.peak_memory_gib) for p in ran
                       if p.row.peak_memory_gib is not None])
    twins = contradicted_ran([p.row for p in preds])
    entries[0].update(oomband.figures(
        [oomband.Run(p.row.status == "ok", bool(p.oom), p.peak_memory_gib, p.capacity_gib,
                     p.row.index not in twins) for p in preds], band))
    for entry in entries[1:]:
        mine = [p for p in ran if p.row.source == entry["name"]]
        entry.update(oomband.figures(
            [oomband.Run(p.row.status == "ok", bool(p.oom), p.peak_memory_gib, p.capacity_gib)
             for p in mine], band))
        for row, p in zip(entry["rows"], mine, strict=True):
            row["memory_margin"] = (None if p.capacity_gib is None
                                    else oomband.margin(p.peak_memory_gib, p.capacity_gib))
            row["oom_verdict"] = oomband.verdict(p.peak_memory_gib, p.capacity_gib, band)
    return {"measure": oomband.RULE.measure, "half_width": band,
            "published_peaks": measured_on, "source": oomband.RULE.source}


def write_csv(preds: Sequence[Prediction], path: Path) -> None:
    """Predicted against measured, one line per compared run."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["row", "model", "seq_length", "num_gpus", "tp", "pp", "dp",
                    "micro_batch_size", "recompute", "attention", "fused_norm",
                    "sequence_parallel", "status", "measured_step_time_s",
                    "predicted_step_time_s", "predicted_peak_memory_gib", "predicted_oom"])
        for p in preds:
            r = p.row
            w.writerow([r.index, r.model, r.seq_length, r.num_gpus, r.tp, r.pp, r.dp,
                        r.micro_batch_size, r.recompute, r.attention, str(r.fused_norm).lower(),
                        str(r.sequence_parallel).lower(), r.status,
                        "" if r.step_time_s is None else f"{r.step_time_s:.4f}",
                        f"{p.step_time_s:.4f}", f"{p.peak_memory_gib:.3f}",
                        str(p.oom).lower()])
