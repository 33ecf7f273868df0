"""The ``policy=`` argument every env constructor takes (handled by EnvBase's metaclass).

``SomeEnv(..., policy=policy)`` builds the env with the other arguments, then adds what a
recurrent ``policy`` needs from its env: an :class:`~recurrl.envs.InitTracker` (``is_init``)
and a :class:`~recurrl.envs.TensorDictPrimer` for its state keys, exactly the wiring the
:class:`~recurrl.collectors.Collector` does with ``auto_register_policy_transforms=True``
(one implementation: :func:`recurrl.envs.transforms.from_module.register_policy_transforms`).
"""

from __future__ import annotations

import abc
from typing import Any

__all__ = ["with_policy_transforms"]


def with_policy_transforms(env: Any, policy: Any) -> Any:
    """``env`` with the transforms a recurrent ``policy`` needs.

    Args:
        env: the env just built (an :class:`~recurrl.envs.EnvBase`).
        policy: the policy; ``None``, or a policy without recurrent submodules, leaves
            ``env`` as it is.

    Returns:
        ``env`` itself when nothing is missing (no recurrent submodule, or the keys are
        already declared) or when ``env`` is a ``TransformedEnv`` (extended in place);
        otherwise a new ``TransformedEnv`` around ``env`` holding exactly the missing
        ``InitTracker`` and/or primer.

    Raises:
        TypeError: ``policy`` is not callable.
    """
    if policy is None:
        return env
    if not callable(policy):
        raise TypeError(
            f"{type(env).__name__}(policy=...): expected the policy (a callable TensorDict -> "
            f"TensorDict, e.g. a TensorDictModule), received {type(policy).__name__}."
        )
    # Imported here, as EnvBase.append_transform imports TransformedEnv: the transforms
    # subclass EnvBase, whose metaclass this module defines.
    from recurrl.envs.transforms.from_module import register_policy_transforms

    return register_policy_transforms(env, policy, auto=True)


class _EnvMeta(abc.ABCMeta):
    """Metaclass of :class:`~recurrl.envs.EnvBase`: takes the ``policy=`` keyword of every
    env constructor (it never reaches ``__init__``) and applies
    :func:`with_policy_transforms` to the env built."""

    def __call__(cls, *args: Any, policy: Any = None, **kwargs: Any) -> Any:
        env = super().__call__(*args, **kwargs)
        return with_policy_transforms(env, policy)
