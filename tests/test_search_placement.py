"""``placement`` as a dimension of ``sim search`` (``--fix placement=A|B``): searched only
when pinned, its layouts' bounds hold, and on a mixed cluster whose server types alternate
the search finds an order that beats the default one."""

from __future__ import annotations

import pytest
from conftest import ROOT

from base.errors import ConfigError
from sim.config import read_yaml
from sim.search import (
    Evaluator,
    Layout,
    Screener,
    SearchContext,
    enumerate_layouts,
    parse_pins,
    search,
)
from topologies.placement import DEFAULT_ORDER

EXAMPLE = ROOT / "workloads" / "examples" / "search-hetero-placement.yaml"
ORDERS = f"{DEFAULT_ORDER}|tp-cp-pp-dp"


def test_placement_pins_parse_and_bad_orders_are_refused() -> None:
    assert parse_pins([f"parallel.placement={ORDERS}"])["placement"] == (DEFAULT_ORDER,
                                                                         "tp-cp-pp-dp")
    with pytest.raises(ConfigError, match="parallel.placement='tp-xx'"):
        parse_pins(["placement=tp-xx"])


def test_layout_keys_name_a_searched_placement_only() -> None:
    plain = Layout(8, 2, 2)
    assert "placement" not in plain.key and Layout.from_key(plain.key) == plain
    placed = Layout(8, 2, 2, placement="tp-cp-pp-dp")
    assert placed.key.endswith(" placement=tp-cp-pp-dp")
    assert Layout.from_key(placed.key) == placed
    assert Layout(*placed.values()) == placed
    assert placed.changes(16)["parallel.placement"] == "tp-cp-pp-dp"


def test_enumeration_searches_placement_only_when_pinned() -> None:
    ctx = SearchContext.build(read_yaml(EXAMPLE))
    pins = parse_pins(["tp=8,pp=2,mbs=1,zero=1,sp=false,recompute=none,schedule=1f1b"])
    assert [lay.placement for lay in enumerate_layouts(ctx, pins)] == [None]
    both = {**pins, **parse_pins([f"placement={ORDERS}"])}
    assert [lay.placement for lay in enumerate_layouts(ctx, both)] == ORDERS.split("|")


def test_search_finds_a_better_placement_than_the_default_order() -> None:
    """A100 and H100 servers alternate: the default order mixes the types in each stage;
    tp-cp-pp-dp gives each stage one type, and the search ranks it first. The bounds of
    both layouts hold against their simulations."""
    data = read_yaml(EXAMPLE)
    pins = parse_pins([f"tp=8,pp=2,mbs=1,zero=1,sp=false,recompute=none,schedule=1f1b,"
                       f"placement={ORDERS}"])
    found = search(data, pins=pins, top=2, fidelity="auto")
    assert found.best is not None and found.best.layout.placement == "tp-cp-pp-dp"
    steps = {row.layout.placement: row.figure("step_time_s") for row in found.top(2)}
    assert steps["tp-cp-pp-dp"] < 0.8 * steps[DEFAULT_ORDER]
    ctx = SearchContext.build(data)
    screener = Screener(ctx, None, comm=False, collapsed_only=False)
    evaluator = Evaluator(ctx.data, ctx.global_batch_size, "auto", None)
    for layout in enumerate_layouts(ctx, pins):
        stats = evaluator(layout).stats
        judged = screener.judge(screener.screen(layout))
        assert judged.memory_bound_gib <= stats["peak_memory_gib"] * (1 + 1e-9)
        assert stats["tokens_per_s"] <= judged.tokens_bound * (1 + 1e-9)
