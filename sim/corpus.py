"""The multi-source validation corpus: published training runs beside Hagemann et al.'s sweep.

Every CSV of ``sim/data/validation/`` whose header is :data:`COLUMNS` is one *source* (a
paper's table, a benchmark README, a training log): one row per published run with its
full configuration, the published metric, the step time it converts to (``conversion``
says how), what the source leaves unstated (``assumed``) and where it comes from
(``citation``); ``sim/data/validation/README.md`` describes the columns. Each row becomes
an experiment (:meth:`CorpusRow.experiment`); the settings a row needs that the schema
does not accept are reported per row as skipped, with the schema's error as the reason,
never simulated with other settings. :func:`source_report` compares the predictions with
the published runs, per source.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from base.errors import ConfigError
from sim.device import DeviceProfile
from sim.executors import map_ordered

CORPUS_DIR = Path(__file__).parent / "data" / "validation"
"""Where the corpus ships (package data, next to Hagemann's sweep)."""

COLUMNS = (
    "run", "model", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
    "ffn_hidden_size", "ffn_type", "norm", "vocab_size", "tied_embeddings",
    "position_embedding", "parallel_blocks", "seq_length", "cluster", "gpu", "num_gpus",
    "nics_per_node", "nic_Gbps", "tp", "pp", "dp", "cp", "ep", "vpp", "sequence_parallel",
    "zero_stage", "schedule", "micro_batch_size", "global_batch_size", "recompute",
    "recompute_num_layers", "attention", "fused_norm", "tp_comm_overlap",
    "overlap_grad_reduce", "overlap_param_gather", "precision",
    "framework", "software", "status",
    "published_metric", "published_value", "step_time_s", "peak_memory_gib", "conversion",
    "assumed", "citation", "moe_dispatcher", "moe_a2a_overlap", "expert_tp",
    "layers_per_stage")
"""The header of every corpus CSV, in this order (README.md of the folder says what each is)."""

OPTIONAL_COLUMNS = ("cuda_graph_scope", "grad_bucket_MB", "fp8_param_gather",
                    "fp8_amax_reduction", "peak_memory_measure", "disputed")
"""Columns a corpus CSV may add after :data:`COLUMNS`, in this order (a file whose runs all
leave them empty need not have them): ``cuda_graph_scope``, the parts of each MoE layer the
run captured in CUDA graphs, ``+``-separated (``training.cuda_graph_scope``);
``grad_bucket_MB``, the run's gradient bucket of ``overlap_grad_reduce`` in MB (1e6 B) where
its own config sets one other than its framework profile's rule
(``parallel.grad_bucket_MB``); ``fp8_param_gather``, ``true`` where an FP8 run's parameter
all-gathers move fp8 weights (``training.fp8_param_gather``); ``fp8_amax_reduction``, the
group of FP8 delayed scaling's blocking amax all-reduce where the run's Transformer Engine and
Megatron-core versions differ from its framework profile's (``training.fp8_amax_reduction``);
``peak_memory_measure``, what ``peak_memory_gib`` measures (:data:`PEAK_MEMORY_MEASURES`);
``disputed``, where the same publisher also published a measurement of the same configuration
and software that contradicts the row's step time (or the row belongs to one published series
with such rows), which measurement and by how much: the row is simulated and reported
(``disputed`` of its source's report) but not counted in its source's step-time figures or
the leave-one-source-out fits (:attr:`CorpusRow.timed`)."""

PEAK_MEMORY_MEASURES = ("device", "allocator_reserved")
"""``device`` (or empty): memory in use on the GPU (nvidia-smi's memory.used, or free memory
at its lowest), which the predicted peak is; ``allocator_reserved``: PyTorch's caching
allocator's peak reserved bytes (``torch.cuda.memory_stats()["reserved_bytes.all.peak"]``),
without the CUDA context, NCCL's and userbuffers' buffers, which the prediction then leaves
out (:func:`compared_peak_gib`)."""

REQUIRED = ("run", "seq_length", "cluster", "num_gpus", "tp", "pp", "dp", "cp", "ep", "vpp",
            "sequence_parallel", "zero_stage", "schedule", "micro_batch_size",
            "global_batch_size", "recompute", "attention", "precision", "framework", "software",
            "status", "published_metric", "published_value", "step_time_s", "conversion",
            "assumed", "citation")
"""Columns no row may leave empty: its layout, its source and how its step time was derived."""

INTS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size",
        "vocab_size", "seq_length", "num_gpus", "nics_per_node", "tp", "pp", "dp", "cp", "ep",
        "vpp", "zero_stage", "micro_batch_size", "global_batch_size", "recompute_num_layers",
        "expert_tp")
"""Whole-number columns (empty allowed where not :data:`REQUIRED`)."""
FLOATS = ("nic_Gbps", "published_value", "step_time_s", "peak_memory_gib", "grad_bucket_MB")
"""Real-number columns; a value given must be positive and finite."""
LISTS = ("layers_per_stage",)
"""Columns of whole numbers separated by spaces (``1 2 2 1``: a list in the experiment)."""
BOOLS = ("tied_embeddings", "parallel_blocks", "sequence_parallel", "fused_norm",
         "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather", "moe_a2a_overlap",
         "fp8_param_gather")
"""``true``/``false`` columns (empty: the preset's or the schema's default)."""

STATUSES = ("ok", "oom")
"""``ok``: the source reports the run as having run; ``oom``: it reports it out of memory."""

NEW_SETTINGS = {"precision": "bf16", "framework": "megatron", "parallel_blocks": "false",
                "recompute_num_layers": "", "nic_Gbps": "", "fused_norm": "",
                "tp_comm_overlap": "", "overlap_grad_reduce": "", "overlap_param_gather": "",
                "moe_dispatcher": "", "moe_a2a_overlap": "", "expert_tp": "",
                "layers_per_stage": "", "fp8_param_gather": "", "fp8_amax_reduction": ""}
"""Settings of issue 19 item 4 that a row writes into its experiment only where it differs
from this default (the schema's default, or unset), so that a row needing one the schema
does not (yet) accept is skipped with the schema's error rather than simulated otherwise."""

SETTING_SECTIONS = {"parallel_blocks": "model", "nic_Gbps": "cluster",
                    "tp_comm_overlap": "parallel", "overlap_grad_reduce": "parallel",
                    "overlap_param_gather": "parallel", "moe_dispatcher": "parallel",
                    "moe_a2a_overlap": "parallel", "expert_tp": "parallel",
                    "layers_per_stage": "parallel"}
"""The experiment section each of :data:`NEW_SETTINGS` goes to (the rest: ``training``), under
the column's own name (``nic_Gbps``: ``cluster.nic_Gbps``, a server's per-NIC line rate)."""

MODULES_PREFIX = "modules:"
"""A ``recompute`` value ``modules:a+b`` is Megatron-core's selective recomputation of modules
a and b (``training.recompute: selective`` with ``training.recompute_modules: [a, b]``)."""


def _typed(column: str, text: str) -> bool | int | float | str | list[int]:
    """A column's text as its experiment value: :data:`BOOLS` ``true``/``false``, :data:`INTS`
    and :data:`FLOATS` numbers, :data:`LISTS` lists of whole numbers, the rest as written."""
    if column in BOOLS:
        return text == "true"
    if column in LISTS:
        return [int(x) for x in text.split()]
    if column in INTS:
        return int(text)
    return float(text) if column in FLOATS else text


@dataclass(frozen=True)
class CorpusRow:
    """One published run of a corpus source: its CSV fields as text, checked."""

    source: str
    index: int
    """Row number in its file (0 = the first data line)."""
    values: tuple[tuple[str, str], ...]

    def get(self, column: str) -> str:
        """The column's text ('' if empty)."""
        return dict(self.values)[column]

    @property
    def run(self) -> str:
        return self.get("run")

    @property
    def status(self) -> str:
        return self.get("status")

    @property
    def step_time_s(self) -> float:
        """The published step time (seconds), converted as ``conversion`` says."""
        return float(self.get("step_time_s"))

    @property
    def peak_memory_gib(self) -> float | None:
        """The published peak memory per GPU (GiB), where the source gives one."""
        v = self.get("peak_memory_gib")
        return float(v) if v else None

    @property
    def peak_memory_measure(self) -> str:
        """What ``peak_memory_gib`` measures (:data:`PEAK_MEMORY_MEASURES`; empty: device)."""
        return self.get("peak_memory_measure")

    @property
    def disputed(self) -> str:
        """Why the publisher's own measurements contradict this row's step time ('' where
        nothing does; :data:`OPTIONAL_COLUMNS`)."""
        return self.get("disputed")

    @property
    def timed(self) -> bool:
        """Whether the row's step time counts: the source reports it as having run and no
        measurement of its publisher disputes it. Only these enter the source's step-time
        figures and the leave-one-source-out fits."""
        return self.status == "ok" and not self.disputed

    def experiment(self) -> dict:
        """The experiment mapping that describes this run (:data:`NEW_SETTINGS` only where
        they differ from their defaults). A ``model`` ending in ``.json`` is a Hugging Face
        ``config.json`` shipped under :data:`CORPUS_DIR` (``model.hf_config``), for models
        the shape columns cannot describe (mixture of experts, latent attention)."""
        v = dict(self.values)
        if v["model"].endswith(".json"):
            model: dict = {"hf_config": str(CORPUS_DIR / v["model"])}
        else:
            model = {"preset": v["model"]} if v["model"] else {"name": v["run"]}
        for key in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                    "ffn_hidden_size", "vocab_size"):
            if v[key]:
                model[key] = int(v[key])
        for key in ("ffn_type", "norm", "position_embedding"):
            if v[key]:
                model[key] = v[key]
        if v["tied_embeddings"]:
            model["tied_embeddings"] = v["tied_embeddings"] == "true"
        model["seq_length"] = int(v["seq_length"])
        cluster: dict = {"preset": v["cluster"], "num_gpus": int(v["num_gpus"])}
        if v["gpu"]:
            cluster["gpu"] = v["gpu"]
        if v["nics_per_node"]:
            cluster["nics_per_node"] = int(v["nics_per_node"])
        parallel = {k: int(v[k]) for k in ("tp", "pp", "dp", "cp", "ep", "vpp", "zero_stage")}
        parallel["sequence_parallel"] = v["sequence_parallel"] == "true"
        if v["grad_bucket_MB"]:
            parallel["grad_bucket_MB"] = float(v["grad_bucket_MB"])
        training: dict = {"micro_batch_size": int(v["micro_batch_size"]),
                          "global_batch_size": int(v["global_batch_size"]),
                          "recompute": v["recompute"], "attention": v["attention"]}
        if v["recompute"].startswith(MODULES_PREFIX):  # Megatron-core's recompute_modules
            training["recompute"] = "selective"
            training["recompute_modules"] = v["recompute"][len(MODULES_PREFIX):].split("+")
        if v["cuda_graph_scope"]:
            training["cuda_graph_scope"] = v["cuda_graph_scope"].split("+")
        sections = {"model": model, "cluster": cluster, "parallel": parallel,
                    "training": training}
        for key, default in NEW_SETTINGS.items():
            if v[key] != default:
                sections[SETTING_SECTIONS.get(key, "training")][key] = _typed(key, v[key])
        return {"name": f"{self.source}:{v['run']}", "model": model, "cluster": cluster,
                "parallel": parallel, "training": training, "schedule": v["schedule"]}


@dataclass(frozen=True)
class Source:
    """One corpus CSV: its runs and what they share."""

    name: str
    """The file's stem, e.g. ``llmfoundry_mpt``."""
    rows: tuple[CorpusRow, ...]

    @property
    def framework(self) -> str:
        """The training software of its runs (the ``software`` column), joined if several."""
        return " / ".join(sorted({r.get("software") for r in self.rows}))

    @property
    def gpu(self) -> str:
        """The GPU types of its runs (``gpu`` where given, else the cluster preset's)."""
        from topologies.presets import SERVERS

        def one(r: CorpusRow) -> str:
            if r.get("gpu"):
                return r.get("gpu")
            preset = SERVERS.get(r.get("cluster"))
            return preset.gpu if preset else r.get("cluster")

        return " / ".join(sorted({one(r) for r in self.rows}))


def is_corpus_file(path: Path) -> bool:
    """Whether ``path`` is a CSV whose header is :data:`COLUMNS` (and any leading part of
    :data:`OPTIONAL_COLUMNS` after them)."""
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            header = next(csv.reader(fh), None)
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return header is not None and any(
        tuple(header) == COLUMNS + OPTIONAL_COLUMNS[:k] for k in range(len(OPTIONAL_COLUMNS) + 1))


def corpus_files(directory: Path = CORPUS_DIR) -> list[Path]:
    """The corpus CSVs of ``directory``, sorted by name (other CSVs there are not sources)."""
    return sorted(p for p in directory.glob("*.csv") if is_corpus_file(p))


def load_source(path: str | Path) -> Source:
    """Read one corpus CSV; ConfigError naming the row and column of any malformed field:
    a required column empty, a number that is not one (or not positive and finite), an
    unknown status or boolean, a run name used twice."""
    p = Path(path)
    if not is_corpus_file(p):
        raise ConfigError(f"corpus file {str(p)!r}: not a CSV with the corpus header "
                          f"({', '.join(COLUMNS[:4])}, ...)")
    with p.open(newline="", encoding="utf-8") as fh:
        records = list(csv.DictReader(fh))
    rows = tuple(_check(p, i, rec) for i, rec in enumerate(records))
    if not rows:
        raise ConfigError(f"corpus file {str(p)!r} has no runs")
    names = [r.run for r in rows]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"corpus file {str(p)!r}: run names used twice: {', '.join(dup)}")
    return Source(p.stem, rows)


def _check(path: Path, i: int, rec: dict) -> CorpusRow:
    """Row ``i`` of a corpus CSV (line ``i + 2``), checked."""
    where = f"corpus file {str(path)!r}, row {i + 2}"
    if None in rec or any(rec.get(k) is None for k in COLUMNS):
        raise ConfigError(f"{where}: expected {len(COLUMNS)} fields")
    empty = [k for k in REQUIRED if not rec[k].strip()]
    if empty:
        raise ConfigError(f"{where}: no value for {', '.join(empty)}")
    for k in INTS:
        if rec[k]:
            try:
                ok = int(rec[k]) >= (0 if k == "zero_stage" else 1)
            except ValueError:
                ok = False
            if not ok:
                raise ConfigError(f"{where}: {k}={rec[k]!r} is not a positive whole number")
    for k in FLOATS:
        if rec.get(k):
            try:
                x = float(rec[k])
            except ValueError:
                x = math.nan
            if not (math.isfinite(x) and x > 0):
                raise ConfigError(f"{where}: {k}={rec[k]!r} is not a positive, finite number")
    for k in LISTS:
        if not all(x.isdigit() for x in rec[k].split()):
            raise ConfigError(f"{where}: {k}={rec[k]!r} is not whole numbers separated by spaces")
    bad = [f"{k}={rec[k]!r}" for k in BOOLS if rec.get(k, "") not in ("", "true", "false")]
    if bad:
        raise ConfigError(f"{where}: {', '.join(bad)}: expected true or false")
    if rec["status"] not in STATUSES:
        raise ConfigError(f"{where}: status={rec['status']!r}: expected one of "
                          f"{', '.join(STATUSES)}")
    if rec.get("peak_memory_measure", "") not in ("", *PEAK_MEMORY_MEASURES):
        raise ConfigError(f"{where}: peak_memory_measure={rec['peak_memory_measure']!r}: "
                          f"expected one of {', '.join(PEAK_MEMORY_MEASURES)}")
    return CorpusRow(path.stem, i, tuple((k, (rec.get(k) or "").strip())
                                         for k in COLUMNS + OPTIONAL_COLUMNS))


def load_corpus(directory: Path = CORPUS_DIR) -> list[Source]:
    """Every source of the corpus in ``directory``, sorted by name."""
    return [load_source(p) for p in corpus_files(directory)]


# ---------------------------------------------------------------- predictions
@dataclass(frozen=True)
class CorpusPrediction:
    """What the simulator says about one corpus row, or why it was not simulated."""

    row: CorpusRow
    step_time_s: float | None = None
    peak_memory_gib: float | None = None
    oom: bool | None = None
    skipped: str | None = None
    """The schema's (or the layout check's) error for a row the simulator cannot express."""
    gpu: str | None = None
    """The GPU type the row ran on (its cluster's), where simulated."""
    capacity_gib: float | None = None
    """The memory its GPU gives the framework (``sim run``'s ``memory_capacity_gib``), where
    simulated: what :mod:`sim.oomband` measures the peak's margin against."""
    outside_allocator_gib: float = 0.0
    """Of the peak, the reserved memory PyTorch's allocator does not hold, on the fullest
    stage (:attr:`sim.reserved.Reserved.outside_allocator`)."""


def compared_peak_gib(p: CorpusPrediction) -> float | None:
    """The predicted peak as the row's ``peak_memory_measure`` measures it: less the memory
    outside PyTorch's allocator where the source publishes the allocator's peak reserved."""
    if p.peak_memory_gib is None:
        return None
    if getattr(p.row, "peak_memory_measure", "") == "allocator_reserved":
        return p.peak_memory_gib - p.outside_allocator_gib
    return p.peak_memory_gib


TimeScales = tuple[float, float]
"""(a, b): GEMM times and attention-kernel times multiplied by a and b (1/η scaled), the two
constants leave-one-source-out refits (:mod:`sim.loso`); (1, 1) is the shipped profile."""


def scaled_profile(profile: DeviceProfile, scales: TimeScales) -> DeviceProfile:
    """``profile`` with its GEMM efficiency divided by ``scales[0]`` and every attention
    kernel's efficiency by ``scales[1]`` (so those kernels take a and b times as long)."""
    a, b = scales
    if (a, b) == (1.0, 1.0):
        return profile
    return dataclasses.replace(
        profile, gemm_efficiency=profile.gemm_efficiency / a,
        flash2_efficiency=profile.flash2_efficiency / b,
        flash1_efficiency=profile.flash1_efficiency / b,
        flash3_efficiency=(None if profile.flash3_efficiency is None
                           else profile.flash3_efficiency / b),
        cudnn_efficiency=(None if profile.cudnn_efficiency is None
                          else profile.cudnn_efficiency / b),
        bmm_attention_efficiency=profile.bmm_attention_efficiency / b)


def simulate_corpus_row(job: tuple[CorpusRow, TimeScales]) -> CorpusPrediction:
    """Simulate one row (collapsed fidelity) with its GPU's shipped profile scaled by the
    job's :data:`TimeScales`; a ConfigError from the schema or the layout becomes the row's
    ``skipped`` reason."""
    from sim.api import simulate
    from sim.calibration import default_profile
    from sim.experiment import build_experiment

    row, scales = job
    try:
        exp = build_experiment(row.experiment())
        profile = scaled_profile(default_profile(exp.cluster.gpu.name), scales)
        stats = simulate(exp, profile, fidelity="collapsed", idle=False).stats
    except ConfigError as exc:
        return CorpusPrediction(row, skipped=str(exc))
    return CorpusPrediction(row, stats["step_time_s"], stats["peak_memory_gib"], stats["oom"],
                            gpu=exp.cluster.gpu.name, capacity_gib=stats["memory_capacity_gib"],
                            outside_allocator_gib=_outside_allocator_gib(exp, profile, stats))


def _outside_allocator_gib(exp, profile, stats: dict) -> float:
    """The fullest stage's reserved memory outside PyTorch's allocator, GiB (0 where the
    profile's reserved memory is its constant)."""
    from sim import reserved
    from sim.gpu_profiles import generation_of

    if exp.model is None or not profile.reserved_from_run:
        return 0.0
    per = stats["peak_memory_per_stage_gib"]
    stage = max(range(len(per)), key=per.__getitem__)
    return reserved.breakdown(exp, generation_of)[stage].outside_allocator / 2**30


def predict_corpus(rows: Sequence[CorpusRow], workers: int = 1,
                   progress: Callable[[int, int], None] | None = None,
                   scales: TimeScales = (1.0, 1.0)) -> list[CorpusPrediction]:
    """Every row simulated (or skipped), in row order whatever ``workers``."""
    return map_ordered(simulate_corpus_row, [(r, scales) for r in rows], workers, progress)


# ---------------------------------------------------------------- per-source figures
def error_figures(errors: Sequence[float]) -> dict:
    """``step_time_mape``, ``mean_signed_error`` and ``max_error`` (largest absolute, with its
    sign) of relative step-time errors (predicted / published - 1); None without errors."""
    if not errors:
        return {"step_time_mape": None, "mean_signed_error": None, "max_error": None}
    return {"step_time_mape": sum(abs(e) for e in errors) / len(errors),
            "mean_signed_error": sum(errors) / len(errors),
            "max_error": max(errors, key=lambda e: (abs(e), e))}


def source_report(source: Source, preds: Sequence[CorpusPrediction],
                  loso_mape: float | None) -> dict:
    """One entry of ``sim validate --json``'s ``sources``: the source's accuracy on the
    runs simulated (``runs``), false out-of-memory verdicts on runs the source reports as
    having run, its leave-one-source-out MAPE, the rows skipped and why, the rows disputed
    (:attr:`CorpusRow.disputed`: simulated, with their error, not in the step-time figures)
    and why, and every run's numbers (``rows``)."""
    ran = [p for p in preds if p.skipped is None]
    errors = [p.step_time_s / p.row.step_time_s - 1 for p in ran if p.row.timed]
    mem = [(compared_peak_gib(p), p.row.peak_memory_gib) for p in ran
           if p.row.peak_memory_gib is not None]
    return {
        "name": source.name,
        "framework": source.framework,
        "gpu": source.gpu,
        "runs": len(ran),
        **error_figures(errors),
        "false_oom": sum(bool(p.oom) for p in ran if p.row.status == "ok"),
        "loso_mape": loso_mape,
        "rows_in_file": len(source.rows),
        "skipped": [{"run": p.row.run, "reason": p.skipped} for p in preds if p.skipped],
        "disputed": [{"run": p.row.run, "error": p.step_time_s / p.row.step_time_s - 1,
                      "reason": p.row.disputed} for p in ran if p.row.disputed],
        "peak_memory_mape": (sum(abs(m / pub - 1) for m, pub in mem) / len(mem)
                             if mem else None),
        "rows": [{"run": p.row.run, "status": p.row.status,
                  "published_step_time_s": p.row.step_time_s,
                  "predicted_step_time_s": p.step_time_s,
                  "error": (None if p.step_time_s is None
                            else p.step_time_s / p.row.step_time_s - 1),
                  "predicted_oom": p.oom,
                  "published_peak_memory_gib": p.row.peak_memory_gib,
                  "predicted_peak_memory_gib": p.peak_memory_gib,
                  "compared_peak_memory_gib": compared_peak_gib(p),
                  "memory_capacity_gib": p.capacity_gib}
                 for p in preds if p.skipped is None],
    }
