"""``json.dumps(value, indent=2, allow_nan=False)`` of plain values, without the encoder's
Python generators.

With an indent, :mod:`json` encodes in Python (its C encoder takes no indent in this
Python), one generator step per value: a run's stats (some 290 lines) took ~0.35 ms, a
tenth of a repeated GPT-3 175B run's statistics. :func:`dumps_indent2` writes the same
text from the same pieces (``float.__repr__``, ``int.__repr__``, the C string encoder,
the separators ``,`` and ``: `` that an indent implies) for dicts with string or integer
keys, lists, tuples, strings, integers, finite floats, booleans and None, exactly of those
types; anything else (a subclass, a NaN or infinity, another key) makes it decline
(None), and the caller encodes with :mod:`json`, the reference
(``tests/test_jsonindent.py``). Pure.
"""

from __future__ import annotations

import math
from json.encoder import encode_basestring_ascii
from typing import Any

_INDENTS = ["\n" + "  " * k for k in range(32)]


class _Decline(Exception):
    """A value :func:`dumps_indent2` leaves to :mod:`json`."""


def dumps_indent2(value: Any) -> str | None:
    """``json.dumps(value, indent=2, allow_nan=False)`` (the same text), or None where
    ``value`` holds something else than the plain values above (the caller then calls
    :func:`json.dumps`, which also raises where it must)."""
    out: list[str] = []
    try:
        _encode(value, 1, out)
    except (_Decline, RecursionError):
        return None
    return "".join(out)


def _scalar(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return encode_basestring_ascii(value)
    if kind is float:
        if not math.isfinite(value):
            raise _Decline
        return float.__repr__(value)
    if kind is int:
        return int.__repr__(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    raise _Decline


def _encode(value: Any, level: int, out: list[str]) -> None:
    """Append ``value`` encoded at nesting ``level`` (its items indented by ``level``)."""
    kind = type(value)
    if kind is dict:
        if not value:
            out.append("{}")
            return
        if level >= len(_INDENTS):
            raise _Decline
        sep = "{" + _INDENTS[level]
        for key, item in value.items():
            if type(key) is str:
                name = encode_basestring_ascii(key)
            elif type(key) is int:
                name = '"' + int.__repr__(key) + '"'  # json writes an integer key's digits
            else:
                raise _Decline
            what = type(item)
            if what is float and math.isfinite(item):
                out.append(sep + name + ": " + float.__repr__(item))
            elif what is dict or what is list or what is tuple:
                out.append(sep + name + ": ")
                _encode(item, level + 1, out)
            else:
                out.append(sep + name + ": " + _scalar(item))
            sep = "," + _INDENTS[level]
        out.append(_INDENTS[level - 1] + "}")
        return
    if kind is list or kind is tuple:
        if not value:
            out.append("[]")
            return
        if level >= len(_INDENTS):
            raise _Decline
        sep = "[" + _INDENTS[level]
        for item in value:
            what = type(item)
            if what is float and math.isfinite(item):
                out.append(sep + float.__repr__(item))
            elif what is dict or what is list or what is tuple:
                out.append(sep)
                _encode(item, level + 1, out)
            else:
                out.append(sep + _scalar(item))
            sep = "," + _INDENTS[level]
        out.append(_INDENTS[level - 1] + "]")
        return
    out.append(_scalar(value))
