"""A layout (one point of the search space) and pins that restrict the dimensions."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from operator import attrgetter
from typing import Any

from base.errors import ConfigError
from topologies.placement import Placement

DIMS = ("tp", "pp", "dp", "cp", "ep", "vpp", "sequence_parallel", "zero_stage",
        "micro_batch_size", "recompute", "schedule")
"""The searched dimensions, in the order of a layout key."""
CONFIG_KEYS = {
    "tp": "parallel.tp", "pp": "parallel.pp", "dp": "parallel.dp", "cp": "parallel.cp",
    "ep": "parallel.ep", "vpp": "parallel.vpp",
    "sequence_parallel": "parallel.sequence_parallel", "zero_stage": "parallel.zero_stage",
    "micro_batch_size": "training.micro_batch_size", "recompute": "training.recompute",
    "schedule": "schedule",
}
"""Experiment-file key of each dimension."""
SHORT_NAMES = {"sequence_parallel": "sp", "zero_stage": "zero", "micro_batch_size": "mbs"}
"""Short names of dimensions in layout keys (the others are their own)."""
ALIASES = {**{d: d for d in DIMS}, **{v: k for k, v in CONFIG_KEYS.items()},
           **{v: k for k, v in SHORT_NAMES.items()},
           "placement": "placement", "parallel.placement": "placement"}
"""Names accepted by ``--fix``: the dimension, its file key, or the short name in layout keys
(and ``placement``, :data:`PLACEMENT_KEY`)."""
PLACEMENT_KEY = "parallel.placement"
"""File key of the placement order: searched only where ``--fix placement=A|B`` lists
orders (:attr:`Layout.placement`); not in :data:`DIMS`, so layout keys, rows and
fingerprints of other searches stay as they were."""
RECOMPUTE = ("none", "selective", "full")


def file_key(dim: str) -> str:
    """The experiment-file key of a dimension ``--fix`` accepts (placement's too)."""
    return CONFIG_KEYS.get(dim, PLACEMENT_KEY)


ZERO_STAGES = (0, 1, 2, 3)




@dataclass(frozen=True)
class Layout:
    """One point of the search space: how the step is split over the GPUs."""

    tp: int
    pp: int
    dp: int
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    sequence_parallel: bool = False
    zero_stage: int = 1
    micro_batch_size: int = 1
    recompute: str = "none"
    schedule: str = "1f1b"
    placement: str | None = None
    """Rank order (``parallel.placement``) when searched; None: the file's."""

    @cached_property
    def key(self) -> str:
        """Canonical text form, e.g. ``tp=8 pp=8 dp=16 ... recompute=none schedule=1f1b``
        (computed once per instance: the sweep's dictionaries are keyed by it)."""
        text = _KEY_FORMAT.format(*[("true" if v else "false") if v.__class__ is bool else v
                                    for v in _dim_values(self)])  # value_text, inlined
        return text if self.placement is None else f"{text} placement={self.placement}"

    @classmethod
    def with_key(cls, values: tuple[Any, ...], key: str) -> Layout:
        """``Layout(*values)`` with its :attr:`key` already set to ``key``, which must be the
        key those values give (enumeration builds the keys from shared parts:
        :func:`sim.search.space.enumerate_layouts`). Fills the fields as the dataclass's
        ``__init__`` would (no field has a default factory or a check), at a fraction of its
        cost: a search builds ~90,000 layouts in its serial part."""
        obj = object.__new__(cls)
        state = obj.__dict__
        state.update(zip(_FIELDS, values, strict=True))
        state["key"] = key
        return obj

    @classmethod
    def from_key(cls, key: str) -> Layout:
        """Inverse of :attr:`key`."""
        values = dict(part.split("=", 1) for part in key.split())
        return cls(**{d: _parse_value(d, values[SHORT_NAMES.get(d, d)]) for d in DIMS},
                   placement=values.get("placement"))

    def values(self) -> tuple[Any, ...]:
        """The layout as a plain tuple (its fields in order; ``Layout(*values)`` rebuilds it),
        as layouts travel to workers."""
        return (*(getattr(self, d) for d in DIMS), self.placement)

    def changes(self, global_batch_size: int) -> dict[str, Any]:
        """Dotted experiment-file changes that select this layout (for ``with_changes``)."""
        out: dict[str, Any] = {CONFIG_KEYS[d]: getattr(self, d) for d in DIMS}
        if self.placement is not None:
            out[PLACEMENT_KEY] = self.placement
        out["training.global_batch_size"] = global_batch_size
        out["training.num_microbatches"] = None
        return out

    def settings(self) -> dict[str, Any]:
        """``{"parallel": {...}, "training": {...}, "schedule": name}``, as in experiment files."""
        out: dict[str, Any] = {"parallel": {}, "training": {}}
        for d in DIMS:
            section, _, name = CONFIG_KEYS[d].rpartition(".")
            if section:
                out[section][name] = getattr(self, d)
            else:
                out[name] = getattr(self, d)
        if self.placement is not None:
            out["parallel"]["placement"] = self.placement
        return out

    def label(self) -> str:
        """Short human-readable form for tables: ``tp8 pp8 dp16 v1 mbs1 sp zero1 none 1f1b``."""
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        parts += [f"cp{self.cp}"] if self.cp > 1 else []
        parts += [f"ep{self.ep}"] if self.ep > 1 else []
        parts += [f"v{self.vpp}", f"mbs{self.micro_batch_size}"]
        parts += ["sp"] if self.sequence_parallel else []
        parts += [f"z{self.zero_stage}", f"rc:{self.recompute}", self.schedule]
        parts += [f"@{self.placement}"] if self.placement is not None else []
        return " ".join(parts)


_KEY_FORMAT = " ".join(f"{SHORT_NAMES.get(d, d)}={{}}" for d in DIMS)
"""A layout key with its values left out (:attr:`Layout.key`)."""
_dim_values = attrgetter(*DIMS)
_FIELDS = (*DIMS, "placement")
"""Layout's fields in order (those of ``Layout(*values)``)."""


def key_text(value: Any) -> str:
    """A value as a layout key writes it (:attr:`Layout.key`): ``true``/``false``, else
    ``format(value)``."""
    return ("true" if value else "false") if value.__class__ is bool else format(value)
"""A layout's values of :data:`DIMS`, in order."""


def value_text(value: Any) -> str:
    """A dimension's value as layout keys and ``--fix`` write it (``true``/``false``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


_BOOLS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False,
          "on": True, "off": False}


def _parse_value(dim: str, text: str) -> Any:
    """Parse a ``--fix`` value of ``dim``; ConfigError naming the key and value."""
    key = file_key(dim)
    text = text.strip()
    if dim == "placement":
        Placement.from_order(text, 1, 1, 1, 1)  # ConfigError naming a bad order
        return text
    if dim == "sequence_parallel":
        if text.lower() not in _BOOLS:
            raise ConfigError(f"--fix {key}={text!r}: expected true or false")
        return _BOOLS[text.lower()]
    if dim == "recompute":
        if text not in RECOMPUTE:
            raise ConfigError(f"--fix {key}={text!r}: choose one of {', '.join(RECOMPUTE)}")
        return text
    if dim == "schedule":
        if not text:
            raise ConfigError(f"--fix {key}: empty schedule name")
        return text
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"--fix {key}={text!r}: expected an integer") from None
    low = 0 if dim == "zero_stage" else 1
    if value < low or (dim == "zero_stage" and value > 3):
        bounds = "0..3" if dim == "zero_stage" else ">= 1"
        raise ConfigError(f"--fix {key}={value}: must be {bounds}")
    return value


Pins = Mapping[str, tuple[Any, ...]]
"""Allowed values per pinned dimension."""


def _bad_pin(part: str, name: str, has_value: bool) -> str:
    """The error for a ``--fix`` part that is not KEY=VALUE with a known KEY: what was
    given, the closest accepted name and every accepted one (short forms included)."""
    short = [SHORT_NAMES.get(d, d) for d in DIMS] + ["placement"]
    close = difflib.get_close_matches(name, list(ALIASES), n=1) if has_value else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    what = f"unknown key {name!r}{hint}; expected" if has_value else "expected"
    return (f"--fix {part!r}: {what} KEY=VALUE with KEY one of {', '.join(short)} or its "
            f"file key ({', '.join([*CONFIG_KEYS.values(), PLACEMENT_KEY])})")


def parse_pins(specs: Iterable[str]) -> dict[str, tuple[Any, ...]]:
    """Parse ``--fix`` arguments: ``"parallel.tp=8,schedule=1f1b"``, ``"mbs=1|2"``.

    Pins are separated by commas, alternatives by ``|``; names may be the
    dimension (``micro_batch_size``), its file key (``training.micro_batch_size``)
    or the short form of layout keys (``mbs``, ``sp``, ``zero``). A dimension pinned
    again keeps the values both pins allow (``tp=1|2|4`` then ``tp=2|8`` is ``tp=2``).
    """
    pins: dict[str, tuple[Any, ...]] = {}
    for spec in specs:
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, eq, values = part.partition("=")
            dim = ALIASES.get(name.strip())
            if not eq or dim is None:
                raise ConfigError(_bad_pin(part, name.strip(), bool(eq)))
            parsed = tuple(dict.fromkeys(_parse_value(dim, v) for v in values.split("|")))
            if dim in pins:  # pinned again: keep the values both allow
                both = tuple(v for v in pins[dim] if v in parsed)
                if not both:
                    raise ConfigError(f"--fix {file_key(dim)}: pinned to "
                                      f"{'|'.join(map(value_text, pins[dim]))} and to "
                                      f"{'|'.join(map(value_text, parsed))}, which share no value")
                parsed = both
            pins[dim] = parsed
    return pins


def pins_from_file(data: Mapping[str, Any]) -> dict[str, tuple[Any, ...]]:
    """Pins for every searched key the experiment file sets (``--pin-from-file``)."""
    pins: dict[str, tuple[Any, ...]] = {}
    for dim, key in CONFIG_KEYS.items():
        node: Any = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is not None:
            pins[dim] = (node,)
    return pins
