"""Moved to :mod:`recurrl.functional.recurrent.pad.flush` (one ``pad`` subpackage).

The old import path stays an alias: every name is looked up in the new module.
"""

from typing import Any

from recurrl.functional.recurrent.pad import flush as _moved

__all__ = list(getattr(_moved, "__all__", ()))


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
