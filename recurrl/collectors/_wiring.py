"""Make an env carry what a recurrent policy needs: ``is_init`` and its hidden-state keys.

A recurrent policy reads ``"is_init"`` (written by :class:`~recurrl.envs.InitTracker`) and
its state keys (declared and zero-filled on reset by a
:class:`~recurrl.envs.TensorDictPrimer`). Without them the hidden state is silently lost or
leaks across episodes, so the collector either appends what is missing (default) or refuses
to start.
"""

from __future__ import annotations

from typing import Any

from tensordict import NestedKey, unravel_key
from torch import nn

from recurrl.envs import (
    Compose,
    EnvBase,
    InitTracker,
    TensorDictPrimer,
    Transform,
    TransformedEnv,
    Unbounded,
)
from recurrl.modules import RecurrentModule

__all__ = [
    "MissingPolicyTransformsError",
    "missing_policy_transforms",
    "register_policy_transforms",
]

INIT_KEY = "is_init"


class MissingPolicyTransformsError(ValueError, KeyError):
    """A recurrent policy's env lacks ``is_init`` (an InitTracker) or a state key (a primer).

    Raised by the :class:`~recurrl.collectors.Collector` with
    ``auto_register_policy_transforms=False``. It is a ``ValueError`` (recurrl's error for a
    wrong setup) and a ``KeyError`` (what the reference raises there: the policy misses the
    key), so either ``except`` catches it. Its ``str()`` is the message as written (a plain
    ``KeyError`` would print it within quotes).
    """

    def __str__(self) -> str:
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


def recurrent_submodules(policy: Any) -> list[RecurrentModule]:
    """The :class:`RecurrentModule` instances inside ``policy`` (empty for non-modules)."""
    if not isinstance(policy, nn.Module):
        return []
    return [m for m in policy.modules() if isinstance(m, RecurrentModule)]


def _declared(env: EnvBase) -> set[NestedKey]:
    keys = env.observation_spec.keys(include_nested=True, leaves_only=True)
    keys += env.state_spec.keys(include_nested=True, leaves_only=True)
    return {unravel_key(k) for k in keys}


def missing_policy_transforms(env: EnvBase, policy: Any) -> list[Transform]:
    """The transforms ``env`` lacks for ``policy``: an InitTracker and/or one primer.

    A key counts as present when the env declares it in its observation or state spec
    (whoever put it there), so an env wired by hand or by another collector gets nothing.

    Returns:
        ``[]``, ``[InitTracker()]``, ``[primer]`` or ``[InitTracker(), primer]``, where the
        primer covers exactly the missing state keys of every recurrent submodule.
    """
    modules = recurrent_submodules(policy)
    if not modules:
        return []
    declared = _declared(env)
    missing: list[Transform] = []
    if INIT_KEY not in declared:
        missing.append(InitTracker(INIT_KEY))
    specs: dict[NestedKey, Unbounded] = {}
    for module in modules:
        for key, (shape, dtype) in module.recurrent_state_spec.items():
            key = unravel_key(key)
            if key not in declared and key not in specs:
                specs[key] = Unbounded(shape=shape, dtype=dtype, device=env.device)
    if specs:
        # expand_specs=True: the state shape [num_layers, H] is always per env, even when
        # num_layers happens to equal the env batch size.
        missing.append(TensorDictPrimer(specs, expand_specs=True))
    return missing


def _describe(transforms: list[Transform]) -> str:
    parts = []
    for t in transforms:
        if isinstance(t, InitTracker):
            parts.append(f"an InitTracker (key {INIT_KEY!r})")
        else:
            parts.append(f"a TensorDictPrimer for the state keys {t.out_keys}")
    return " and ".join(parts)


def register_policy_transforms(env: EnvBase, policy: Any, *, auto: bool) -> EnvBase:
    """Return ``env`` with the transforms ``policy`` needs (appended in place when possible).

    Args:
        env: the env to check.
        policy: the policy (recurrent submodules are looked up in it).
        auto: append what is missing (a ``TransformedEnv`` is extended in place, any other
            env is wrapped in a new one); with ``False`` raise instead.

    Raises:
        MissingPolicyTransformsError: ``auto=False`` and something is missing (the message
            names the missing keys and the fix); a ``ValueError`` and a ``KeyError``.
    """
    missing = missing_policy_transforms(env, policy)
    if not missing:
        return env
    if not auto:
        raise MissingPolicyTransformsError(
            f"Collector: the policy has recurrent submodules, but the env lacks "
            f"{_describe(missing)}; without them the hidden state is silently reset or "
            f"leaks across episodes. Fix: pass auto_register_policy_transforms=True, build "
            f"the env with policy=policy (e.g. GymEnv(name, policy=policy)), or append "
            f"them yourself: env = env.append_transform(InitTracker()) and "
            f"env = env.append_transform(get_primers_from_module(policy))."
        )
    if isinstance(env, TransformedEnv):
        for transform in missing:
            env.append_transform(transform)
        return env
    return TransformedEnv(env, Compose(*missing))
