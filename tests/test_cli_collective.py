"""`sim collective`: nccl-tests-style table, --json rows, --plot, and error behaviour."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from base.errors import ConfigError
from sim.cli import main
from sim.cli.collective import parse_size, parse_sizes
from sim.collectives import alpha_beta_time

EXAMPLE_A100 = ROOT / "workloads" / "examples" / "cluster-dgx-a100-64.yaml"
EXAMPLE_H100 = ROOT / "workloads" / "examples" / "cluster-dgx-h100-8.yaml"
KEYS = {"op", "algo", "protocol", "num_gpus", "size_bytes", "time_s", "algbw_GBps",
        "busbw_GBps"}


def _file(tmp_path: Path, cluster: object, name: str = "cluster.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"cluster": cluster}))
    return str(path)


def _json(args: list[str], capsys: pytest.CaptureFixture) -> list[dict]:
    assert main(["collective", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_table_has_a_row_per_size_doubling(capsys: pytest.CaptureFixture) -> None:
    assert main(["collective", str(EXAMPLE_A100), "--op", "all_reduce", "--algo", "ring",
                 "--sizes", "1KiB:1MiB"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("# all_reduce over 64 GPUs")
    assert "size(B)" in lines[1] and "busbw(GB/s)" in lines[1] and "algbw(GB/s)" in lines[1]
    sizes = [int(line.split()[0]) for line in lines[2:]]
    assert sizes == [2**k for k in range(10, 21)]
    assert all(line.split()[1] == "ring" for line in lines[2:])


def test_json_rows_match_the_alpha_beta_model(tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    path = _file(tmp_path, {"topology": "ring", "num_gpus": 8, "link_bandwidth_GBps": 25,
                            "link_latency_us": 2.0, "collective_protocol": "simple"})
    rows = _json([path, "--op", "all_gather", "--algo", "ring", "--sizes", "1MB:8MB"], capsys)
    assert [r["size_bytes"] for r in rows] == [10**6, 2 * 10**6, 4 * 10**6, 8 * 10**6]
    for r in rows:
        assert set(r) == KEYS
        assert (r["op"], r["algo"], r["protocol"], r["num_gpus"]) == ("all_gather", "ring",
                                                                      "simple", 8)
        t = alpha_beta_time("all_gather", "ring", 8, r["size_bytes"], 2e-6, 25e9)
        assert r["time_s"] == pytest.approx(t, rel=1e-9)
        assert r["algbw_GBps"] == pytest.approx(r["size_bytes"] / t / 1e9, rel=1e-9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 7 / 8, rel=1e-9)


def test_several_algorithms_auto_and_gpus(capsys: pytest.CaptureFixture) -> None:
    rows = _json([str(EXAMPLE_H100), "--algo", "ring,nvls,auto", "--sizes", "64M:128M",
                  "--gpus", "4"], capsys)
    assert [r["algo"] for r in rows] == ["ring", "ring", "nvls", "nvls", "nvls", "nvls"]
    assert {r["num_gpus"] for r in rows} == {4}
    assert rows[2]["busbw_GBps"] > rows[0]["busbw_GBps"]  # NVLS beats the ring at 64 MiB
    assert rows[3]["busbw_GBps"] > 370 > rows[1]["busbw_GBps"]  # and at 128 MiB


def test_file_override_applies_to_auto_but_not_to_an_explicit_algo(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = _file(tmp_path, {"preset": "dgx-a100-80g", "num_gpus": 8,
                            "collectives": {"all_reduce": "tree"}})
    auto = _json([path, "--sizes", "1G"], capsys)
    ring = _json([path, "--algo", "ring", "--sizes", "1G"], capsys)
    assert auto[0]["algo"] == "tree" and ring[0]["algo"] == "ring"
    assert ring[0]["time_s"] != auto[0]["time_s"]


def test_send_and_all_to_all(capsys: pytest.CaptureFixture) -> None:
    send = _json([str(EXAMPLE_A100), "--op", "send", "--sizes", "1G"], capsys)[0]
    assert send["algo"] == "p2p" and send["busbw_GBps"] == pytest.approx(send["algbw_GBps"])
    assert send["busbw_GBps"] < 25  # GPU 0 -> GPU 63 crosses one 200 Gb/s NIC
    a2a = _json([str(EXAMPLE_A100), "--op", "all_to_all", "--gpus", "16", "--sizes", "1M"],
                capsys)[0]
    assert a2a["algo"] == "pairwise"


def test_plot_is_written_and_deterministic(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    paths = [tmp_path / "a.png", tmp_path / "b.png"]
    for p in paths:
        assert main(["collective", str(EXAMPLE_H100), "--algo", "ring,tree,nvls", "--sizes",
                     "1K:1G", "--plot", str(p)]) == 0
    assert f"wrote {paths[1]}" in capsys.readouterr().out
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_plot_busbw_svg_is_deterministic(tmp_path: Path) -> None:
    from plots.collectives import plot_busbw

    rows = [{"algo": a, "size_bytes": 2**k, "busbw_GBps": k * (i + 1)}
            for i, a in enumerate(("ring", "tree")) for k in range(10, 20)]
    for name in ("a.svg", "b.svg"):
        plot_busbw(rows, tmp_path / name, title="t", reference_GBps=25.0)
    assert (tmp_path / "a.svg").read_bytes() == (tmp_path / "b.svg").read_bytes()
    with pytest.raises(ValueError, match="suffix"):
        plot_busbw(rows, tmp_path / "c.jpg")


def test_size_parsing() -> None:
    assert parse_size("1KiB") == 1024 and parse_size("1K") == 1024 and parse_size("1KB") == 1000
    assert parse_size("4GiB") == 4 * 2**30 and parse_size("1.5MB") == 1_500_000
    assert parse_sizes("1KiB:4GiB")[-1] == 4 * 2**30 and len(parse_sizes("1KiB:4GiB")) == 23
    assert parse_sizes("8") == [8]
    assert parse_sizes("1K:1M:4") == [2**10, 2**12, 2**14, 2**16, 2**18, 2**20]


def _run_cli(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


BAD = {
    "bad size unit": (["--sizes", "1QB:2QB"], ["--sizes", "1QB"]),
    "end below start": (["--sizes", "1M:1K"], ["--sizes", "1M:1K"]),
    "algo not for op": (["--op", "all_to_all", "--algo", "ring"], ["--algo", "'ring'",
                                                                   "all_to_all"]),
    "unknown algo": (["--algo", "fastest"], ["--algo", "fastest"]),
    "unknown op": (["--op", "gather"], ["--op", "gather"]),
    "too many gpus": (["--gpus", "65"], ["--gpus=65", "64"]),
    "gpus not a number": (["--gpus", "many"], ["--gpus", "many"]),
    "plot suffix": (["--plot", "x.jpg"], ["--plot", "x.jpg"]),
    "nvls on a100": (["--algo", "nvls", "--gpus", "8"], ["nvls", "NVSwitch"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_arguments_exit_2_with_one_error_line(case: str,
                                                  capsys: pytest.CaptureFixture) -> None:
    extra, needles = BAD[case]
    try:
        code = main(["collective", str(EXAMPLE_A100), "--sizes", "1K", *extra])
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    captured = capsys.readouterr()
    _check_error(code, captured.out, captured.err, needles)


def _check_error(code: int | str | None, out: str, err: str, needles: list[str]) -> None:
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert out == ""


@pytest.mark.parametrize(("content", "needles"), [
    ({"model": {"preset": "gpt3-1.3b"}}, ["cluster:"]),
    ({"cluster": {"preset": "dgx-a100-80g", "num_gpus": 8, "topolgy": "ring"}},
     ["cluster.topolgy", "did you mean 'topology'"]),
    ({"cluster": {"topology": "torus2d", "num_gpus": 8, "link_bandwidth_GBps": 1}},
     ["cluster.dims"]),
    ({"cluster": {"preset": "dgx-a100-80g", "num_gpus": 1}}, ["--gpus=1"]),
])
def test_bad_cluster_files(tmp_path: Path, content: dict, needles: list[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(content))
    proc = _run_cli(["collective", str(path), "--sizes", "1K"])
    _check_error(proc.returncode, proc.stdout, proc.stderr, needles)
    assert "Traceback" not in proc.stderr


def test_missing_file() -> None:
    proc = _run_cli(["collective", "nope.yaml"])
    _check_error(proc.returncode, proc.stdout, proc.stderr, ["nope.yaml", "does not exist"])


def test_sizes_as_a_comma_list() -> None:
    """``64MiB,1GiB`` as nccl-tests users list sizes; items may be ranges; errors name it."""
    assert parse_sizes("64MiB,1GiB") == [64 * 2**20, 2**30]
    assert parse_sizes("1K:4K, 1M") == [2**10, 2**11, 2**12, 2**20]
    with pytest.raises(ConfigError, match="at least one size"):
        parse_sizes(",")
    with pytest.raises(ConfigError, match="cannot read size"):
        parse_sizes("64MiB,lots")


def test_auto_protocol_is_the_fastest_closed_form_per_size(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    """NCCL's per-size protocol choice on a ring of GPUs (each its own server): LL for small
    messages, LL128 in between, Simple for large ones, each row exactly the fastest
    protocol's closed form plus its launch (8.4 µs for Simple, scaled by NCCL's
    baseLatencies: 6.6 for LL, 14 for LL128)."""
    from sim.protocols import PROTOCOLS, launch_scale

    path = _file(tmp_path, {"topology": "ring", "num_gpus": 8, "link_bandwidth_GBps": 25,
                            "link_latency_us": 2.0, "collective_launch_us": 8.4})
    rows = _json([path, "--op", "all_reduce", "--algo", "ring", "--sizes", "1KiB:1GiB:4"], capsys)
    for r in rows:
        times = {p: 8.4e-6 * launch_scale("ring", p)
                 + alpha_beta_time("all_reduce", "ring", 8, r["size_bytes"], 2e-6, 25e9,
                                   protocol=p, inter_node=True) for p in PROTOCOLS}
        assert r["protocol"] == min(times, key=times.__getitem__)
        assert r["time_s"] == pytest.approx(times[r["protocol"]], rel=1e-9)
    picked = [r["protocol"] for r in rows]
    assert picked[0] == "ll" and picked[-1] == "simple" and "ll128" in picked
