"""The experiment file's schema documents itself, and README.md's schema section matches it."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import get_args

import pytest
import yaml
from conftest import ROOT
from pydantic import BaseModel, ConfigDict

from base.errors import ConfigError
from base.schema import Strict, field_docstrings
from sim.config import ExperimentConfig, parse_config
from sim.jobs_config import JobsConfig
from topologies.config import (
    GpuNodesCluster,
    IdealCluster,
    PresetCluster,
    PresetNodesCluster,
    TopologyCluster,
)

SCHEMA = ExperimentConfig.model_json_schema()
JOBS_SCHEMA = JobsConfig.model_json_schema()
MODELS = {"ExperimentConfig": SCHEMA, **SCHEMA["$defs"], "JobsConfig": JOBS_SCHEMA,
          **JOBS_SCHEMA["$defs"]}
"""Every model of the experiment file (and of a multi-job file), as JSON schema, by name."""
FIELDS = {key for model in MODELS.values() for key in model["properties"]}
SYNTHETIC = {"synthetic": {"forward_ms": 1.0, "backward_ms": 1.0}}


def _readme_schema() -> str:
    """The YAML block of README.md's section "The experiment file"."""
    section = (ROOT / "README.md").read_text().split("## The experiment file\n", 1)[1]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


def test_every_model_and_field_has_a_docstring() -> None:
    for name, model in MODELS.items():
        assert model.get("description"), f"{name} has no docstring"
        for key, field in model["properties"].items():
            assert field.get("description"), f"{name}.{key} has no docstring"


def test_readme_names_only_keys_that_exist() -> None:
    named = set(re.findall(r"(?<![\w./-])([A-Za-z_]\w*):(?=\s|$)", _readme_schema()))
    assert named, "no keys found in the README's schema section"
    assert not named - FIELDS, f"README names keys the schema lacks: {sorted(named - FIELDS)}"


def test_readme_names_every_key() -> None:
    words = set(re.findall(r"[A-Za-z_]\w*", _readme_schema()))
    assert not FIELDS - words, f"README's schema section misses {sorted(FIELDS - words)}"


def test_readme_example_is_a_valid_experiment() -> None:
    parse_config(yaml.safe_load(_readme_schema()))


@pytest.mark.parametrize(("cluster", "kind"), [
    ({"preset": "ideal", "num_gpus": 8}, IdealCluster),
    ({"preset": "dgx-h100", "num_gpus": 16, "topology": "fat-tree"}, PresetCluster),
    ({"topology": "ring", "num_gpus": 8, "link_bandwidth_GBps": 10.0}, TopologyCluster),
    ({"num_gpus": 16, "nodes": [{"preset": "dgx-a100-80g", "count": 1},
                                {"preset": "dgx-h100", "count": 1}]}, PresetNodesCluster),
    ({"num_gpus": 8, "topology": "switch", "link_bandwidth_GBps": 10.0,
      "nodes": [{"gpu": "A100-80GB", "count": 4}, {"gpu": "H100", "count": 4}]},
     GpuNodesCluster),
])
def test_the_kind_of_cluster_is_read_off_its_keys(cluster: dict, kind: type) -> None:
    assert type(parse_config({"model": SYNTHETIC, "cluster": cluster}).cluster) is kind


@pytest.mark.parametrize(("cluster", "message"), [
    ({"preset": "dgx-h100", "num_gpus": 8, "dims": [2, 4]},
     "cluster.dims=[2, 4]: only used with cluster.topology (no preset) or cluster.nodes of "
     "GPU types, not with cluster.preset='dgx-h100'"),
    ({"preset": "ideal", "num_gpus": 8, "sites": 2},
     "cluster.sites=2: not used with cluster.preset='ideal'"),
    ({"topology": "ring", "num_gpus": 8, "link_bandwidth_GBps": 1.0, "nvlink_bandwith_GBps": 1.0},
     "unknown key 'cluster.nvlink_bandwith_GBps' (did you mean 'nvlink_bandwidth_GBps'?)"),
    ({"topology": "switch", "num_gpus": 8, "link_bandwidth_GBps": 1.0, "sites": 3},
     "cluster.sites=3 does not divide cluster.num_gpus=8"),
    ({"topology": "ring", "num_gpus": 8}, "cluster.link_bandwidth_GBps: required key is missing"),
    ({"preset": "dgx-h100", "num_gpus": 16, "tiers": 3},
     "cluster.tiers: only used with cluster.topology fat-tree, not with topology=None"),
])
def test_cluster_keys_are_checked_when_the_file_is_parsed(cluster: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"model": SYNTHETIC, "cluster": cluster})
    assert str(info.value) == message


def test_the_schemas_names_are_the_builders() -> None:
    """The schema spells topologies, ops and algorithms as the code that runs them does."""
    from sim.collectives import ALGORITHMS, ALGORITHMS_BY_OP, AUTO
    from topologies.config import CollectiveAlgo, CollectivesConfig, Topology
    from topologies.presets import TOPOLOGIES

    assert get_args(Topology) == TOPOLOGIES
    assert set(get_args(CollectiveAlgo)) == {AUTO, *ALGORITHMS}
    assert set(CollectivesConfig.model_fields) == set(ALGORITHMS_BY_OP)


class _Described(Strict):
    """Fields with docstrings, one without, a long one."""

    a: int = 0
    """The a."""
    b: str = ""
    c: float = 0.0
    """Two
       lines."""


class _DescribedByPydantic(BaseModel):
    """:class:`_Described`, its descriptions read by pydantic as it is defined."""

    model_config = ConfigDict(use_attribute_docstrings=True)
    a: int = 0
    """The a."""
    b: str = ""
    c: float = 0.0
    """Two
       lines."""


def test_field_docstrings_are_read_as_pydantic_reads_them_when_a_schema_is_asked_for() -> None:
    schema = _Described.model_json_schema()
    plain = _DescribedByPydantic.model_json_schema()
    assert field_docstrings(_Described) == {"a": "The a.", "c": "Two\nlines."}
    assert schema["properties"] == plain["properties"]
    assert ({k: f.description for k, f in _Described.model_fields.items()}
            == {k: f.description for k, f in _DescribedByPydantic.model_fields.items()})
    assert _Described(a=2).a == 2  # still validates after the rebuild
    with pytest.raises(ValueError, match="Extra inputs"):
        _Described(d=1)


def test_a_run_reads_no_docstrings() -> None:
    """Validating an experiment (as ``sim run`` does) leaves the descriptions unread."""
    code = ("from sim.config import ExperimentConfig, parse_config\n"
            "parse_config({'name': 'x', 'model': {'synthetic': {'forward_ms': 1.0, "
            "'backward_ms': 1.0}}, 'cluster': {'preset': 'dgx-a100-80g', 'num_gpus': 8}})\n"
            "print(ExperimentConfig.model_fields['name'].description)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "None"
