"""The TorchRL side of recurrl's envs: ``to_torchrl()`` conversions and TorchRL objects refused.

TorchRL is optional: it is imported here only when a conversion runs
(:func:`import_torchrl`), never when :mod:`recurrl` is imported. Objects that come from TorchRL
are recognised by the module their class is defined in (:func:`is_torchrl_object`), which
needs no import either.
"""

from __future__ import annotations

import importlib
from typing import Any

from recurrl.envs.specs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    OneHot,
    TensorSpec,
    Unbounded,
)

__all__ = ["import_torchrl", "is_torchrl_object", "refuse_torchrl_env", "spec_to_torchrl"]

#: The TorchRL release recurrl's interop is tested with (constraints-torchrl.txt).
TESTED_TORCHRL = "0.14.1"
_INSTALL = f'pip install "recurrl[torchrl]" (tested with torchrl=={TESTED_TORCHRL})'


def import_torchrl(submodule: str, owner: str) -> Any:
    """``torchrl.<submodule>``, imported now, or ``ImportError`` saying what to install.

    Args:
        submodule: e.g. ``"envs"`` or ``"data"``.
        owner: who needs it, for the message (e.g. ``"InitTracker.to_torchrl"``).
    """
    try:
        return importlib.import_module(f"torchrl.{submodule}")
    except ImportError as err:
        raise ImportError(
            f"{owner}: builds a TorchRL object and needs the optional package torchrl, which "
            f"could not be imported ({err}). Fix: {_INSTALL}."
        ) from err


def is_torchrl_object(obj: Any) -> bool:
    """Whether ``obj``'s class (or a base class) is defined in TorchRL (no import needed).

    Examples:
        >>> from recurrl.testing import CountingEnv
        >>> is_torchrl_object(CountingEnv())
        False
    """
    return any(
        (getattr(cls, "__module__", None) or "").split(".")[0] == "torchrl"
        for cls in type(obj).__mro__
    )


def refuse_torchrl_env(env: Any, owner: str) -> None:
    """``TypeError`` with the fix when ``env`` is a TorchRL env; nothing otherwise.

    recurrl's collectors and env wrappers run recurrl envs (:class:`~recurrl.envs.EnvBase`):
    their reset mask, specs and ``step_mdp`` follow recurrl's contract. A TorchRL env is an
    ``nn.Module`` and hence callable, so without this check it would be taken for an env
    factory and called.

    Examples:
        >>> from recurrl.testing import CountingEnv
        >>> refuse_torchrl_env(CountingEnv(), "Collector")  # a recurrl env: nothing raised
    """
    if not is_torchrl_object(env):
        return
    name = f"{type(env).__module__}.{type(env).__qualname__}"
    raise TypeError(
        f"{owner}: expected a recurrl env (recurrl.envs.EnvBase) or a callable returning one, "
        f"received the TorchRL env {name}. recurrl runs its own envs, whose reset masks, "
        f"specs and step_mdp its collectors rely on. Fix: build the env with recurrl "
        f"(e.g. recurrl.envs.GymEnv('CartPole-v1') for torchrl.envs.GymEnv('CartPole-v1')), "
        f"or keep the TorchRL env and collect with TorchRL's collector "
        f"(torchrl.collectors.SyncDataCollector), where recurrl's modules run as they are "
        f"(append transform.to_torchrl() of recurrl's env transforms to the TorchRL env)."
    )


def spec_to_torchrl(spec: TensorSpec, owner: str) -> Any:
    """The TorchRL spec (``torchrl.data``) equal to a recurrl spec: same class name, shape,
    dtype, device and bounds / categories; a :class:`~recurrl.envs.specs.Composite` entry by
    entry.

    Args:
        spec: a recurrl spec (Unbounded, Bounded, Categorical, OneHot, MultiCategorical,
            Binary or Composite).
        owner: who converts, for the messages.

    Raises:
        TypeError: a spec class without a TorchRL counterpart here.
    """
    data = import_torchrl("data", owner)
    common = {"shape": spec.shape, "device": spec.device, "dtype": spec.dtype}
    if isinstance(spec, Composite):
        out = data.Composite(shape=spec.shape, device=spec.device)
        for key in spec:  # the top-level entries
            out[key] = spec_to_torchrl(spec[key], owner)
        return out
    if isinstance(spec, Unbounded):
        return data.Unbounded(**common)
    if isinstance(spec, Bounded):
        return data.Bounded(low=spec.low.clone(), high=spec.high.clone(), **common)
    if isinstance(spec, Categorical):
        return data.Categorical(spec.n, **common)
    if isinstance(spec, OneHot):
        return data.OneHot(spec.n, **common)
    if isinstance(spec, MultiCategorical):
        return data.MultiCategorical(spec.nvec.clone(), **common)
    if isinstance(spec, Binary):
        return data.Binary(spec.n, **common)
    raise TypeError(
        f"{owner}: no TorchRL counterpart known for the spec {type(spec).__name__}. Fix: build "
        f"the TorchRL transform by hand with a torchrl.data spec."
    )
