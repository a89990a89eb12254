"""What a run loads lazily (issue 22, "a lean single run") equals what it loaded eagerly."""

from __future__ import annotations

from dataclasses import replace
from importlib.resources import files

from base.errors import ConfigError
from workloads import frameworks
from workloads.frameworks import FRAMEWORKS, Profiles, load_profiles, table_texts


def _text() -> str:
    return files("workloads").joinpath("frameworks.toml").read_text(encoding="utf-8")


def test_profiles_read_table_by_table_equal_the_whole_files() -> None:
    whole = load_profiles(_text())
    lazy = Profiles(_text())
    assert list(lazy) == list(whole) == list(table_texts(_text()))
    for name in reversed(whole):  # in any order: a profile builds what it inherits from
        assert lazy[name] == whole[name], name
    assert dict(FRAMEWORKS) == whole


def test_profiles_are_a_mapping_a_test_may_patch() -> None:
    lazy = Profiles(_text())
    assert "megatron" in lazy and "nope" not in lazy and len(lazy) == len(load_profiles(_text()))
    other = replace(lazy["megatron"], embedding_grad_bytes=None)
    lazy["megatron"] = other
    assert lazy["megatron"] is other
    lazy["mine"] = other
    assert list(lazy)[-1] == "mine"
    del lazy["mine"]
    assert "mine" not in lazy
    try:
        lazy["mine"]
    except KeyError:
        pass
    else:
        raise AssertionError("a deleted profile is still there")
    assert frameworks.framework("megatron") is FRAMEWORKS["megatron"]


def test_an_unknown_framework_still_lists_every_profile_in_the_files_order() -> None:
    names = ", ".join(load_profiles(_text()))
    try:
        frameworks.framework("nope")
    except ConfigError as exc:
        assert str(exc) == f"training.framework='nope': unknown framework; choose one of {names}"
    else:
        raise AssertionError("an unknown framework was accepted")
