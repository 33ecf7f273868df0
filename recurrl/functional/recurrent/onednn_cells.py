"""Moved to :mod:`recurrl.functional.recurrent.pad.onednn_cells` (one ``pad`` subpackage).

The old import path stays an alias: every name is looked up in the new module.
"""

from typing import Any

from recurrl.functional.recurrent.pad import onednn_cells as _moved

__all__ = list(getattr(_moved, "__all__", ()))


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
