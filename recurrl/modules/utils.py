"""Documented aliases: the env transforms a policy needs are built in :mod:`recurrl.envs`.

``get_primers_from_module`` and ``get_env_transforms_from_module`` live in
:mod:`recurrl.envs.transforms.from_module` (also exported by :mod:`recurrl.envs`): the
modules describe their state, the env side builds the transforms. They stay importable from
here (and from :mod:`recurrl.modules`), where the reference library has them; the env package
is imported on first access to either name, not when :mod:`recurrl.modules` is imported.

Examples:
    >>> from recurrl.modules.utils import get_primers_from_module
    >>> from recurrl.envs import get_primers_from_module as from_envs
    >>> get_primers_from_module is from_envs
    True
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recurrl.envs.transforms.from_module import (
        get_env_transforms_from_module,
        get_primers_from_module,
    )

__all__ = ["get_env_transforms_from_module", "get_primers_from_module"]

_HOME = "recurrl.envs.transforms.from_module"


def __getattr__(name: str) -> Any:
    # PEP 562: resolved on first access, so `import recurrl.modules` leaves recurrl.envs alone.
    if name in __all__:
        return getattr(importlib.import_module(_HOME), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
