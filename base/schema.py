"""The base of every input-file model, and the error its validators raise.

Models are strict (``"2"`` is not an integer, ``1`` is not a boolean), take finite
numbers only (``.nan`` and ``.inf`` are errors naming the key, not values that would
turn into NaN results or a run that never ends), reject unknown keys, are frozen,
and take each field's docstring as its description, so the schema documents itself
(``Model.model_fields[name].description``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

INVALID = "invalid_config"
"""Error type of :func:`invalid`: its message is complete and is shown as it is."""


class Strict(BaseModel):
    """A strict, frozen input model whose field docstrings are its field descriptions."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False,
                              use_attribute_docstrings=True)


def invalid(message: str) -> PydanticCustomError:
    """The error for a validator to raise: ``message`` names the key and the value itself
    (e.g. ``cluster.sites=3 does not divide cluster.num_gpus=8``), so it is reported as is."""
    return PydanticCustomError(INVALID, "{message}", {"message": message})
