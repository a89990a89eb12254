"""The collapsed lowering's signature representatives built in one pass
(:meth:`workloads.lowering.columnar.ColumnarOps.instructions_at`) equal
:meth:`~workloads.lowering.columnar.ColumnarOps.instruction` of each id (the reference), and
every instruction of the layout so built equals :meth:`~ColumnarOps.build`'s (collectives
but their keys, which ``instruction`` counts from the op's first): hypothesis over the
random collapsible experiments of ``tests/test_lowering_paths.py``, sends blocking or not."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import workloads.lowering as lowering
from tests.strategies import collapsible_experiments
from tests.test_lowering_paths import _collapse, _fast_path_case
from workloads.program import Collective


@settings(max_examples=120, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(collapsible_experiments(), st.sampled_from((False, True)))
def test_instructions_at_equal_instruction(data: dict, blocking: bool) -> None:
    exp, costs, zero_stage = _fast_path_case(data, blocking)
    made = []
    real = lowering.lower_collapsed
    try:
        lowering.lower_collapsed = lambda *a: made.append(real(*a)) or made[-1]
        lowering.lower(exp.schedule, costs, exp.placement, zero_stage,
                       _collapse(exp))
    finally:
        lowering.lower_collapsed = real
    assume(made)
    layout = made[0]
    ids = list(range(layout.size))
    one_pass = layout.instructions_at(ids)
    assert repr(one_pass) == repr(tuple(layout.instruction(i) for i in ids))
    built = layout.build()

    def keyless(x: object) -> str:
        return repr(x._replace(key=0) if isinstance(x, Collective) else x)

    assert [keyless(x) for x in one_pass] == [keyless(x) for x in built]
