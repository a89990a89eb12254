"""The input models' validators are built when first used (pydantic's ``defer_build`` on
:class:`base.schema.Strict`): a run builds only the experiment's root model, and every
model, deferred, validates and fails exactly as one built at its definition."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ConfigDict, ValidationError

import sim.faults_config  # noqa: F401  (every model of an input file defined)
import sim.jobs_config  # noqa: F401
import sim.swarm_config  # noqa: F401
from base import schema
from base.errors import ConfigError
from sim.config import ExperimentConfig, validated
from topologies.config import KINDS, _Kind

MODELS = [m for m in schema._MODELS if not issubclass(m, _Kind) or m in KINDS.values()]
"""Every input model but the bases of the cluster kinds (never validated themselves)."""


def _eager(model: type[schema.Strict]) -> type[schema.Strict]:
    """``model`` with its validator built at its definition, as before ``defer_build``."""
    twin = type(model.__name__, (model,), {"model_config": ConfigDict(defer_build=False),
                                           "__module__": model.__module__,
                                           "__qualname__": model.__qualname__})
    schema._MODELS.remove(twin)  # (not an input model: document() leaves it alone)
    assert twin.__pydantic_complete__
    return twin


EAGER = {model: _eager(model) for model in MODELS}

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**9), st.sampled_from(
    [0, 1, 2, 8, 64, 1 << 40]), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "x", "1f1b", "interleaved", "dgx-a100-80g", "llama-13b", "ring",
                     "fat-tree", "bf16", "megatron", "auto"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(
        ["preset", "num_gpus", "tp", "pp", "dp", "forward_ms", "backward_ms", "count", "gpu",
         "num_layers", "bogus"]), inner, max_size=4)), max_leaves=8)


@st.composite
def _inputs(draw: st.DrawFn, model: type[schema.Strict]) -> dict[str, Any]:
    keys = sorted(model.model_fields)
    chosen = draw(st.lists(st.sampled_from(keys), unique=True, max_size=len(keys))) if keys else []
    data = {key: draw(VALUES) for key in chosen}
    if draw(st.booleans()):
        data[draw(st.sampled_from(["bogus", "tp", "preset", "num_gpus"]))] = draw(SCALARS)
    return data


def _outcome(model: type[schema.Strict], data: Any) -> tuple:
    """What validating ``data`` gives: the fields' values, or the errors as shown."""
    try:
        return ("ok", repr(model.model_validate(data).model_dump()))
    except ValidationError as exc:
        return ("error", [(e["type"], e["loc"], e["msg"], repr(e.get("input")))
                          for e in exc.errors(include_url=False)])
    except Exception as exc:  # noqa: BLE001  (a validator's own, raised as is: the same one)
        return ("raised", type(exc).__name__, str(exc))


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_deferred_model_validates_as_one_built_at_once(model: type[schema.Strict],
                                                         data: st.DataObject) -> None:
    given_ = data.draw(_inputs(model))
    assert _outcome(model, given_) == _outcome(EAGER[model], given_)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_an_experiments_error_message_is_the_same(data: st.DataObject) -> None:
    base = {"model": {"synthetic": {"forward_ms": 1.0, "backward_ms": 1.0}},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": 8}}
    section = data.draw(st.sampled_from(["model", "cluster", "parallel", "training", None]))
    drawn = data.draw(st.dictionaries(st.sampled_from(
        ["tp", "pp", "dp", "num_gpus", "preset", "topology", "schedule", "seq_length",
         "global_batch_size", "micro_batch_size", "bogus", "nodes", "synthetic", "name"]),
        VALUES, max_size=3))
    given_ = {**base, **drawn} if section is None else {
        **base, section: {**base.get(section, {}), **drawn}}

    def message(root: type[schema.Strict]) -> str:
        try:
            return repr(validated(root, given_).model_dump())
        except ConfigError as exc:
            return f"error: {exc}"

    assert message(ExperimentConfig) == message(EAGER[ExperimentConfig])


def test_a_run_builds_only_the_root_model() -> None:
    """Validating an experiment (as ``sim run`` does) builds ``ExperimentConfig``'s validator
    and none of the models inside it on their own but the two whose instances are its
    defaults (made at its definition: ``parallel``, ``training``)."""
    code = ("from base import schema\n"
            "from sim.config import parse_config\n"
            "parse_config({'name': 'x', 'model': {'preset': 'gpt3-175b'}, 'parallel': "
            "{'tp': 8}, 'cluster': {'preset': 'dgx-a100-80g', 'num_gpus': 8}})\n"
            "print(sorted(m.__name__ for m in schema._MODELS if m.__pydantic_complete__))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "['ExperimentConfig', 'ParallelConfig', 'TrainingConfig']"
