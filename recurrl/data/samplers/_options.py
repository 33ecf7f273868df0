"""The samplers' constructor arguments, each written once.

A group of options is a frozen dataclass: its fields are constructor arguments (name, type,
default, in signature order; ``kw_only`` fields are keyword-only), its ``__post_init__``
checks them (the error naming the sampler being built, passed as the ``owner`` init-only
argument), and its docstring documents them in an ``Args:`` section. A sampler composes its
constructor from one or more groups with :func:`takes`:

- ``inspect.signature``, ``help()`` and the rendered docs show the real parameters (the
  fields of its groups, minus those it excludes), not ``**kwargs``;
- a call is bound to that signature (a misspelt or missing argument is a ``TypeError``, as
  with a written signature) and the groups are built and checked from it; each argument is
  then also an attribute of the sampler (its checked value, e.g. ``sampler.slice_len``),
  unless the class computes it (a property);
- the class's docstring lists every argument: its own entries first, the groups' for the
  rest (:func:`complete_doc`, called by :class:`~recurrl.data.samplers.Sampler` when a
  subclass is created).

The groups are :class:`~recurrl.data.samplers._slice_args.SliceOptions` (slice samplers),
:class:`~recurrl.data.samplers._tape_args.TapeOptions` (tape samplers) and
:class:`~recurrl.data.samplers._priority_args.PriorityOptions` (their prioritized versions).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any

from recurrl.modules._arg_docs import complete_arguments_doc

__all__ = ["complete_doc", "option_groups", "takes"]

_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
_SELF = inspect.Parameter("self", _POSITIONAL)
_GROUPS = "__option_groups__"  # attribute of a decorated __init__: its groups, in order


def _parameters(group: type) -> list[inspect.Parameter]:
    """The constructor parameters of the init fields of ``group``, in field order."""
    params = []
    for f in dataclasses.fields(group):
        if not f.init:
            continue
        if f.default_factory is not dataclasses.MISSING:  # one object for every call
            raise ValueError(f"takes: {group.__name__}.{f.name} needs a plain default.")
        default = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        kind = inspect.Parameter.KEYWORD_ONLY if f.kw_only else _POSITIONAL
        params.append(inspect.Parameter(f.name, kind, default=default, annotation=f.type))
    return params


def _names(group: type) -> set[str]:
    return {f.name for f in dataclasses.fields(group) if f.init}


def takes(
    *groups: type,
    exclude: Collection[str] = (),
    defaults: Mapping[str, Any] | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give an ``__init__(self, *groups)`` the public signature of its option groups.

    A call is bound to that signature, each group is built (and checked) from it, every
    argument becomes an attribute of the instance (but those the class defines as
    properties), and the decorated ``__init__`` runs with the groups.

    Args:
        groups: the option dataclasses, in signature order; the decorated ``__init__``
            receives one checked instance of each.
        exclude: fields that are not arguments of this sampler; they keep the group's
            default, or the value in ``fixed``.
        defaults: a different default for some of the arguments.
        fixed: the value of an excluded field.

    Examples:
        >>> from dataclasses import dataclass
        >>> @dataclass(frozen=True)
        ... class Size:
        ...     width: int
        ...     height: int = 1
        ...     owner: dataclasses.InitVar[str] = "Box"
        ...     def __post_init__(self, owner):
        ...         if self.width < 1:
        ...             raise ValueError(f"{owner}: expected width >= 1, received {self.width}")
        >>> class Box:
        ...     @takes(Size, defaults={"height": 2})
        ...     def __init__(self, size: Size) -> None:
        ...         self.size = size
        >>> inspect.signature(Box)
        <Signature (width: 'int', height: 'int' = 2) -> 'None'>
        >>> box = Box(3)
        >>> box.size, box.height
        (Size(width=3, height=2), 2)
        >>> Box(0)
        Traceback (most recent call last):
        ...
        ValueError: Box: expected width >= 1, received 0
        >>> Box(3, hieght=1)
        Traceback (most recent call last):
        ...
        TypeError: Box: got an unexpected keyword argument 'hieght'; fix: did you mean height=?
    """
    defaults, fixed = dict(defaults or {}), dict(fixed or {})
    known = set().union(*map(_names, groups))
    for what, names in (("exclude", exclude), ("defaults", defaults), ("fixed", fixed)):
        unknown = set(names) - known
        if unknown:  # a programming error of the sampler: caught when its module is imported
            raise ValueError(f"takes: {what} names {sorted(unknown)}, not fields of {groups}.")
    if set(fixed) - set(exclude):
        raise ValueError(f"takes: fixed values are for excluded fields, received {fixed}.")
    params = [
        p.replace(default=defaults[p.name]) if p.name in defaults else p
        for group in groups
        for p in _parameters(group)
        if p.name not in exclude
    ]
    signature = inspect.Signature([_SELF, *params], return_annotation="None")

    def decorate(body: Callable[..., None]) -> Callable[..., None]:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            owner = type(self).__name__
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError as err:
                raise TypeError(_call_error(owner, err, kwargs, params)) from None
            bound.apply_defaults()
            values = {**bound.arguments, **fixed}
            built = tuple(
                group(**{k: values[k] for k in _names(group) if k in values}, owner=owner)
                for group in groups
            )
            _hold(self, built)
            body(self, *built)

        __init__.__signature__ = signature  # type: ignore[attr-defined]
        for name in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(__init__, name, getattr(body, name))
        setattr(__init__, _GROUPS, groups)
        return __init__

    return decorate


def _hold(obj: Any, groups: tuple) -> None:
    """Set every argument of ``groups`` as an attribute of ``obj`` (its checked value),
    except those its class computes (a property, e.g. a value derived from the arguments):
    the attributes the sampling code reads and that code written for the reference reads,
    assignable as before."""
    cls = type(obj)
    for group in groups:
        for f in dataclasses.fields(group):
            if f.init and not isinstance(inspect.getattr_static(cls, f.name, None), property):
                setattr(obj, f.name, getattr(group, f.name))


def _call_error(owner: str, err: TypeError, kwargs: dict, params: list) -> str:
    """The binding error of a call, with the fix."""
    names = [p.name for p in params]
    unknown = [k for k in kwargs if k not in names]
    if unknown:
        close = difflib.get_close_matches(unknown[0], names, n=1, cutoff=0.75)
        listed = ", ".join(names)
        fix = f"did you mean {close[0]}=?" if close else f"pass only its arguments ({listed})."
        return f"{owner}: {err}; fix: {fix}"
    return f"{owner}: {err}; fix: see help({owner}) for its arguments."


def option_groups(cls: type) -> tuple[type, ...]:
    """The option groups of the ``__init__`` that ``cls`` defines (``()``: none, or not its
    own)."""
    return getattr(cls.__dict__.get("__init__"), _GROUPS, ())


def complete_doc(cls: type) -> None:
    """Complete the argument sections of ``cls.__doc__`` with its option groups' entries
    (the class's own entries first): every argument of its signature is documented."""
    groups = option_groups(cls)
    if groups:
        complete_arguments_doc(cls, *(group.__doc__ for group in groups))
