"""What a policy needs from its env, found from its modules: ``is_init`` and its state keys.

A recurrent policy reads ``"is_init"`` (written by :class:`~recurrl.envs.InitTracker`) and its
hidden-state keys (declared, and zero-filled on reset, by a
:class:`~recurrl.envs.TensorDictPrimer`). Without them the hidden state is silently lost or
leaks across episodes.

The recurrent parts of a policy are found by the contract every memory obeys, not by class:
a submodule declares its state with ``recurrent_state_spec`` (state key -> ``(shape,
dtype)``, shapes without batch dims) and may build its own primer with
``make_tensordict_primer()``. This module is the one place that turns a policy into env
transforms:

* :func:`get_primers_from_module` and :func:`get_env_transforms_from_module` (the
  reference's functions, also importable from :mod:`recurrl.modules`, which calls them
  through :mod:`recurrl.modules._env_transforms`);
* :func:`missing_policy_transforms` and :func:`register_policy_transforms`: what an env
  lacks for a policy, appended or refused; used by the
  :class:`~recurrl.collectors.Collector` and by the ``policy=`` argument of every env
  constructor.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tensordict.utils import NestedKey, unravel_key
from torch import nn

from recurrl.envs._multiagent import agent_groups
from recurrl.envs.specs import Unbounded
from recurrl.envs.transforms.init_tracker import InitTracker
from recurrl.envs.transforms.primer import TensorDictPrimer
from recurrl.envs.transforms.transform import Compose, Transform, TransformedEnv
from recurrl.modules._env_transforms import (
    EnvTransformBuilders,
    register_env_transform_builders,
)

if TYPE_CHECKING:
    from recurrl.envs.common import EnvBase

__all__ = [
    "MissingPolicyTransformsError",
    "get_env_transforms_from_module",
    "get_primers_from_module",
    "missing_policy_transforms",
    "recurrent_parts",
    "register_policy_transforms",
]

INIT_KEY = "is_init"


# --- finding the recurrent parts ----------------------------------------------------------
def _primer_maker(module: nn.Module) -> Callable[[], Transform] | None:
    """How ``module`` makes its primer: its own ``make_tensordict_primer`` (which a subclass
    may override), else :meth:`TensorDictPrimer.from_module` when it declares its state;
    ``None`` for a module without recurrent state."""
    make = getattr(module, "make_tensordict_primer", None)
    if callable(make):
        return make
    if hasattr(module, "recurrent_state_spec"):
        return lambda: TensorDictPrimer.from_module(module)
    return None


def recurrent_parts(policy: Any) -> list[nn.Module]:
    """The submodules of ``policy`` that have recurrent state, in module order.

    A submodule has recurrent state when it declares it (``recurrent_state_spec``) or builds
    its own primer (``make_tensordict_primer()``), whatever its class. A policy that is not
    an ``nn.Module`` (a plain callable) has none.

    Examples:
        >>> from torch import nn
        >>> from recurrl.modules import GRUModule
        >>> gru = GRUModule(3, 4, in_key="obs", out_key="features")
        >>> recurrent_parts(nn.Sequential(nn.Linear(3, 3), gru)) == [gru]
        True
    """
    if not isinstance(policy, nn.Module):
        return []
    return [m for m in policy.modules() if _primer_maker(m) is not None]


# --- the primers and transforms of a policy -----------------------------------------------
def _primers(
    module: nn.Module, *, warn: bool, strict: bool, stacklevel: int
) -> TensorDictPrimer | Compose | None:
    """:func:`get_primers_from_module`, its warnings shown ``stacklevel`` frames up."""
    primers, failed = [], []
    for part in recurrent_parts(module):
        make = _primer_maker(part)
        if strict:
            primers.append(make())
            continue
        try:
            primers.append(make())
        except Exception as err:  # reported below, as strict=False asks
            failed.append(f"{type(part).__name__} ({type(err).__name__}: {err})")
    if failed:
        warnings.warn(
            f"get_primers_from_module(strict=False): make_tensordict_primer() failed for "
            f"{len(failed)} submodule(s), whose primers are left out: {'; '.join(failed)}. "
            f"Their state keys will be missing from the env; call it with strict=True to "
            f"see the full error.",
            UserWarning,
            stacklevel=stacklevel,
        )
    if not primers:
        if warn:
            warnings.warn(
                f"get_primers_from_module: no primer found in {type(module).__name__} (it "
                f"holds no LSTMModule/GRUModule or other module with make_tensordict_primer"
                f"()); returning None. Pass warn=False if that is expected.",
                UserWarning,
                stacklevel=stacklevel,
            )
        return None
    if len(primers) == 1:
        return primers[0]
    return Compose(*primers)


def get_primers_from_module(
    module: nn.Module, warn: bool = True, strict: bool = True
) -> TensorDictPrimer | Compose | None:
    """The primers every recurrent submodule of ``module`` needs, in module order.

    Every submodule with a ``make_tensordict_primer()`` method contributes its primer (a
    submodule that only describes its state with ``recurrent_state_spec`` contributes
    :meth:`TensorDictPrimer.from_module(sub) <recurrl.envs.TensorDictPrimer.from_module>`).
    Also importable from :mod:`recurrl.modules` and :mod:`recurrl.modules.utils`.

    Args:
        module: the policy (or any ``nn.Module``) to look through.
        warn: emit a ``UserWarning`` when ``module`` holds no recurrent module (a policy
            passed here usually should hold one). Default: True.
        strict: let an exception raised by a submodule's ``make_tensordict_primer()``
            propagate. With ``False`` such submodules are skipped, one ``UserWarning`` names
            their types, and the primers of the others are still returned. Default: True.

    Returns:
        ``None`` when no primer was made, the single ``TensorDictPrimer`` when there is
        one, and a ``Compose`` of them otherwise.

    Examples:
        >>> from tensordict.nn import TensorDictSequential as Seq
        >>> from torch import nn
        >>> from recurrl.modules import GRUModule, LSTMModule
        >>> policy = Seq(
        ...     LSTMModule(3, 8, in_key="obs", out_key="a"),
        ...     GRUModule(8, 4, in_keys=["a", "gru_h"], out_keys=["b", ("next", "gru_h")]),
        ... )
        >>> type(get_primers_from_module(policy)).__name__
        'Compose'
        >>> get_primers_from_module(nn.Linear(2, 2), warn=False) is None
        True
    """
    return _primers(module, warn=warn, strict=strict, stacklevel=3)


def get_env_transforms_from_module(module: nn.Module, init_key: NestedKey = "is_init") -> (
    Compose | InitTracker
):  # fmt: skip
    """The env transforms a policy needs: an ``InitTracker`` and its recurrent modules' primers.

    Also importable from :mod:`recurrl.modules` and :mod:`recurrl.modules.utils`.

    Append the result to the env (``TransformedEnv(base_env, transforms)`` or
    ``env.append_transform(transforms)``) so that ``init_key`` marks episode starts and the
    hidden states ride from step to step.

    Args:
        module: the policy; its recurrent submodules are found as by
            :func:`get_primers_from_module`.
        init_key: the key ``InitTracker`` writes. recurrl's recurrent modules read
            ``"is_init"``; another key raises ``ValueError`` when ``module`` holds one
            (they would never see a reset). Default: ``"is_init"``.

    Returns:
        ``Compose(InitTracker(init_key), *primers)`` when ``module`` holds recurrent
        modules, else the bare ``InitTracker``.

    Examples:
        >>> from torch import nn
        >>> from recurrl.modules import GRUModule
        >>> gru = GRUModule(4, 8, in_keys=["obs", "rs"], out_keys=["features", ("next", "rs")])
        >>> transforms = get_env_transforms_from_module(gru)
        >>> [type(t).__name__ for t in transforms]
        ['InitTracker', 'TensorDictPrimer']
        >>> type(get_env_transforms_from_module(nn.Linear(2, 2))).__name__
        'InitTracker'
    """
    readers = [
        type(part).__name__
        for part in recurrent_parts(module)
        if not _reads_init(getattr(part, "in_keys", [init_key]), init_key)
    ]
    if readers:
        raise ValueError(
            f"get_env_transforms_from_module: init_key={init_key!r} is not read by "
            f"{sorted(set(readers))}, which read 'is_init' to restart their hidden state; "
            f"with another key they would never see an episode start. Fix: keep the default "
            f"init_key='is_init'."
        )
    tracker = InitTracker(init_key=init_key)
    primers = get_primers_from_module(module, warn=False)
    if primers is None:
        return tracker
    return Compose(tracker, *(primers if isinstance(primers, Compose) else [primers]))


# --- what an env lacks for a policy -------------------------------------------------------
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


def _declared(env: EnvBase) -> set[NestedKey]:
    keys = env.observation_spec.keys(include_nested=True, leaves_only=True)
    keys += env.state_spec.keys(include_nested=True, leaves_only=True)
    return {unravel_key(k) for k in keys}


def missing_policy_transforms(env: EnvBase, policy: Any) -> list[Transform]:
    """The transforms ``env`` lacks for ``policy``: an InitTracker and/or one primer.

    The policy's state keys are those its recurrent parts declare (``recurrent_state_spec``;
    a part that only builds its own primer declares none and is left to the caller). A key
    counts as present when the env declares it in its observation or state spec (whoever
    put it there), so an env wired by hand or by another collector gets nothing.

    Returns:
        ``[]``, ``[InitTracker()]``, ``[primer]`` or ``[InitTracker(), primer]``, where the
        primer covers exactly the missing state keys of every recurrent part.
    """
    states = [
        state
        for part in recurrent_parts(policy)
        if isinstance(state := getattr(part, "recurrent_state_spec", None), Mapping)
    ]
    if not states:
        return []
    declared = _declared(env)
    missing: list[Transform] = []
    if INIT_KEY not in declared:
        missing.append(InitTracker(INIT_KEY))
    _check_group_inits(env, policy, declared)
    specs: dict[NestedKey, Unbounded] = {}
    for state in states:
        for key, (shape, dtype) in state.items():
            key = unravel_key(key)
            if key not in declared and key not in specs:
                specs[key] = Unbounded(shape=shape, dtype=dtype, device=env.device)
    if specs:
        # expand_specs=True: the state shape [num_layers, H] is always per env, even when
        # num_layers happens to equal the env batch size.
        missing.append(TensorDictPrimer(specs, expand_specs=True))
    return missing


def _reads_init(in_keys: Any, init_key: NestedKey) -> bool:
    """Whether ``in_keys`` hold ``init_key`` or an agent group's ``(group, init_key)``."""
    keys = [unravel_key(k) for k in in_keys]
    init = unravel_key(init_key)
    return any(k == init or (isinstance(k, tuple) and k[-1] == init) for k in keys)


def _check_group_inits(env: EnvBase, policy: Any, declared: set[NestedKey]) -> None:
    """A recurrent part reading an agent group's ``(group, "is_init")`` needs an env with
    that group: an ``InitTracker`` writes it for every group of the env (see
    :class:`~recurrl.envs.InitTracker`), so it is refused by name when the env has none."""
    groups = agent_groups(env.observation_spec, len(env.batch_size))
    for part in recurrent_parts(policy):
        for key in map(unravel_key, getattr(part, "in_keys", [])):
            if not (isinstance(key, tuple) and len(key) == 2 and key[-1] == INIT_KEY):
                continue
            if key not in declared and key[0] not in groups:
                raise ValueError(
                    f"{type(part).__name__} reads {key!r}, the per-agent is_init of agent "
                    f"group {key[0]!r}, but the env has no such group (its agent groups: "
                    f"{sorted(groups)}; a group is a sub-TensorDict [*B, n_agents] with a "
                    f"'mask'). Fix: build the module with the env's group key, or use a "
                    f"multi-agent env (recurrl.envs.make_multiagent_env)."
                )


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
        policy: the policy (its recurrent parts are looked up in it).
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


# The modules' names for these (make_tensordict_primer, recurrl.modules.get_primers_from_module,
# ...) call them through the modules layer's registry: recurrl.modules does not import envs.
register_env_transform_builders(
    EnvTransformBuilders(
        primer=TensorDictPrimer.from_module,
        primers=_primers,
        env_transforms=get_env_transforms_from_module,
    )
)
