"""`sim compare`: rows, the vpp rule, steady periods, files, table, JSON, plots and errors."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLE, ROOT

from base.errors import ConfigError
from sim import load_experiment, simulate
from sim.cli import main
from sim.compare import (
    DEFAULT_SCHEDULES,
    compare,
    parse_schedules,
    rows_csv,
    rows_json,
    rows_table,
    schedule_changes,
)

SYNTHETIC = ROOT / "workloads" / "examples" / "synthetic-pp4.yaml"
ALL = "1f1b,interleaved,zb-h1,zb-h2,zb-v,dualpipe-v,seq1f1b"
MS = 1e-3


@pytest.fixture(scope="module")
def compared() -> tuple[list, list]:
    return compare(load_experiment(SYNTHETIC), parse_schedules(ALL))


def test_example_is_the_schedule_study_setup() -> None:
    exp = load_experiment(SYNTHETIC)
    assert exp.model is None and exp.cluster.name.startswith("ideal")
    assert exp.placement.degree("pp") == 4 and exp.num_microbatches == 8
    syn = exp.config.model.synthetic
    assert (syn.forward_ms, syn.backward_ms, syn.weight_grad_ms) == (1.0, 2.0, 1.0)
    assert syn.activation_MB > 0


def test_vpp_rule() -> None:
    exp = load_experiment(SYNTHETIC)
    assert schedule_changes(exp, "interleaved")["parallel.vpp"] == 2
    assert schedule_changes(exp, "zb-v")["parallel.vpp"] == 2
    assert schedule_changes(exp, "dualpipe-v")["parallel.vpp"] == 2
    for name in ("1f1b", "gpipe", "zb-h1", "zb-h2", "seq1f1b"):
        assert schedule_changes(exp, name) == {"schedule": name, "parallel.vpp": 1}
    v3 = exp.with_changes({"parallel.vpp": 3, "schedule": "interleaved"})
    assert schedule_changes(v3, "interleaved")["parallel.vpp"] == 3  # kept when > 1
    assert schedule_changes(v3, "zb-h1")["parallel.vpp"] == 1
    assert schedule_changes(v3, "my/schedule.txt")["parallel.vpp"] == 3  # a file keeps it


def test_rows_closed_forms(compared: tuple[list, list]) -> None:
    """Ideal cluster, F = B_input = W = 1 ms, p = 4, m = 8, 1 GiB per micro-batch and stage."""
    rows = {r.schedule: r for r in compared[0]}
    assert [r.schedule for r in compared[0]] == ALL.split(",")
    one = rows["1f1b"]
    assert one.step_time_s == pytest.approx(11 * 3 * MS, rel=1e-9)
    assert one.bubble_fraction == pytest.approx(3 / 11)
    assert one.peak_activation_gib == pytest.approx((4.0, 3.0, 2.0, 1.0))
    assert one.pp_bytes_sent == pytest.approx(3 * 8 * 2 * 16e6)  # 3 boundaries, 8 mb, F and B
    assert one.relative_speed == 1.0 and one.vpp == 1
    assert rows["interleaved"].step_time_s == pytest.approx((24 + 3 * 3 / 2) * MS, rel=1e-9)
    assert rows["interleaved"].vpp == 2 and rows["zb-v"].vpp == 2
    assert rows["interleaved"].pp_bytes_sent == pytest.approx(7 * 8 * 2 * 16e6)
    assert rows["zb-v"].pp_bytes_sent == pytest.approx(6 * 8 * 2 * 16e6)  # stages 3|4 share
    assert rows["zb-h1"].step_time_s == pytest.approx((24 + 3) * MS, rel=1e-9)
    assert rows["zb-h1"].relative_speed == pytest.approx(33 / 27)
    assert rows["zb-h2"].peak_activation_gib[0] == pytest.approx(7.0)
    assert rows["zb-v"].peak_activation_gib == pytest.approx((4.0,) * 4)
    assert rows["dualpipe-v"].peak_activation_gib == pytest.approx((4.5,) * 4)
    assert rows["seq1f1b"].step_time_s == pytest.approx((24 + 3 * 3 / 4) * MS, rel=1e-9)
    assert max(rows["seq1f1b"].peak_activation_gib) < 2.0


def test_step_time_is_what_sim_run_reports(compared: tuple[list, list]) -> None:
    """ZB-H2 and ZB-V: step time = the period of back-to-back steps m(F + B), as in
    ``sim run``; the isolated step (drawn) is its own column. The others keep the
    barrier, so both pairs agree."""
    rows = {r.schedule: r for r in compared[0]}
    for name in ("zb-h2", "zb-v"):
        assert rows[name].step_time_s == pytest.approx(24 * MS)
        assert rows[name].steady_period_s == rows[name].step_time_s
        assert rows[name].step_time_s == simulate(compared[1][0].experiment.with_changes(
            schedule_changes(compared[1][0].experiment, name))).stats["step_time_s"]
    assert rows["zb-h2"].isolated_step_s == pytest.approx(27 * MS, rel=1e-9)
    assert rows["zb-v"].isolated_step_s == pytest.approx(25.5 * MS, rel=1e-9)
    assert rows["zb-h2"].relative_speed == pytest.approx(33 / 24)
    for name in ("1f1b", "interleaved", "zb-h1", "dualpipe-v", "seq1f1b"):
        row = rows[name]
        assert row.steady_period_s == row.step_time_s == row.isolated_step_s
        assert row.bubble_fraction == row.isolated_bubble_fraction


def test_transformer_models_get_the_engine_period() -> None:
    exp = load_experiment(EXAMPLE).with_changes({"training.global_batch_size": 16})
    rows, _ = compare(exp, ("1f1b", "zb-h2"))
    assert rows[0].steady_period_s == rows[0].step_time_s == rows[0].isolated_step_s
    assert 0 < rows[1].step_time_s <= rows[1].isolated_step_s * (1 + 1e-9)
    assert all(g > 0 for g in rows[0].peak_activation_gib)
    assert "n/a" not in rows_table(rows)


def test_formats(compared: tuple[list, list]) -> None:
    rows = compared[0]
    table = rows_table(rows).splitlines()
    assert table[0].split()[:4] == ["schedule", "vpp", "step", "ms"]
    assert table[1].split()[:5] == ["1f1b", "1", "33.000", "27.27%", "33.000"]
    assert table[1].endswith("1.00x") and len(table) == 1 + len(rows)
    data = json.loads(rows_json(rows, "x"))
    assert data["experiment"] == "x" and len(data["schedules"]) == len(rows)
    assert data["schedules"][0]["peak_activation_gib_per_rank"] == pytest.approx([4, 3, 2, 1])
    table_csv = list(csv.DictReader(io.StringIO(rows_csv(rows))))
    assert [r["schedule"] for r in table_csv] == ALL.split(",")
    assert float(table_csv[0]["peak_activation_gib_rank3"]) == pytest.approx(1.0)
    assert float(table_csv[3]["step_time_s"]) == pytest.approx(0.024)
    assert float(table_csv[3]["isolated_step_s"]) == pytest.approx(0.027)


def test_parse_schedules_errors() -> None:
    assert parse_schedules(" 1f1b , zb-v ") == ("1f1b", "zb-v")
    with pytest.raises(ConfigError, match=r"--schedules='1f1b,,zb-v'"):
        parse_schedules("1f1b,,zb-v")
    with pytest.raises(ConfigError, match=r"'zb-v' is listed twice"):
        parse_schedules("zb-v,1f1b,zb-v")
    assert "zb-h2" in DEFAULT_SCHEDULES and DEFAULT_SCHEDULES[0] == "1f1b"


def test_cli_writes_files_and_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "a"
    assert main(["compare", str(SYNTHETIC), "--schedules", ALL, "--out", str(out),
                 "--json"]) == 0
    printed = capsys.readouterr().out
    data = json.loads(printed)  # exactly one JSON object
    assert [r["schedule"] for r in data["schedules"]] == ALL.split(",")
    assert (out / "compare.json").read_text() == printed
    assert (out / "compare.csv").read_text().startswith("schedule,vpp,step_time_s,")
    for png in ("compare.png", "memory.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / png).stat().st_size > 20_000
    # deterministic: same input, same bytes
    again = tmp_path / "b"
    assert main(["compare", str(SYNTHETIC), "--schedules", ALL, "--out", str(again),
                 "--json"]) == 0
    capsys.readouterr()
    for name in ("compare.json", "compare.csv", "compare.png", "memory.png"):
        assert (out / name).read_bytes() == (again / name).read_bytes(), name


def test_cli_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["compare", str(SYNTHETIC), "--schedules", "1f1b,zb-v", "--out",
                 str(tmp_path), "--no-plot"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0] == "synthetic-pp4: 2 schedules, pp=4, micro-batches=8"
    assert text[1].startswith("schedule") and text[2].startswith("1f1b")
    assert text[3].startswith("zb-v") and text[3].endswith("1.37x")  # 33 / 24 ms steady
    assert text[4].startswith("wrote ") and not (tmp_path / "compare.png").exists()


@pytest.mark.parametrize("args,message", [
    (["--schedules", "1f1b,nope"], "error: --schedules: nope: schedule: unknown schedule 'nope'"),
    (["--schedules", "1f1b,,zb-v"], "error: --schedules='1f1b,,zb-v'"),
])
def test_cli_errors_are_one_line(args: list[str], message: str,
                                 capsys: pytest.CaptureFixture) -> None:
    assert main(["compare", str(SYNTHETIC), *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(message)


def test_cli_seq1f1b_on_a_transformer_model(tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    """Seq1F1B runs on a transformer (tests/test_seq1f1b_transformer.py); with context
    parallelism it is refused in one line before anything runs."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data["training"]["global_batch_size"] = 8
    data["training"]["seq_chunks"] = 2
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    assert main(["compare", str(tmp_path / "exp.yaml"), "--schedules", "1f1b,seq1f1b",
                 "--no-plot", "--out", str(tmp_path / "out")]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[2].startswith("1f1b") and table[3].startswith("seq1f1b")
    data["parallel"].update(cp=2, dp=1)
    (tmp_path / "cp.yaml").write_text(yaml.safe_dump(data))
    assert main(["compare", str(tmp_path / "cp.yaml"), "--schedules", "1f1b,seq1f1b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: --schedules: seq1f1b: parallel.cp=2: not supported with "
                          "schedule 'seq1f1b'")


def test_cli_custom_schedule_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = yaml.safe_load(SYNTHETIC.read_text())
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "gpipe.txt").write_text("\n".join(
        " ".join([f"{r}F{i}" for i in range(8)] + [f"{r}B{i}" for i in range(7, -1, -1)])
        for r in range(4)))
    assert main(["compare", str(tmp_path / "exp.yaml"), "--schedules", "gpipe,gpipe.txt",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["schedules"]
    assert rows[0]["step_time_s"] == pytest.approx(rows[1]["step_time_s"])
    assert rows[1]["schedule"] == "gpipe.txt"


def test_compare_module_is_pure() -> None:
    code = ("import sys, sim.compare, sim.cli; bad = [m for m in ('simpy', 'matplotlib') "
            "if m in sys.modules]; print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout.strip()
    assert out == ""


def test_plot_functions_reject_bad_input(tmp_path: Path, compared: tuple[list, list]) -> None:
    from plots.compare import plot_compare
    from plots.memory import plot_memory

    rows, results = compared
    timelines = [r.timeline for r in results]
    with pytest.raises(ValueError, match="suffix"):
        plot_compare([r.as_dict() for r in rows], timelines, tmp_path / "x.jpg")
    with pytest.raises(ValueError, match="do not match"):
        plot_compare([rows[0].as_dict()], timelines, tmp_path / "x.png")
    with pytest.raises(ValueError, match="at least one"):
        plot_memory([], tmp_path / "m.png")
    plot_memory([("1f1b", timelines[0])], tmp_path / "m.svg")
    assert (tmp_path / "m.svg").read_text().startswith("<?xml")
