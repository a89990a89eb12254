"""The base of every input-file model, and the error its validators raise.

Models are strict (``"2"`` is not an integer, ``1`` is not a boolean), take finite
numbers only (``.nan`` and ``.inf`` are errors naming the key, not values that would
turn into NaN results or a run that never ends), reject unknown keys, are frozen,
and take each field's docstring as its description, so the schema documents itself
(``Model.model_json_schema()``; ``Model.model_fields[name].description`` after
:func:`document`). The docstrings are read from the source only when a schema is asked
for: reading them as each model is defined (pydantic's ``use_attribute_docstrings``)
was 60 ms of every ``sim run``, which validates and never describes.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

INVALID = "invalid_config"
"""Error type of :func:`invalid`: its message is complete and is shown as it is."""

_MODELS: list[type[Strict]] = []
"""Every :class:`Strict` model, in the order they were defined (a model's field types
before it)."""
_DOCUMENTED: set[type[Strict]] = set()
"""The models :func:`document` has described."""


class Strict(BaseModel):
    """A strict, frozen input model whose field docstrings are its field descriptions."""

    # defer_build: a model's validator is built when something first validates it (or asks
    # for its schema), not at its definition. A run validates only the experiment's root
    # model, whose one build takes the schemas of the sections and cluster kinds inside it;
    # building each of them on its own as well was ~15 M instructions of every `sim` command
    # (Megatron 1T's `sim run`). The schemas, the validation and its errors are the same.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False,
                              defer_build=True)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        _MODELS.append(cls)

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """pydantic's JSON schema, every field described by its docstring (:func:`document`)."""
        document()
        return super().model_json_schema(*args, **kwargs)


def document() -> None:
    """Give every field of every :class:`Strict` model defined so far its docstring as its
    description (where it has none), as pydantic's ``use_attribute_docstrings`` would, and
    rebuild the models' schemas so that they carry them (field types first)."""
    pending = [m for m in _MODELS if m not in _DOCUMENTED]
    if not pending:
        return
    for model in pending:
        docs: dict[str, str] = {}
        for klass in reversed(model.__mro__):  # a subclass's docstring over its base's
            if klass in _MODELS:
                docs.update(field_docstrings(klass))
        for name, info in model.model_fields.items():
            if info.description is None and name in docs:
                info.description = docs[name]
        _DOCUMENTED.add(model)
    for model in _MODELS:  # defined after their field types: those are rebuilt first
        model.model_rebuild(force=True)


def field_docstrings(cls: type) -> dict[str, str]:
    """The docstrings of the annotated attributes ``cls`` itself defines (a string right after
    ``name: type [= default]`` in its body), cleaned as :func:`inspect.cleandoc` cleans them."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(body, ast.ClassDef) and body.name == cls.__name__
    out = {}
    for field, doc in zip(body.body, body.body[1:], strict=False):
        if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
                and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                and isinstance(doc.value.value, str)):
            out[field.target.id] = inspect.cleandoc(doc.value.value)
    return out


def invalid(message: str) -> PydanticCustomError:
    """The error for a validator to raise: ``message`` names the key and the value itself
    (e.g. ``cluster.sites=3 does not divide cluster.num_gpus=8``), so it is reported as is."""
    return PydanticCustomError(INVALID, "{message}", {"message": message})
