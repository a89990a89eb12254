"""layers_per_stage: auto (sim.partition): the dynamic program against brute force, the
split moving off the stages next to a slow WAN, and the memory limit it respects."""

from __future__ import annotations

import itertools
import math

import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import ConfigError
from sim.api import load_experiment, simulate
from sim.partition import _memory_fits, min_max_partition

WAN = ROOT / "workloads" / "examples" / "gpt-1.3b-wan-pp4.yaml"


def _splits(layers: int, stages: int):
    """Every split of ``layers`` into ``stages`` contiguous parts of at least one."""
    for cuts in itertools.combinations(range(1, layers), stages - 1):
        bounds = (0, *cuts, layers)
        yield tuple(b - a for a, b in itertools.pairwise(bounds))


@st.composite
def _cases(draw: st.DrawFn) -> tuple[int, int, list[list[float]]]:
    stages = draw(st.integers(1, 4))
    layers = draw(st.integers(stages, 9))
    cost = st.one_of(st.integers(0, 20).map(float), st.just(math.inf),
                     st.floats(0, 100, allow_nan=False), st.floats(1e200, 1e300))
    table = [[draw(cost) for _ in range(layers + 1)] for _ in range(stages)]
    return layers, stages, table


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(_cases())
def test_dp_matches_brute_force(case: tuple[int, int, list[list[float]]]) -> None:
    layers, stages, table = case
    split = min_max_partition(lambda s, n: table[s][n], layers, stages)
    every = list(_splits(layers, stages))
    pace = min(max(table[s][n] for s, n in enumerate(sp)) for sp in every)
    if pace == math.inf:
        assert split is None
        return
    assert split is not None and sum(split) == layers and min(split) >= 1
    assert max(table[s][n] for s, n in enumerate(split)) == pace
    def spread(sp: tuple[int, ...]) -> float:  # sum of squares, over the pace (no overflow)
        return sum((table[s][n] / pace) ** 2 if pace else 0.0 for s, n in enumerate(sp))

    least = min(spread(sp) for sp in every if max(table[s][n] for s, n in enumerate(sp)) <= pace)
    assert spread(split) == pytest.approx(least)


def test_split_moves_off_the_wan_when_it_slows_down() -> None:
    """Stages 1 and 2 sit either side of the WAN: at 100 Gb/s the split is near even (the
    two stages at the WAN a layer or so lighter) and its simulated step beats
    ``balanced``'s; at 150 Mb/s their pipeline messages take seconds, and they keep one
    layer each."""
    exp = load_experiment(WAN)
    quick = exp.with_changes({"cluster.wan_bandwidth_Mbps": 100_000})
    fast = quick.costs.stage_layers
    slow = exp.costs.stage_layers
    balanced = exp.with_changes({"parallel.layers_per_stage": "balanced"}).costs.stage_layers
    assert slow != fast
    assert slow[1] == slow[2] == 1
    assert max(fast) - min(fast) <= 3 and min(fast[1:3]) == min(fast)
    step = simulate(quick).stats["step_time_s"]
    assert step < simulate(quick.with_changes({"parallel.layers_per_stage": "balanced"})
                           ).stats["step_time_s"]
    assert exp.with_changes({"cluster.wan_bandwidth_Mbps": 100_000,
                             "parallel.layers_per_stage": "balanced"}
                            ).costs.stage_layers == balanced  # balanced ignores the WAN


def test_a_wan_of_almost_no_bandwidth_still_gives_every_stage_a_layer() -> None:
    exp = load_experiment(WAN).with_changes({"cluster.wan_bandwidth_Mbps": 1e-300})
    assert min(exp.costs.stage_layers) == 1 and sum(exp.costs.stage_layers) == 24


def test_auto_respects_the_memory_limit() -> None:
    """GPT-3 6.7B on 40 GB GPUs: the first stage holds four micro-batches in flight under
    1F1B; the WAN would have it take more layers than fit, so it takes as many as fit,
    and the simulated peak memory is within capacity."""
    exp = load_experiment(WAN).with_changes({
        "model.preset": "gpt3-6.7b", "training.micro_batch_size": 8,
        "training.global_batch_size": 64, "cluster.preset": "dgx-a100-40g"})
    split = exp.costs.stage_layers
    fits = _memory_fits(exp.costs, exp.schedule, exp.placement, exp.cluster)
    assert all(fits(r, n) for r, n in enumerate(split))
    assert not fits(0, split[0] + 1)  # the limit binds
    stats = simulate(exp, fidelity="collapsed").stats
    assert not stats["oom"]


def test_auto_needs_one_chunk_per_rank() -> None:
    with pytest.raises(ConfigError, match="one model chunk per pipeline rank"):
        load_experiment(WAN).with_changes({"schedule": "interleaved"})


def test_search_refuses_auto() -> None:
    from sim.config import read_yaml
    from sim.search import SearchContext

    with pytest.raises(ConfigError, match="layers_per_stage='auto': sim search"):
        SearchContext.build(read_yaml(WAN))
