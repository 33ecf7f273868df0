"""The memory registry: the recurrent modules a trainer can build by name (``--memory``).

Every recurrent module class registers itself once, under the name users give to
``recurrl train --memory``, with the suffixes of its state keys. The trainer's model builder,
its config validation, the command line's choices and the sweep all read this registry, so a
new memory is one module file and one :func:`register_memory` call.

Examples:
    >>> from recurrl.modules.registry import memory_names, MEMORY_REGISTRY
    >>> sorted(memory_names())
    ['gru', 'lru', 'lstm', 'mingru', 'transformer']
    >>> MEMORY_REGISTRY["lstm"].state_suffixes
    ('h', 'c')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from recurrl.modules.recurrent import RecurrentModule

__all__ = ["MEMORY_REGISTRY", "Memory", "memory_names", "register_memory", "unregister_memory"]

#: The name of the feed-forward trunk (no memory): reserved, never a registered module.
FEED_FORWARD = "none"


@dataclass(frozen=True)
class Memory:
    """One entry of :data:`MEMORY_REGISTRY`.

    Attributes:
        name: what ``--memory`` (``ModelConfig.memory``) calls it.
        module: the :class:`~recurrl.modules.RecurrentModule` subclass; a trainer builds it as
            ``module(input_size, hidden_size, num_layers=..., recurrent_backend=...,
            in_keys=[input, *states], out_keys=[output, *(("next", s) for s in states)])``.
        state_suffixes: the names a trainer gives its state keys (``f"{trunk}_{suffix}"``),
            one per state of the module, in the module's order.
    """

    name: str
    module: type[RecurrentModule]
    state_suffixes: tuple[str, ...]

    @property
    def cell(self) -> str | None:
        """The cell kind the module runs (its ``RNNConfig.mode``); ``None`` for a memory that
        runs no cell kind (attention: :class:`~recurrl.modules.TransformerModule`)."""
        return self.module._mode

    def backend_refusal(self, backend: str) -> str | None:
        """Why this memory cannot run ``recurrent_backend=backend`` (``None`` if it can): the
        module's own rule where it has one (``memory_backend_refusal``), else the one of the
        cell kind's backends."""
        own = getattr(self.module, "memory_backend_refusal", None)
        if own is not None:
            return own(backend)
        from recurrl.functional.recurrent import backend_refusal

        return backend_refusal(backend, self.cell)


#: Every memory by name, in registration order (the built-ins: lstm, gru, mingru, lru).
MEMORY_REGISTRY: dict[str, Memory] = {}


def register_memory(
    name: str,
    module: type[RecurrentModule],
    state_suffixes: tuple[str, ...] | None = None,
    *,
    replace: bool = False,
) -> Memory:
    """Make ``module`` buildable as ``recurrl train --memory name``; returns the entry.

    Args:
        name: the ``--memory`` value (not ``"none"``, the feed-forward trunk).
        module: a :class:`~recurrl.modules.RecurrentModule` subclass.
        state_suffixes: one name per state (default: the module's default state keys with a
            ``recurrent_state_`` prefix removed).
        replace: allow replacing an existing entry of that name.

    Examples:
        >>> from recurrl.modules import GRUModule
        >>> register_memory("my_gru", GRUModule).state_suffixes
        ('recurrent_state',)
        >>> unregister_memory("my_gru")
    """
    from recurrl.modules.recurrent import RecurrentModule

    if not (isinstance(module, type) and issubclass(module, RecurrentModule)):
        raise TypeError(
            f"register_memory({name!r}, ...): module must be a RecurrentModule subclass, "
            f"received {module!r}. Fix: subclass recurrl.modules.RecurrentModule (see "
            f"docs/adding_a_cell.md)."
        )
    if name == FEED_FORWARD:
        raise ValueError(
            f"register_memory: {FEED_FORWARD!r} names the feed-forward trunk (no memory); "
            f"pick another name."
        )
    if name in MEMORY_REGISTRY and not replace:
        raise ValueError(
            f"register_memory: {name!r} is already registered (by "
            f"{MEMORY_REGISTRY[name].module.__name__}). Pick another name, or pass "
            f"replace=True."
        )
    defaults = module._default_state_keys
    if state_suffixes is None:
        state_suffixes = tuple(k.removeprefix("recurrent_state_") for k in defaults)
    state_suffixes = tuple(state_suffixes)
    if len(state_suffixes) != len(defaults) or len(set(state_suffixes)) != len(defaults):
        raise ValueError(
            f"register_memory({name!r}, {module.__name__}): state_suffixes must name each of "
            f"the module's {len(defaults)} states once ({list(defaults)}), received "
            f"{list(state_suffixes)}."
        )
    entry = Memory(name, module, state_suffixes)
    MEMORY_REGISTRY[name] = entry
    return entry


def unregister_memory(name: str) -> None:
    """Remove ``name`` from :data:`MEMORY_REGISTRY` (``KeyError`` naming the choices if absent)."""
    if name not in MEMORY_REGISTRY:
        raise KeyError(f"no memory {name!r} is registered; registered: {memory_names()}.")
    del MEMORY_REGISTRY[name]


def memory_names() -> tuple[str, ...]:
    """The registered memory names, in registration order (``"none"``, the feed-forward
    trunk, is not one of them)."""
    return tuple(MEMORY_REGISTRY)
