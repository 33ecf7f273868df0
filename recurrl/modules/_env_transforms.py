"""The env transforms a policy needs, as the env layer builds them.

``module.make_tensordict_primer()``, ``get_primers_from_module`` and
``get_env_transforms_from_module`` are names of the modules (the reference library has them
there), but what they return, a ``TensorDictPrimer``, an ``InitTracker`` or a ``Compose``,
are env transforms, defined by :mod:`recurrl.envs`, the layer above this one. So the
dependency is inverted: the env layer hands its builders to this module when it is imported
(:func:`register_env_transform_builders`, called by
``recurrl/envs/transforms/from_module.py``, where the builders are written once), and these
names call them. :mod:`recurrl.modules` never imports :mod:`recurrl.envs`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

__all__ = [
    "EnvTransformBuilders",
    "env_transform_builders",
    "register_env_transform_builders",
]


@dataclass(frozen=True)
class EnvTransformBuilders:
    """What the env layer builds for a policy: one module's primer, a policy's primers, and
    a policy's env transforms (``InitTracker`` and primers)."""

    #: ``primer(module)``: the ``TensorDictPrimer`` of one module that declares its state
    primer: Callable[[nn.Module], Any]
    #: ``primers(module, warn=, strict=, stacklevel=)``: ``get_primers_from_module``, warning
    #: ``stacklevel`` frames up from itself
    primers: Callable[..., Any]
    #: ``env_transforms(module, init_key=)``: ``get_env_transforms_from_module``
    env_transforms: Callable[..., Any]


_registered: EnvTransformBuilders | None = None


def register_env_transform_builders(builders: EnvTransformBuilders) -> None:
    """Make ``builders`` the ones the modules call (the env layer does, on import)."""
    global _registered
    _registered = builders


def env_transform_builders(caller: str) -> EnvTransformBuilders:
    """The registered builders.

    Args:
        caller: what asks for them (``"LSTMModule.make_tensordict_primer()"``), for the error.

    Raises:
        RuntimeError: nothing is registered: :mod:`recurrl.envs` was not imported in this
            process (every use of an env imports it).
    """
    if _registered is None:
        raise RuntimeError(
            f"{caller}: the env transforms (TensorDictPrimer, InitTracker) are built by "
            f"recurrl.envs, which this process has not imported (recurrl.modules does not "
            f"import the env layer above it; the env layer registers its builders here when "
            f"it is imported). Fix: import recurrl.envs first, e.g. `from recurrl.envs import "
            f"TransformedEnv`."
        )
    return _registered
