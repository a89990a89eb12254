"""A newcomer's broken experiment files: each exits 2 with one ``error:`` line that names the
key and shows both sides, what was given and what is allowed (docs/DESIGN.md's error
contract; docs/cli.md "Errors and input checks").

The table is the newcomer audit of 2026-12-05: the cases that already gave such a line
stay here so they keep doing it; the ones that did not are marked ``fixed:``.
Every case runs in process through :func:`sim.cli.main`, and none simulates anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, SMALL_EXPERIMENT, run_cli

EXAMPLES = ROOT / "workloads" / "examples"
HF = ROOT / "sim" / "data" / "validation" / "hf_configs" / "deepseek-v3.json"
BASE = SMALL_EXPERIMENT


def one_error_line(rc: int, out: str, err: str) -> str:
    """The single ``error:`` line of a refused input (exit 2, nothing on stdout)."""
    assert rc == 2, (rc, out[:300], err)
    assert out == "", out[:300]
    assert "Traceback" not in err, err
    assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), err
    return err


def _with(**changes: Any) -> dict:
    """:data:`BASE` with dotted keys set (``None`` as a value removes the key)."""
    data = json.loads(json.dumps(BASE))
    for dotted, value in changes.items():
        *head, last = dotted.split("__")
        node = data
        for key in head:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return data


CASES: dict[str, tuple[Any, list[str]]] = {
    "misspelled top key": (_with(paralel={"tp": 2}), ["'paralel'", "did you mean 'parallel'"]),
    "misspelled nested key": (_with(parallel__tpp=2), ["'parallel.tpp'", "did you mean 'tp'"]),
    "key with no near match": (_with(parallel__xyzzy=1), ["'parallel.xyzzy'", "known keys: tp"]),
    "string for int": (_with(parallel__tp="two"), ["parallel.tp", "valid integer", "'two'"]),
    "float for int": (_with(training__micro_batch_size=1.5),
                      ["training.micro_batch_size", "valid integer", "1.5"]),
    "tp not dividing heads": (_with(parallel__tp=3, cluster__num_gpus=24),
                              ["parallel.tp=3", "num_attention_heads=16"]),
    "pp above layers": (_with(parallel__tp=1, parallel__pp=32, parallel__dp=1,
                              cluster__num_gpus=32), ["pp*vpp = 32*1 = 32", "num_layers = 24"]),
    "gpus != tp*pp*dp*cp": (_with(parallel__dp=3), ["2*4*3*1 = 24", "cluster.num_gpus = 16"]),
    "cp breaks the product": (_with(parallel__cp=2), ["2*4*2*2 = 32", "cluster.num_gpus = 16"]),
    "negative size": (_with(model__hidden_size=-1), ["model.hidden_size", "greater than 0", "-1"]),
    "negative gpus": (_with(cluster__num_gpus=-16), ["cluster.num_gpus", "greater than 0",
                                                      "-16"]),
    "zero micro-batch": (_with(training__micro_batch_size=0),
                         ["training.micro_batch_size", "greater than or equal to 1", "got 0"]),
    "batch not divisible": (_with(training__global_batch_size=63),
                            ["global_batch_size=63", "micro_batch_size*dp = 2*2 = 4"]),
    "unknown schedule": (_with(schedule="1f1bb"), ["'1f1bb'", "gpipe, 1f1b"]),
    "unknown gpu": ({**BASE, "cluster": {"topology": "switch", "link_bandwidth_GBps": 100,
                                         "gpu": "A200", "num_gpus": 16}},
                    ["cluster.gpu", "'A200'", "A100-80GB"]),
    "unknown cluster preset": (_with(cluster__preset="dgx-a300"),
                               ["cluster.preset", "'dgx-a300'", "dgx-a100-80g"]),
    "unknown model preset": (_with(model__preset="llama-14b"),
                             ["model.preset", "'llama-14b'", "llama-13b"]),
    "unknown enum value": (_with(training__recompute="partial"),
                           ["training.recompute", "'selective'", "'partial'"]),
    "zero stage 4": (_with(parallel__zero_stage=4), ["parallel.zero_stage", "3", "got 4"]),
    "vpp under 1f1b": (_with(parallel__vpp=2), ["parallel.vpp=2", "'1f1b'", "interleaved"]),
    "kv heads not dividing": (_with(model__num_kv_heads=5),
                              ["num_kv_heads=5", "num_attention_heads=16"]),
    "gpus not a whole server": (_with(cluster__num_gpus=12, parallel__dp=None, parallel__tp=1),
                                ["num_gpus=12", "gpus_per_node=8"]),
    "fp8 on A100": (_with(training__precision="fp8"), ["training.precision='fp8'", "A100",
                                                        "bf16"]),
    "layers per stage sum": (_with(parallel__layers_per_stage=[6, 6, 6, 5]),
                             ["layers_per_stage=[6, 6, 6, 5]", "23", "num_layers = 24"]),
    "missing model": (_with(model=None), ["model", "required"]),
    "hf_config missing": (_with(model={"hf_config": "/nonexistent/config.json",
                                       "seq_length": 2048}),
                          ["model.hf_config", "/nonexistent/config.json", "does not exist"]),
    "hf_config without seq_length": (_with(model={"hf_config": str(HF)}),
                                     ["model.seq_length", "required with model.hf_config"]),
    # fixed: these named a pydantic class ("a valid dictionary or instance of FaultsConfig")
    "fixed: section not a mapping": (_with(faults=[]),
                                     ["faults", "a mapping of keys", "got []"]),
    "fixed: empty section": (_with(training=None) | {"training": None},
                             ["training", "a mapping of keys", "got None", "leave it out"]),
    "fixed: model given as a name": (_with(model="gpt3-1.3b"),
                                     ["model", "a mapping of keys", "'gpt3-1.3b'"]),
    # fixed: a missing schedule file was reported as an unknown schedule name
    "fixed: schedule file missing": (_with(schedule="schedules/nosuch.txt"),
                                     ["schedule file 'schedules/nosuch.txt' does not exist",
                                      "looked for", "1f1b"]),
    "fixed: schedule typo": (_with(schedule="1f1bb"), ["did you mean '1f1b'"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_broken_experiment_names_key_and_both_sides(case: str, tmp_path: Path) -> None:
    data, needles = CASES[case]
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    line = one_error_line(*run_cli(["run", str(path), "--json", "--fidelity", "collapsed"]))
    for needle in needles:
        assert needle in line, (needle, line)


@pytest.mark.parametrize(("text", "needles"), [
    ("", ["the experiment is empty", "'model:'", "'cluster:'"]),
    ("# only a comment\n", ["the experiment is empty"]),
    ("- a\n- b\n", ["mapping of keys", "got a list", "['a', 'b']"]),
    ("hello\n", ["mapping of keys", "got a str", "'hello'"]),
], ids=["empty", "comment-only", "list", "scalar"])
def test_fixed_file_that_is_not_an_experiment(tmp_path: Path, text: str,
                                              needles: list[str]) -> None:
    """Fixed: an empty file said "got NoneType", a list "got list" without the value."""
    path = tmp_path / "exp.yaml"
    path.write_text(text, encoding="utf-8")
    line = one_error_line(*run_cli(["run", str(path), "--json"]))
    for needle in needles:
        assert needle in line, (needle, line)


def test_fixed_schedule_file_relative_to_the_experiment_says_where_it_looked(
        tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(_with(schedule="my.sched")), encoding="utf-8")
    line = one_error_line(*run_cli(["run", str(path), "--json"]))
    assert "schedule file 'my.sched' does not exist" in line
    assert str(tmp_path / "my.sched") in line, line


@pytest.mark.parametrize(("fix", "needles"), [
    ("tpp=2", ["'tpp=2'", "unknown key 'tpp'", "did you mean 'tp'", "mbs", "parallel.tp"]),
    ("zeroo=1", ["did you mean 'zero'"]),
    ("tp", ["'tp'", "expected KEY=VALUE", "zero", "training.micro_batch_size"]),
], ids=["typo", "short-form-typo", "no-value"])
def test_fixed_search_fix_key_suggests_and_lists_short_names(fix: str,
                                                             needles: list[str]) -> None:
    """Fixed: ``--fix tpp=2`` listed only the long file keys, though the docs use the short
    ones (``tp=8``, ``mbs=1``), and suggested none."""
    line = one_error_line(*run_cli(["search", str(EXAMPLES / "search-llama-13b-64.yaml"),
                                    "--fix", fix, "--no-progress"]))
    for needle in needles:
        assert needle in line, (needle, line)


def test_fixed_unknown_option_points_at_the_sub_command_help() -> None:
    """Fixed: ``sim compare FILE --fidelity collapsed`` (an option of ``sim run`` only) said
    "see 'sim --help'", which does not list compare's options."""
    line = one_error_line(*run_cli(["compare", str(EXAMPLES / "synthetic-pp4.yaml"),
                                    "--fidelity", "collapsed"]))
    assert "unrecognized arguments: --fidelity collapsed" in line
    assert "'sim compare --help'" in line, line
    line = one_error_line(*run_cli(["run", "a.yaml", "b.yaml"]))
    assert "unrecognized arguments: b.yaml" in line and "'sim run --help'" in line, line


@pytest.mark.parametrize(("files", "needles"), [
    ({}, ["holds no corpus CSV", "run,model,num_layers", "it holds no CSV"]),
    ({"x.csv": "a,b\n1,2\n"}, ["holds no corpus CSV", "its CSVs (x.csv) have another header"]),
], ids=["empty-dir", "foreign-csv"])
def test_fixed_validate_corpus_directory_without_a_source(tmp_path: Path, files: dict,
                                                          needles: list[str]) -> None:
    """Fixed: ``sim validate --corpus DIR`` on a directory with no corpus CSV (a wrong path,
    a CSV of another kind) validated the sweep alone and exited 0, as if DIR had been read."""
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    line = one_error_line(*run_cli(["validate", "--corpus", str(tmp_path), "--limit", "1",
                                    "--no-progress", "--no-cross-validation"]))
    assert f"--corpus: {str(tmp_path)!r}" in line
    for needle in needles:
        assert needle in line, (needle, line)


@pytest.mark.parametrize(("node", "needles"), [
    ("leaf9", ["no node 'leaf9'", "leaf0..leaf3", "spine0..spine1", "gpu0..gpu7"]),
    ("spin0", ["no node 'spin0'", "did you mean 'spine0'?"]),
], ids=["number-out-of-range", "misspelled"])
def test_fixed_link_fault_on_a_missing_node_lists_the_nodes(tmp_path: Path, node: str,
                                                            needles: list[str]) -> None:
    """Fixed: a fault's ``link`` naming a node the cluster lacks said only ``no node
    'leaf9'``; the node names (``leaf0``, ``host0/nic3``, ...) are documented nowhere else,
    so the line now lists them by pattern, with the closest name for a misspelling."""
    data = yaml.safe_load((EXAMPLES / "faults-link-fat-tree.yaml").read_text(encoding="utf-8"))
    data["faults"]["link_faults"][0]["link"][0] = node
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    line = one_error_line(*run_cli(["run", str(path), "--json", "--steps", "3"]))
    assert "faults.link_faults[0]" in line
    for needle in needles:
        assert needle in line, (needle, line)


def test_fixed_search_on_a_jobs_file_says_jobs_not_synthetic() -> None:
    """Fixed: ``sim search two-jobs-shared-fabric.yaml`` said the file's model was a synthetic
    one (it has no top-level model); ``sim compare`` already named the jobs."""
    line = one_error_line(*run_cli(["search", str(EXAMPLES / "two-jobs-shared-fabric.yaml"),
                                    "--no-progress"]))
    assert line.startswith("error: jobs: ") and "'sim run'" in line, line
    assert "synthetic" not in line, line


@pytest.mark.parametrize(("data", "needle"), [
    ({k: v for k, v in BASE.items() if k != "parallel"} | {"tp": 2, "pp": 4},
     "unknown key 'tp' (it belongs in the parallel: section, as parallel.tp)"),
    (_with(model__micro_batch_size=2),
     "unknown key 'model.micro_batch_size' (it belongs in the training: section, as "
     "training.micro_batch_size)"),
    (BASE | {"encoder": {"preset": "vit-b-16"}},
     "(it belongs in the model: or parallel: section, as model.encoder or parallel.encoder)"),
], ids=["tp-at-top-level", "mbs-under-model", "encoder-at-top-level"])
def test_fixed_key_in_the_wrong_section_names_its_section(tmp_path: Path, data: dict,
                                                          needle: str) -> None:
    """Fixed: ``tp: 2`` at the top level (``parallel:`` forgotten) listed the top-level keys,
    which do not include tp; now the line names the section the key belongs in."""
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    line = one_error_line(*run_cli(["run", str(path), "--json"]))
    assert needle in line, line
