"""The env transforms a policy needs, under the names the reference library gives them here.

The transforms are env transforms, built by :mod:`recurrl.envs`
(:mod:`recurrl.envs.transforms.from_module`, also exported by :mod:`recurrl.envs`), the layer
above this one: these functions call the builders the env layer registers when it is
imported, so importing :mod:`recurrl.modules` does not import :mod:`recurrl.envs`.

Examples:
    >>> import recurrl.envs  # registers the builders (any use of an env imports it)
    >>> from recurrl.modules import GRUModule
    >>> from recurrl.modules.utils import get_primers_from_module
    >>> gru = GRUModule(3, 4, in_key="obs", out_key="features")
    >>> get_primers_from_module(gru)
    TensorDictPrimer(keys=['recurrent_state'], default_value=0.0)
"""

from __future__ import annotations

from typing import Any

from tensordict.utils import NestedKey
from torch import nn

from recurrl.modules._env_transforms import env_transform_builders

__all__ = ["get_env_transforms_from_module", "get_primers_from_module"]


def get_primers_from_module(module: nn.Module, warn: bool = True, strict: bool = True) -> Any:
    """The ``TensorDictPrimer`` every recurrent submodule of ``module`` needs, in module order.

    :func:`recurrl.envs.get_primers_from_module`, which documents it in full.

    Args:
        module: the policy (or any ``nn.Module``) to look through.
        warn: emit a ``UserWarning`` when ``module`` holds no recurrent module. Default: True.
        strict: let an exception raised by a submodule's ``make_tensordict_primer()``
            propagate; with ``False`` skip such submodules with one ``UserWarning``.
            Default: True.

    Returns:
        ``None`` when no primer was made, the single ``TensorDictPrimer`` when there is
        one, and a ``Compose`` of them otherwise.

    Raises:
        RuntimeError: :mod:`recurrl.envs` was never imported in this process.
    """
    builders = env_transform_builders("get_primers_from_module")
    # stacklevel 3: a warning points at the caller of this function
    return builders.primers(module, warn=warn, strict=strict, stacklevel=3)


def get_env_transforms_from_module(module: nn.Module, init_key: NestedKey = "is_init") -> Any:
    """The env transforms a policy needs: an ``InitTracker`` and its recurrent modules' primers.

    :func:`recurrl.envs.get_env_transforms_from_module`, which documents it in full.

    Args:
        module: the policy.
        init_key: the key ``InitTracker`` writes; recurrl's recurrent modules read
            ``"is_init"`` (another key raises ``ValueError`` when ``module`` holds one).
            Default: ``"is_init"``.

    Returns:
        ``Compose(InitTracker(init_key), *primers)`` when ``module`` holds recurrent
        modules, else the bare ``InitTracker``.

    Raises:
        RuntimeError: :mod:`recurrl.envs` was never imported in this process.
    """
    builders = env_transform_builders("get_env_transforms_from_module")
    return builders.env_transforms(module, init_key=init_key)
