"""Checks shared by the training configs: field docstrings, value checks and JSON entry types.

The dataclasses of :mod:`recurrl.trainers.config` validate their fields with these, and
:meth:`~recurrl.trainers.config.TrainConfig.from_dict` checks a ``config.json`` entry by entry
with :func:`check_entries`.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import math
import textwrap
import types
import typing
from collections.abc import Collection
from typing import Any, Literal

__all__ = ["check_entries", "check_frames", "field_docs", "finite", "positive"]


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass: ``{field name: docstring}``.

    A string literal right after a field's annotated assignment documents it (PEP 257
    attribute docstrings; Sphinx reads them the same way).

    Examples:
        >>> from recurrl.trainers.config import ModelConfig
        >>> field_docs(ModelConfig)["hidden_size"]
        'Features of the recurrent state (and width of the MLP layers).'
    """
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def positive(cls: str, **values: Any) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{cls}: {name} must be an int >= 1, received {value!r}.")


def finite(obj: Any) -> None:
    """Reject NaN and infinities in every float field of the dataclass ``obj``.

    NaN compares False with every bound, so the configs' range checks would let it through
    (``--lr nan`` trained on NaN weights); one check here covers every float option.
    """
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            default = f.default if f.default is not dataclasses.MISSING else None
            flag = "--" + f.name.replace("_", "-")
            raise ValueError(
                f"{type(obj).__name__}: {f.name} must be a finite number, received {value}. "
                f"Fix: {flag} {default}."
            )


def check_frames(cls: str, frames: int, frames_per_batch: int) -> None:
    if frames % frames_per_batch:
        fixed = max(1, round(frames / frames_per_batch)) * frames_per_batch
        raise ValueError(
            f"{cls}: frames={frames} is not a multiple of frames_per_batch="
            f"{frames_per_batch}. Fix: --frames {fixed}."
        )


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))


def _has_type(hint: Any, value: Any) -> bool:
    """Whether a JSON value fits a field annotation (bool is not an int here)."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return any(type(value) is type(a) and value == a for a in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(a, value) for a in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint) if isinstance(hint, type) else True


def check_entries(cls: type, data: Any, where: str, nested: Collection[str] = ()) -> None:
    """Raise ``ValueError`` for a non-dict, an unknown entry or a value of the wrong type.

    ``nested``: entries of ``cls`` that hold a section checked on its own (not typed here).
    """
    name = where.rstrip(".") or "the config"
    if not isinstance(data, dict):
        raise ValueError(
            f"TrainConfig: {name} must be a JSON object of {cls.__name__} entries, received "
            f"{data!r} ({type(data).__name__})."
        )
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    for key, value in data.items():
        if key not in fields:
            raise ValueError(
                f"TrainConfig: unknown entry {where}{key} in {name}; expected some of "
                f"{fields}. Fix: remove it, or correct its spelling."
            )
        if key not in nested and not _has_type(hints[key], value):
            raise ValueError(
                f"TrainConfig: {where}{key} must be {_type_name(hints[key])}, received "
                f"{value!r} ({type(value).__name__}). Fix: correct that entry."
            )
