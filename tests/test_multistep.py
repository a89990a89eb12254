"""Multi-step runs: repeated programs, the steady period of overlapping steps, sim run --steps."""

from __future__ import annotations

import json

import pytest
from conftest import synthetic_experiment

from base.errors import ConfigError
from sim.api import simulate
from sim.cli import main
from sim.compare import compare
from sim.engine import simulate_program
from sim.experiment import build_experiment
from sim.faults_run import simulate_run
from sim.stats import compute_stats
from workloads.lowering import lower
from workloads.multistep import BARRIER_NAME, repeat_program, step_of
from workloads.program import Collective
from workloads.schedules_advanced import steady_state_period, uniform_duration

MS = 1e-3


def _exp(p: int, m: int, schedule: str, f: float = 1.0, b: float = 2.0, w: float = 1.0):
    vpp = 2 if schedule in ("zb-v", "dualpipe-v", "interleaved") else 1
    return build_experiment(synthetic_experiment(p, m, schedule, forward_ms=f, backward_ms=b,
                                                 weight_grad_ms=w, vpp=vpp))


def test_repeat_program_ids_keys_and_barriers() -> None:
    exp = build_experiment({**synthetic_experiment(2, 4), "cluster": {"preset": "ideal",
                                                                      "num_gpus": 4},
                            "model": {"synthetic": {"forward_ms": 1, "backward_ms": 2,
                                                    "grad_MB": 1.0}}})
    one = lower(exp.schedule, exp.costs, exp.placement, 1)
    n = len(one.instructions)
    for barrier in (True, False):
        prog = repeat_program(one, 3, barrier)
        assert [ins.id for ins in prog.instructions] == list(range(len(prog.instructions)))
        barriers = [i for i in prog.instructions if i.name == BARRIER_NAME]
        assert len(barriers) == (2 * 4 if barrier else 0)  # after steps 0 and 1, all 4 GPUs
        assert len(prog.instructions) == 3 * n + len(barriers)
        keys: dict[int, set] = {}
        steps = step_of(prog)
        for ins in prog.instructions:
            assert all(d < ins.id for d in ins.deps)
            if isinstance(ins, Collective):
                keys.setdefault(ins.key, set()).add((steps[ins.id], ins.group))
        assert all(len(v) == 1 for v in keys.values())  # no key shared across steps
        assert prog.meta["steps"] == 3 and prog.meta["step_instructions"] == n
    with pytest.raises(ValueError, match="steps=0"):
        repeat_program(one, 0, True)


@pytest.mark.parametrize("schedule", ["zb-h2", "zb-v"])
@pytest.mark.parametrize(("p", "m"), [(2, 2), (2, 6), (3, 5), (4, 8), (4, 4)])
@pytest.mark.parametrize(("f", "b", "w"), [(1.0, 2.0, 1.0), (1.0, 3.0, 1.0), (2.0, 3.0, 0.5)])
def test_engine_period_equals_the_list_schedule_period(schedule: str, p: int, m: int, f: float,
                                                       b: float, w: float) -> None:
    """Ideal cluster, synthetic model: the engine's back-to-back period is the pure oracle's."""
    exp = _exp(p, m, schedule, f, b, w)
    result = simulate(exp)
    d = uniform_duration(exp.schedule, f * MS, b * MS, w * MS)
    assert result.steps == 3
    assert result.stats["step_time_s"] == pytest.approx(steady_state_period(exp.schedule, d),
                                                        rel=1e-12, abs=1e-15)
    assert result.stats["step_time_s"] == pytest.approx(
        steady_state_period(exp.schedule, d, steps=2), rel=1e-12, abs=1e-15)
    # the first step from an idle pipeline is the isolated step
    assert result.first_step_s == pytest.approx(simulate(exp, steps=1).stats["step_time_s"],
                                                rel=1e-12)


def test_zero_bubble_in_steady_state() -> None:
    """ZB-H2 and ZB-V reach m(F + B) with no idle time (Qi et al. 2024); 1F1B keeps its bubble."""
    for name in ("zb-h2", "zb-v"):
        stats = simulate(_exp(4, 8, name)).stats
        assert stats["step_time_s"] == pytest.approx(8 * 3 * MS, rel=1e-12)
        assert stats["bubble_fraction"] == pytest.approx(0.0, abs=1e-12)
        assert stats["idle_breakdown"]["mean_s"]["idle_s"] == pytest.approx(0.0, abs=1e-15)
        assert stats["steps_simulated"] == 3
    assert simulate(_exp(4, 8, "zb-h2"), steps=1).stats["bubble_fraction"] == pytest.approx(1 / 9)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "interleaved", "zb-h1", "dualpipe-v"])
def test_barrier_schedules_unchanged(schedule: str) -> None:
    """One step by default, stats as a direct engine run; N steps under the barrier = N x one."""
    exp = _exp(4, 8, schedule)
    result = simulate(exp)
    assert result.steps == 1
    program = lower(exp.schedule, exp.costs, exp.placement, exp.config.parallel.zero_stage)
    direct = compute_stats(simulate_program(program, exp.cluster, lambda c: c.duration_s),
                           _facts(exp))
    stats = {k: v for k, v in result.stats.items() if k != "idle_breakdown"}
    assert json.dumps(stats) == json.dumps(direct)
    several = simulate(exp, steps=4)
    step = result.stats["step_time_s"]
    assert several.step_ends_s == pytest.approx([step * (k + 1) for k in range(4)], rel=1e-12)
    assert several.stats["step_time_s"] == pytest.approx(step, rel=1e-12)
    assert several.stats["bubble_fraction"] == pytest.approx(result.stats["bubble_fraction"],
                                                             rel=1e-9)


def _facts(exp):
    from sim.api import _facts as facts
    from sim.calibration import default_profile

    return facts(exp, "full", default_profile(exp.cluster.gpu.name))


def test_time_to_train_and_batch_schedule() -> None:
    p, m = 4, 8
    one = (m + p - 1) * 3 * MS
    run = simulate_run(_exp(p, m, "1f1b"), 100)
    assert run.stats["time_to_train_s"] == pytest.approx(100 * one, rel=1e-12)
    assert run.stats["goodput"] == 1.0 and run.stats["lost_work_s"] == 0.0
    assert run.stats["failures"] == 0
    zb = simulate_run(_exp(p, m, "zb-h2"), 100)
    assert zb.stats["time_to_train_s"] == pytest.approx(27 * MS + 99 * 24 * MS, rel=1e-12)
    # a growing global batch (Lau et al. 2025): each size simulated once, the segments summed
    data = synthetic_experiment(p, m)
    data["training"] = {"global_batch_size": m, "global_batch_schedule": [[0, 4], [10, 8],
                                                                          [30, 16]]}
    grown = simulate_run(build_experiment(data), 50)
    expect = 10 * (4 + p - 1) * 3 * MS + 20 * one + 20 * (16 + p - 1) * 3 * MS
    assert grown.stats["time_to_train_s"] == pytest.approx(expect, rel=1e-12)
    assert [r["steps"] for r in grown.stats["run_segments"]] == [10, 20, 20]
    assert len(grown.results) == 3
    idle = grown.stats["idle_breakdown_run_s"]
    assert idle["idle_s"] == pytest.approx(sum(v for k, v in idle.items() if k != "idle_s"))


@pytest.mark.parametrize(("schedule", "message"), [
    ([[1, 8]], r"global_batch_schedule\[0\]=\[1, 8\]: the first entry must start at step 0"),
    ([[0, 8], [0, 16]], r"global_batch_schedule\[1\]=\[0, 16\]: steps must increase"),
    ([[0, 8, 3]], r"global_batch_schedule\[0\]=\[0, 8, 3\]"),
    ([[0, 6]], r"batch 6: training.global_batch_size=6 is not divisible"),
])
def test_bad_batch_schedule(schedule: list, message: str) -> None:
    data = synthetic_experiment(4, 8)
    data["training"] = {"global_batch_size": 8, "micro_batch_size": 4,
                        "global_batch_schedule": schedule}
    with pytest.raises(ConfigError, match=message):
        simulate_run(build_experiment(data), 10)


def test_cli_steps(tmp_path, capsys: pytest.CaptureFixture) -> None:
    import yaml

    data = synthetic_experiment(4, 8, "zb-v", vpp=2, weight_grad_ms=1.0)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path), "--json", "--steps", "10"]) == 0
    stats = json.loads(capsys.readouterr().out)
    for key in ("time_to_train_s", "goodput", "lost_work_s", "step_time_s", "bubble_fraction",
                "idle_breakdown"):
        assert key in stats
    assert stats["step_time_s"] == pytest.approx(24 * MS)
    assert stats["time_to_train_s"] == pytest.approx(stats["first_step_s"] + 9 * 24 * MS)
    assert main(["run", str(path), "--steps", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --steps=0")
    data["training"]["global_batch_schedule"] = [[2, 8]]
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path), "--steps", "5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: training.global_batch_schedule[0]=[2, 8]")
    assert err.count("\n") == 1


def test_compare_uses_the_engine_period() -> None:
    exp = _exp(4, 8, "1f1b")
    rows, results = compare(exp, ("1f1b", "zb-h2", "zb-v"))
    for row in rows[1:]:
        assert row.step_time_s == row.steady_period_s == pytest.approx(24 * MS, rel=1e-12)
    assert rows[1].isolated_step_s == pytest.approx(27 * MS)  # the isolated step, as drawn
    assert all(r.steps == 1 for r in results)
