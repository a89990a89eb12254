"""``benchmarks/phases.py``'s report: a layout's dumps summed, each wrapped call's inclusive
instructions under its callers (dump ``i`` holds the instructions since dump ``i - 1``)."""

from __future__ import annotations

import json

from tests.conftest import load_benchmark


def test_report_sums_segments_by_phase(tmp_path) -> None:
    phases = load_benchmark("phases")
    tags = ["start 4,16,2", "enter experiment", "exit experiment", "enter simulate",
            "enter lower", "exit lower", "exit simulate", "end 4,16,2"]
    counts = [999, 5, 10_000_000, 1_000_000, 2_000_000, 30_000_000, 4_000_000, 7]
    out = tmp_path / "run.cg"
    for k, count in enumerate(counts, start=1):
        (tmp_path / f"run.cg.{k}").write_text(f"events: Ir\nsummary: {count}\n")
    (tmp_path / "run.cg.json").write_text(json.dumps({"tags": tags, "hashes": ["ab" * 32]}))
    text = phases.report(str(out))
    lines = text.splitlines()
    assert lines[0] == "4,16,2: 47.00 M instructions"  # all but the segment before start
    found = {line.split()[0]: float(line.split()[1]) for line in lines[1:-1]}
    assert found == {"experiment": 10.0, "simulate": 36.0, "simulate/lower": 30.0}
    assert lines[-1] == "stats JSON sha256: abababab"
