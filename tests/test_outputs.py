"""Outputs are the previous complete ones or the new complete ones (base/outputs.py), and a
bad output path is refused before anything is simulated."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import EXAMPLE, ROOT

from base.errors import ConfigError
from base.outputs import check_output_dir, output_file, outputs


def test_files_appear_only_on_commit_and_stats_last(tmp_path, monkeypatch) -> None:
    (tmp_path / "stats.json").write_text("old stats")
    (tmp_path / "trace.json.gz").write_text("old trace of another format")
    renamed = []
    real_replace = __import__("os").replace
    monkeypatch.setattr("base.outputs.os.replace",
                        lambda a, b: (renamed.append(b.name), real_replace(a, b)))
    with outputs() as files:
        files.temp(tmp_path / "stats.json").write_text("new stats")
        files.temp(tmp_path / "trace.json").write_text("new trace")
        files.remove(tmp_path / "trace.json.gz")
        assert (tmp_path / "stats.json").read_text() == "old stats"
        assert not (tmp_path / "trace.json").exists()
        files.commit()
    assert renamed == ["trace.json", "stats.json"]
    assert (tmp_path / "stats.json").read_text() == "new stats"
    assert not (tmp_path / "trace.json.gz").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stats.json", "trace.json"]


def test_a_failure_leaves_the_old_files_and_no_temporary_ones(tmp_path) -> None:
    (tmp_path / "stats.json").write_text("old")
    with pytest.raises(RuntimeError), outputs() as files:
        files.temp(tmp_path / "stats.json").write_text("half")
        raise RuntimeError("killed")
    assert [p.name for p in tmp_path.iterdir()] == ["stats.json"]
    assert (tmp_path / "stats.json").read_text() == "old"


def test_bad_targets_are_named(tmp_path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ConfigError, match="--out='.*afile': is an existing file"):
        check_output_dir(afile)
    with pytest.raises(ConfigError, match="is a file"):
        check_output_dir(afile / "sub")
    assert check_output_dir(tmp_path / "new" / "dir") == tmp_path / "new" / "dir"
    assert not (tmp_path / "new").exists()  # checking creates nothing
    with pytest.raises(ConfigError, match="must end in .png or .svg"):
        output_file(tmp_path / "x.pdf", "--plot", (".png", ".svg"))
    with pytest.raises(ConfigError, match="does not exist"):
        output_file(tmp_path / "missing" / "x.png", "--plot", (".png", ".svg"))


@pytest.mark.parametrize("command", [
    ["run", str(EXAMPLE), "--out"],
    ["compare", str(EXAMPLE), "--out"],
    ["validate", "--limit", "1", "--out"],
    ["search", str(ROOT / "workloads/examples/search-llama-13b-64.yaml"), "--out"],
])
def test_cli_refuses_an_existing_file_as_out_dir_at_once(tmp_path, command) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    proc = subprocess.run([sys.executable, "-m", "sim", *command, str(afile)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: --out=") and proc.stderr.count("\n") == 1
    assert afile.read_text() == "keep me"


def test_a_run_that_fails_creates_no_out_dir(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"model": {"preset": "nope"}, "cluster": {"preset": "ideal"}}))
    proc = subprocess.run([sys.executable, "-m", "sim", "run", str(bad), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)
    assert proc.returncode == 2 and not (tmp_path / "out").exists()
