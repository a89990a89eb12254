"""`sim run`: the JSON contract, outputs, determinism, speed and error behaviour."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLE, ROOT

from sim.cli import main
from sim.export import check_trace

CONTRACT_KEYS = {"step_time_s", "num_gpus", "tokens_per_s", "tflops_per_gpu", "mfu",
                 "bubble_fraction", "peak_memory_gib", "memory_capacity_gib", "oom",
                 "exposed_comm_s"}


def _run_cli(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_json_is_exactly_one_object_with_contract_keys(capsys: pytest.CaptureFixture) -> None:
    assert main(["run", str(EXAMPLE), "--json"]) == 0
    out = capsys.readouterr().out
    stats = json.loads(out)
    assert CONTRACT_KEYS <= set(stats)
    assert set(stats["exposed_comm_s"]) == {"tp", "pp", "dp", "cp", "ep"}
    assert stats["num_gpus"] == 16
    assert stats["oom"] is False
    assert 0 < stats["mfu"] < 1
    # tokens/s and TFLOP/s follow from the step time
    assert stats["tokens_per_s"] == pytest.approx(64 * 2048 / stats["step_time_s"])


def test_out_dir_is_byte_identical_across_runs(tmp_path: Path) -> None:
    for d in ("a", "b"):
        assert main(["run", str(EXAMPLE), "--out", str(tmp_path / d), "--json"]) == 0
    for name in ("stats.json", "trace.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / "timeline.png").stat().st_size > 10_000
    stats = json.loads((tmp_path / "a" / "stats.json").read_text())
    assert CONTRACT_KEYS <= set(stats)


def test_exported_trace_is_structurally_valid(tmp_path: Path) -> None:
    assert main(["run", str(EXAMPLE), "--out", str(tmp_path), "--no-plot", "--json"]) == 0
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert check_trace(trace) == []
    events = trace["traceEvents"]
    assert len({e["pid"] for e in events if e["ph"] == "X"}) == 16  # a process per GPU
    assert any(e["ph"] == "s" for e in events) and any(e["ph"] == "C" for e in events)


def test_example_runs_in_a_few_seconds() -> None:
    start = time.perf_counter()
    proc = _run_cli(["run", str(EXAMPLE)])
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    assert "step time" in proc.stdout and "MFU" in proc.stdout
    assert elapsed < 10, f"sim run took {elapsed:.1f} s"


# ----------------------------------------------------------------------------- bad input

def _example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def _with(path: str, value) -> dict:
    data = _example()
    *parents, last = path.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return data


BAD_INPUTS = {
    "unknown key": (_with("parallel.tpp", 2), ["parallel.tpp", "did you mean 'tp'"]),
    "unknown top-level key": (_with("schedul", "1f1b"), ["schedul"]),
    "wrong type": (_with("parallel.tp", "two"), ["parallel.tp", "'two'"]),
    "float for int": (_with("training.micro_batch_size", 1.5), ["micro_batch_size", "1.5"]),
    "bool for int": (_with("parallel.pp", True), ["parallel.pp", "True"]),
    "negative": (_with("parallel.tp", 0), ["parallel.tp", "0"]),
    "layout != gpus": (_with("parallel.dp", 3), ["tp*pp*dp*cp", "2*4*3*1", "24", "16"]),
    "tp*pp does not divide": (_with("parallel.dp", None) | {"parallel": {"tp": 3, "pp": 4}},
                              ["tp*pp*cp", "12", "16"]),
    "batch not divisible": (_with("training.global_batch_size", 65),
                            ["global_batch_size=65", "micro_batch_size*dp", "4"]),
    "pp > layers": (_with("model.num_layers", 3), ["pp*vpp", "4", "num_layers", "3"]),
    "tp not dividing heads": (_with("model.num_attention_heads", 15) |
                              {"model": {"preset": "gpt3-1.3b", "num_attention_heads": 15,
                                         "num_kv_heads": 15, "hidden_size": 2040}},
                              ["parallel.tp=2", "num_attention_heads=15"]),
    "unknown schedule": (_with("schedule", "zigzag"), ["schedule", "zigzag"]),
    "unknown model preset": (_with("model.preset", "llama-99b"), ["model.preset", "llama-99b"]),
    "unknown cluster preset": (_with("cluster.preset", "dgx-z"), ["cluster.preset", "dgx-z"]),
    "bad enum": (_with("training.recompute", "some"), ["training.recompute", "'some'"]),
    "zero stage range": (_with("parallel.zero_stage", 4), ["parallel.zero_stage", "4"]),
    "missing required": ({k: v for k, v in _example().items() if k != "cluster"}, ["cluster"]),
    "not a mapping": ([1, 2, 3], ["mapping"]),
}


def _check_error(proc: subprocess.CompletedProcess, needles: list[str]) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert proc.stdout == ""


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_with_one_error_line(case: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    data, needles = BAD_INPUTS[case]
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    code = main(["run", str(path), "--json"])
    captured = capsys.readouterr()
    _check_error(subprocess.CompletedProcess([], code, captured.out, captured.err), needles)


def test_missing_file(tmp_path: Path) -> None:
    _check_error(_run_cli(["run", str(tmp_path / "nope.yaml")]), ["nope.yaml", "does not exist"])


def test_non_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("model: {preset: [unclosed\n  cluster: : :\n")
    _check_error(_run_cli(["run", str(path)]), ["bad.yaml", "not valid YAML", "line"])


def test_usage_error_is_one_line() -> None:
    _check_error(_run_cli(["run"]), ["file"])
    _check_error(_run_cli(["fly"]), ["fly"])


def test_a_reader_that_leaves_early_is_not_an_error() -> None:
    """`sim run ... --json | head -c0`: the pipe closes before the JSON is written."""
    proc = subprocess.Popen([sys.executable, "-m", "sim", "run", str(EXAMPLE), "--json"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader leaves before the simulation ends
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0
    assert err == b""


def test_the_executable_ends_at_once_with_the_usual_output_and_status(tmp_path: Path,
                                                                       capsys) -> None:
    """``command`` ends the process without the interpreter's teardown
    (:func:`sim.cli.exit_at_once`): the same JSON and status as :func:`main` in process,
    the exit functions run after it, the error status is 2, and a profiler that writes its
    results at the end (``python -m cProfile``) still writes them."""
    assert main(["run", str(EXAMPLE), "--json"]) == 0
    want = capsys.readouterr().out
    script = ("import atexit, sys\n"
              "atexit.register(lambda: sys.stdout.write('\\nexit functions ran'))\n"
              f"sys.argv = ['sim', 'run', {str(EXAMPLE)!r}, '--json']\n"
              "from sim.cli import command\n"
              "raise SystemExit(command())\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == want + "\nexit functions ran"
    _check_error(_run_cli(["run", str(tmp_path / "missing.yaml")]), ["missing.yaml"])
    profile = tmp_path / "run.prof"
    proc = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "sim",
                           "run", str(EXAMPLE), "--json"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and proc.stdout == want
    assert profile.stat().st_size > 0


def test_the_executable_sets_the_allocator_where_the_c_library_is_glibc() -> None:
    """:func:`sim.cli.keep_freed_memory` (in a child: it is process-wide) takes glibc's
    parameters where the C library is glibc, and sets nothing elsewhere."""
    try:
        glibc = (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (OSError, ValueError):
        glibc = False
    proc = subprocess.run([sys.executable, "-c", "from sim.cli import keep_freed_memory; "
                           "print(keep_freed_memory())"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == str(glibc)
