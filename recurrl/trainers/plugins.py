"""Plugins: user modules that register memories, cells or backends before the CLI starts.

``recurrl train --memory NAME`` and ``--recurrent-backend NAME`` accept what the registries
hold (:func:`~recurrl.modules.register_memory`,
:func:`~recurrl.functional.recurrent.cell.register_cell_kind`,
:func:`~recurrl.functional.recurrent.register_recurrent_backend`). A module of your own that
registers at import reaches the command line in one of two ways, both read by every
``recurrl`` command before it parses its options (and so by the runs a sweep starts, which
inherit the environment):

* ``RECURRL_PLUGINS=my_cells,my_backends recurrl train --memory elman``: comma-separated
  module names, imported in order;
* an installed package's entry point in the group ``recurrl.plugins`` (in its
  ``pyproject.toml``: ``[project.entry-points."recurrl.plugins"] my_cells = "my_cells"``).
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points

from recurrl.trainers.errors import UsageError

__all__ = ["ENTRY_POINT_GROUP", "ENV_VAR", "load_plugins"]

#: The environment variable naming plugin modules (comma-separated).
ENV_VAR = "RECURRL_PLUGINS"
#: The entry-point group of installed plugins.
ENTRY_POINT_GROUP = "recurrl.plugins"

_loaded: list[str] = []


def load_plugins() -> list[str]:
    """Import the plugin modules (:data:`ENV_VAR`, then the :data:`ENTRY_POINT_GROUP` entry
    points), each once per process; returns the names imported so far.

    Raises:
        UsageError: a plugin cannot be imported (its name, where it was named, the error and
            the fix).

    Examples:
        >>> import os
        >>> os.environ["RECURRL_PLUGINS"] = "json"  # any importable module
        >>> "json" in load_plugins()
        True
        >>> del os.environ["RECURRL_PLUGINS"]
    """
    named = [n.strip() for n in os.environ.get(ENV_VAR, "").split(",") if n.strip()]
    for name in named:
        if name in _loaded:
            continue
        try:
            importlib.import_module(name)
        except Exception as err:  # any failure of the user's module: said with its origin
            raise UsageError(
                f"{ENV_VAR} names the module {name!r}, which cannot be imported: "
                f"{type(err).__name__}: {err}. Fix: make it importable (on PYTHONPATH or "
                f"installed) or remove it from {ENV_VAR}."
            ) from err
        _loaded.append(name)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.value in _loaded:
            continue
        try:
            entry.load()
        except Exception as err:
            raise UsageError(
                f"the installed plugin {entry.name!r} (entry point {entry.value!r} in the "
                f"group {ENTRY_POINT_GROUP!r}) cannot be loaded: {type(err).__name__}: "
                f"{err}. Fix: repair or uninstall the package that declares it."
            ) from err
        _loaded.append(entry.value)
    return list(_loaded)
