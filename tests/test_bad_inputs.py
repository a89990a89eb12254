"""Bad and absurd inputs: every one exits 2 with one ``error:`` line, fast; valid ones
print one finite JSON object (issue 21, "Crashes, hangs, memory and nonsense accepted").

The reported cases are examples; :func:`test_mutated_examples_exit_cleanly` is a
hypothesis-driven mutation fuzzer over the bundled examples: one leaf replaced by NaN,
infinity, a huge, tiny, negative or zero number, a value of the wrong type, or one key
given twice. Every case runs in process through :func:`sim.cli.main`.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.api import load_experiment
from tests.conftest import ROOT, SMALL_EXPERIMENT
from tests.conftest import run_cli as cli

EXAMPLES = ROOT / "workloads" / "examples"
SECONDS = 10.0
"""Each case must end within this many CPU seconds (a few alone). CPU time, not wall time:
on a shared test machine the wall clock measures the other jobs' load as well."""

BASE = SMALL_EXPERIMENT
SYNTHETIC = {
    "model": {"synthetic": {"forward_ms": 1.0, "backward_ms": 2.0}},
    "cluster": {"preset": "ideal", "num_gpus": 4},
    "parallel": {"pp": 4},
    "training": {"num_microbatches": 8},
}
FAILURES = {"mtbf_hours": 1.0, "checkpoint_interval_steps": 10}


def run_cli(argv: list[str]) -> tuple[int, str, str, float]:
    """``sim ARGV`` in process: exit status, stdout, stderr and CPU seconds taken."""
    start = time.process_time()
    rc, out, err = cli(argv)
    return rc, out, err, time.process_time() - start


def _reject_constant(name: str) -> None:
    raise AssertionError(f"bare {name} in the JSON output")


def _numbers(value: Any, path: str = "") -> list[tuple[str, float]]:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return []
    if isinstance(value, int | float):
        return [(path, value)]
    items = value.items() if isinstance(value, dict) else enumerate(value)
    return [n for key, item in items for n in _numbers(item, f"{path}.{key}")]


def assert_clean(rc: int, out: str, err: str, seconds: float, what: str,
                 mfu_bound: float = 1.0) -> dict | None:
    """Exit 0 with exactly one finite JSON object (no negative time, MFU at most
    ``mfu_bound``), or exit 2 with one ``error:`` line and nothing on stdout; within
    :data:`SECONDS`."""
    assert seconds < SECONDS, f"{what}: took {seconds:.1f} s"
    if rc == 2:
        assert out == "", what
        assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), \
            f"{what}: {err[-2000:]}"
        return None
    assert rc == 0, f"{what}: exit {rc}: {err[-2000:]}"
    stats = json.loads(out, parse_constant=_reject_constant)
    assert isinstance(stats, dict), what
    for path, number in _numbers(stats):
        assert math.isfinite(number), f"{what}: {path} = {number}"
        if path.endswith("_s"):
            assert number >= 0, f"{what}: negative time {path} = {number}"
    mfu = stats.get("mfu")
    assert mfu is None or 0 <= mfu <= mfu_bound, f"{what}: MFU {mfu} > {mfu_bound}"
    return stats


def mfu_bound(path: Path) -> float:
    """The largest MFU a run of the experiment at ``path`` can report.

    MFU counts PaLM's model FLOPs, 6·N + 12·l·h·s per token, whose attention term is the
    full s × s score matrix; a causal kernel computes half of it. So a run at the GPUs'
    peak reports 1 / (1 − a/2), a the attention term's share of the count: 1 for short
    sequences, towards 2 when attention dominates (gpt3-1.3b at a million tokens: 1.2)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if "jobs" in data:  # several experiments: no MFU of the whole is reported
        return 1.0
    model = load_experiment(path).model
    if model is None:
        return 1.0
    attention = 12 * model.num_layers * model.core_width * model.seq_length
    return 1.0 / (1.0 - 0.5 * attention / model.model_flops_per_token()) + 1e-9


def _write(tmp: Path, data: Any, name: str = "exp.yaml") -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _with(base: dict, dotted: str, value: Any) -> dict:
    out = json.loads(json.dumps(base))
    *head, last = dotted.split(".")
    node = out
    for key in head:
        node = node.setdefault(key, {})
    node[last] = value
    return out


# ------------------------------------------------------------------ the reported cases

REPORTED = [
    # hangs
    (BASE, "cluster.num_gpus", 10**12, [], "cluster.num_gpus"),
    (BASE, "training.global_batch_size", 10**15, [], "training.global_batch_size"),
    (SYNTHETIC, "training.num_microbatches", 10**8, [], "training.num_microbatches"),
    (_with(BASE, "parallel.overlap_grad_reduce", True), "parallel.grad_bucket_MB", 1e-9, [],
     "parallel.grad_bucket_MB"),
    (BASE, "faults.gpu_failures", {**FAILURES, "mtbf_hours": 1e-300}, ["--steps", "100"],
     "mtbf_hours"),
    (BASE, "faults.gpu_failures", {**FAILURES, "checkpoint_write_s": math.inf},
     ["--steps", "100"], "checkpoint_write_s"),
    (BASE, "faults.gpu_failures", {**FAILURES, "checkpoint_write_s": 1e300},
     ["--steps", "100"], "checkpoint_write_s"),
    (BASE, "faults.gpu_failures", {**FAILURES, "restart_s": math.inf}, ["--steps", "100"],
     "restart_s"),
    # nonsense accepted
    (BASE, "model.ffn_hidden_size", math.nan, [], "model.ffn_hidden_size"),
    (BASE, "model.hidden_size", 10**30, [], "model.hidden_size"),
    (BASE, "faults.random_stragglers", {"count": 1, "slowdown_range": [1.0, math.nan]}, [],
     "slowdown_range"),
    (SYNTHETIC, "model.synthetic.forward_ms", math.inf, [], "forward_ms"),
    (BASE, "faults.stragglers", [{"gpu": 1, "slowdown": math.inf}], [], "slowdown"),
    # memory
    (BASE, "cluster.num_gpus", 16384, ["--fidelity", "full"], "fidelity 'full'"),
]


@pytest.mark.parametrize(("base", "key", "value", "argv", "needle"), REPORTED,
                         ids=[f"{key}={value}" for _, key, value, _, _ in REPORTED])
def test_reported_inputs_are_refused_up_front(tmp_path: Path, base: dict, key: str,
                                              value: Any, argv: list[str], needle: str) -> None:
    data = _with(base, key, value)
    if key == "cluster.num_gpus" and value == 16384:
        # 64 micro-batches: ~62 million instructions, ~18.6 GB at sim.budget's 300 B a
        # packed instruction (32 micro-batches, ~31 million, would fit at 7.8 GB)
        data = _with(_with(data, "parallel.dp", 2048), "training.global_batch_size", 262144)
    path = _write(tmp_path, data)
    rc, out, err, seconds = run_cli(["run", str(path), "--json", *argv])
    assert_clean(rc, out, err, seconds, f"{key}={value}")
    assert rc == 2 and needle in err, err


def test_many_steps_are_kept_as_runs_of_steps() -> None:
    """--steps 1e9 kept a float per step (MemoryError): now seconds, failures included."""
    rc, out, err, seconds = run_cli(["run", str(EXAMPLES / "faults-failures-gpt.yaml"),
                                     "--json", "--steps", str(10**9)])
    stats = assert_clean(rc, out, err, seconds, "--steps 1e9")
    assert stats is not None and stats["steps"] == 10**9 and stats["failures"] > 1000
    assert sum(row["steps"] for row in stats["run_segments"]) == 10**9


@pytest.mark.parametrize(("text", "needle"), [
    ("name: a\nname: b\n" + yaml.safe_dump(BASE), "duplicate key 'name'"),
    (yaml.safe_dump(BASE).replace("  tp: 2\n", "  tp: 2\n  tp: 1\n"),
     "duplicate key 'parallel.tp'"),
    ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi",
                                                                     strict=True)),
     "expands to more than"),
    ("[" * 20000 + "]" * 20000 + "\n", "nesting deeper than"),
    ("name: " + "9" * 5000 + "\n", "cannot be read"),
], ids=["duplicate", "nested-duplicate", "alias-bomb", "deep", "long-int"])
def test_yaml_that_no_input_needs_is_refused(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(text, encoding="utf-8")
    rc, out, err, seconds = run_cli(["run", str(path), "--json"])
    assert_clean(rc, out, err, seconds, needle)
    assert rc == 2 and needle in err and len(err) < 400, err


@pytest.mark.parametrize(("content", "needle"), [
    (b"0F0 0B0\n1000000000F0 1000000000B0\n", "no ops for stage 1"),
    (b"\xff\xfe\x00binary", "cannot read the schedule file"),
], ids=["stage-1e9", "binary"])
def test_bad_custom_schedule_files(tmp_path: Path, content: bytes, needle: str) -> None:
    (tmp_path / "sched.txt").write_bytes(content)
    data = {**SYNTHETIC, "parallel": {"pp": 2}, "training": {"num_microbatches": 1},
            "cluster": {"preset": "ideal", "num_gpus": 2}, "schedule": "sched.txt"}
    rc, out, err, seconds = run_cli(["run", str(_write(tmp_path, data)), "--json"])
    assert_clean(rc, out, err, seconds, needle)
    assert rc == 2 and needle in err, err


def test_search_refuses_absurd_gpu_counts() -> None:
    rc, out, err, seconds = run_cli(["search", str(EXAMPLES / "search-llama-13b-64.yaml"),
                                     "--gpus", str(10**12)])
    assert_clean(rc, out, err, seconds, "--gpus 1e12")
    assert rc == 2 and "--gpus" in err


# ------------------------------------------------------------------ the mutation fuzzer

FUZZED = {
    "synthetic-pp4.yaml": [],
    "faults-straggler-pp4.yaml": [],
    "faults-failures-gpt.yaml": ["--steps", "3000"],
    "faults-link-fat-tree.yaml": ["--steps", "10"],
    "gpt-1.3b-pp4.yaml": [],
    "hetero-a100-h100.yaml": ["--fidelity", "collapsed"],
    "llama3-8b-cp4-fsdp.yaml": ["--fidelity", "collapsed"],
    "mixtral-8x7b-ep8.yaml": ["--fidelity", "collapsed"],
    "adaptive-batch.yaml": [],
    "diloco-wan.yaml": [],
    "gpt-neox-20b-parallel-blocks.yaml": [],
    "llama2-70b-fp8-partial-recompute.yaml": ["--fidelity", "collapsed"],
    "llama3-8b-fsdp-torchtitan.yaml": [],
    "mpt-7b-alibi-h800.yaml": [],
    "optimus-vit-llm.yaml": ["--fidelity", "collapsed"],
    "parameter-server.yaml": [],
    "swarm-preemptible.yaml": [],
    "two-jobs-shared-fabric.yaml": [],
}
"""Bundled experiments the fuzzer mutates, with the options that keep a valid mutation
fast (multi-step runs play the failures and link faults)."""

VALUES = (math.nan, math.inf, -math.inf, 10**30, 2**63, 1e300, 1e-300, 1e-9, -1, -0.5, 0,
          0.0, 10**6, "x", "", "1e12", True, None, [], {}, [1.0, math.nan], {"a": 1})
"""What a leaf becomes: non-finite, huge, tiny, negative, zero, of the wrong type."""


def _leaves(value: Any, path: tuple = ()) -> list[tuple]:
    """Paths of every value in a parsed document (mappings and lists too)."""
    out = [path] if path else []
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for key, item in items:
        out += _leaves(item, (*path, key))
    return out


_DROP = object()
"""A value that removes its key."""


def _replaced(data: Any, path: tuple, value: Any) -> Any:
    """``data`` with the value at ``path`` replaced by ``value`` (:data:`_DROP`: removed)."""
    copy = dict(data) if isinstance(data, dict) else list(data)
    if len(path) == 1 and value is _DROP:
        del copy[path[0]]
    else:
        copy[path[0]] = value if len(path) == 1 else _replaced(copy[path[0]], path[1:], value)
    return copy


@st.composite
def mutations(draw: st.DrawFn) -> tuple[str, str, list[str]]:
    """(what was done, the YAML text, the options) of one mutated bundled example."""
    name = draw(st.sampled_from(sorted(FUZZED)))
    data = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
    if draw(st.integers(0, 5)) == 0:  # a key given twice
        lines = yaml.safe_dump(data, sort_keys=False).splitlines()
        keyed = [k for k, line in enumerate(lines) if line.lstrip()[:1].isalpha() and ":" in line]
        k = draw(st.sampled_from(keyed))
        lines.insert(k, lines[k].split(":", 1)[0] + ": 1")
        return f"{name}: line {k + 1} twice", "\n".join(lines) + "\n", FUZZED[name]
    path = draw(st.sampled_from(_leaves(data)))
    leaf = data
    for key in path:
        leaf = leaf[key]
    how = draw(st.sampled_from(("value", "value", "scale", "drop")))
    if how == "drop" and isinstance(path[-1], str):
        value: Any = _DROP
    elif how == "scale" and isinstance(leaf, int | float) and not isinstance(leaf, bool):
        factor = draw(st.sampled_from((2, 3, 10)))  # a plausible change: often still valid
        value = leaf * factor
    else:
        value = draw(st.sampled_from(VALUES))
    text = yaml.safe_dump(_replaced(data, path, value), sort_keys=False)
    shown = "dropped" if value is _DROP else f"= {value!r}"
    return f"{name}: {'.'.join(map(str, path))} {shown}", text, FUZZED[name]


@settings(max_examples=1500, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(mutations())
def test_mutated_examples_exit_cleanly(case: tuple[str, str, list[str]]) -> None:
    what, text, argv = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mutated.yaml"
        path.write_text(text, encoding="utf-8")
        rc, out, err, seconds = run_cli(["run", str(path), "--json", *argv])
        bound = mfu_bound(path) if rc == 0 else 1.0
    assert_clean(rc, out, err, seconds, what, bound)
    if "twice" in what:
        assert rc == 2 and "duplicate key" in err, (what, err)

