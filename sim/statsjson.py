"""A run's stats as JSON text without the ``json`` module's Python encoder.

``json.dumps(stats, indent=2, allow_nan=False)`` (the reference, :func:`sim.api.stats_json`)
encodes through ``json.encoder``'s pure-Python generators whenever ``indent`` is set (its C
encoder serves only compact output): ~10,000 instructions a value, ~3 M of a new GPT-3 175B
layout's ~110 M for its ~250 numbers. :func:`indented` writes the same text for the values
stats hold (dicts with ``str`` keys, lists, tuples, ``str``, ``int``, ``float``, ``bool``,
None) in one recursive pass: the same functions for the leaves (the C
``encode_basestring_ascii`` for strings, ``float.__repr__``, ``int.__repr__``), the same
separators and indentation. Anything else (a subclass of those types, a key not a ``str``,
a NaN or infinity, a cycle) and it declines (None): the caller takes the reference, which
encodes or raises as it does. ``tests/test_statsjson.py`` holds it to the reference. Pure.
"""

from __future__ import annotations

from json.encoder import encode_basestring_ascii
from typing import Any

INDENT = "  "
"""What one nesting level indents by (``indent=2``)."""


class _Declined(Exception):
    """A value :func:`indented` leaves to the reference."""


def indented(value: Any) -> str | None:
    """``json.dumps(value, indent=2, allow_nan=False)``, or None where ``value`` holds
    something this writer leaves to it (see the module)."""
    out: list[str] = []
    try:
        _put(value, out, "\n")
    except (_Declined, RecursionError):
        return None
    return "".join(out)


def _leaf(value: Any) -> str:
    """The text of a scalar, as the reference writes it; :class:`_Declined` for a container
    or another type."""
    kind = type(value)
    if kind is float:
        if value - value != 0.0:  # NaN or an infinity (allow_nan=False raises there)
            raise _Declined
        return float.__repr__(value)
    if kind is int:
        return int.__repr__(value)
    if kind is str:
        return encode_basestring_ascii(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    raise _Declined


def _put(value: Any, out: list[str], newline: str) -> None:
    """Append ``value``'s text to ``out``; ``newline``: a line break and the indentation of
    ``value``'s own level (its items go one level deeper)."""
    kind = type(value)
    if kind is dict:
        if not value:
            out.append("{}")
            return
        inner = newline + INDENT
        sep = "{" + inner
        for key, item in value.items():
            if type(key) is not str:
                raise _Declined
            out.append(sep)
            out.append(encode_basestring_ascii(key))
            out.append(": ")
            if type(item) in _CONTAINERS:
                _put(item, out, inner)
            else:
                out.append(_leaf(item))
            sep = "," + inner
        out.append(newline + "}")
    elif kind is list or kind is tuple:
        if not value:
            out.append("[]")
            return
        inner = newline + INDENT
        sep = "[" + inner
        for item in value:
            out.append(sep)
            if type(item) in _CONTAINERS:
                _put(item, out, inner)
            else:
                out.append(_leaf(item))
            sep = "," + inner
        out.append(newline + "]")
    else:
        out.append(_leaf(value))


_CONTAINERS = frozenset((dict, list, tuple))
