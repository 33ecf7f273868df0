"""EnvCreator: a picklable env factory that knows its env's specs without running it.

A batched env needs the specs of its sub-envs in the main process (to stack them and, for
:class:`~recurrl.envs.ParallelEnv`, to allocate the shared-memory buffers) before any
worker runs, and it needs to send the factory to worker processes, which plain pickling
refuses for lambdas and local functions. :class:`EnvCreator` builds the env once in this
process, keeps its :class:`EnvMetaData` (specs, batch size, device), closes it, and
pickles its function with ``cloudpickle`` (a dependency of gymnasium).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from recurrl.envs.common import EnvBase
from recurrl.envs.specs import Composite

try:  # gymnasium depends on cloudpickle, so it is normally there
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - then the function itself must pickle
    _pickler = pickle

__all__ = ["EnvCreator", "EnvMetaData"]

#: The spec groups an env declares (the names of ``EnvBase``'s spec properties).
SPEC_NAMES = ("observation", "state", "action", "reward", "done")


@dataclass(frozen=True)
class EnvMetaData:
    """What a batched env needs to know about a sub-env without running it.

    Attributes:
        specs: spec group name (:data:`SPEC_NAMES`) -> a copy of the env's Composite.
        batch_size: the env's batch size.
        device: the env's device.
        env_type: the env's class name (for error messages).
    """

    specs: dict[str, Composite]
    batch_size: torch.Size
    device: torch.device
    env_type: str

    @classmethod
    def from_env(cls, env: EnvBase) -> EnvMetaData:
        """Read the metadata of a built env (its specs are copied)."""
        specs = {name: env._get_spec(name).clone() for name in SPEC_NAMES}
        return cls(specs, torch.Size(env.batch_size), env.device, type(env).__name__)

    def differences(self, other: EnvMetaData) -> list[str]:
        """Human-readable list of what differs from ``other`` (empty when they match)."""
        out = []
        if self.batch_size != other.batch_size:
            out.append(f"batch_size {tuple(self.batch_size)} vs {tuple(other.batch_size)}")
        if self.device != other.device:
            out.append(f"device {self.device} vs {other.device}")
        for name in SPEC_NAMES:
            if self.specs[name] != other.specs[name]:
                out.append(f"{name}_spec {self.specs[name]} vs {other.specs[name]}")
        return out


def build_env(fn: Callable[..., Any], kwargs: Mapping[str, Any], owner: str) -> EnvBase:
    """``fn(**kwargs)``, checked to be a recurrl env."""
    env = fn(**kwargs)
    if not isinstance(env, EnvBase):
        raise TypeError(
            f"{owner}: the env function returned {type(env).__name__}, expected a recurrl "
            f"EnvBase. Fix: return e.g. GymEnv('CartPole-v1') (wrap gymnasium envs with "
            f"recurrl.envs.GymEnv)."
        )
    return env


class EnvCreator:
    """A picklable env factory whose env specs are known in this process.

    At construction the env is built once here (``create_env_fn(**create_env_kwargs)``),
    its metadata (specs, batch size, device) is kept and the env is closed. Each call then
    builds a fresh env. The function is pickled with ``cloudpickle``, so lambdas and local
    functions can be sent to worker processes (e.g. by :class:`~recurrl.envs.ParallelEnv`,
    which reads the specs from :attr:`meta_data` instead of building an env itself).

    Args:
        create_env_fn: a callable returning a recurrl :class:`~recurrl.envs.EnvBase`.
        create_env_kwargs: keyword arguments of every call of ``create_env_fn``.

    Examples:
        >>> import pickle
        >>> from recurrl.envs import GymEnv
        >>> creator = EnvCreator(lambda: GymEnv("CartPole-v1"))
        >>> creator.meta_data.specs["observation"]["observation"].shape
        torch.Size([4])
        >>> env = pickle.loads(pickle.dumps(creator))()  # trusted: own object, a lambda inside
        >>> env.reset()["observation"].shape
        torch.Size([4])
    """

    def __init__(
        self,
        create_env_fn: Callable[..., EnvBase],
        create_env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(create_env_fn, EnvBase) or not callable(create_env_fn):
            raise TypeError(
                f"EnvCreator: expected a callable returning an env, received "
                f"{type(create_env_fn).__name__}. Fix: pass the function that builds the env "
                f"(e.g. lambda: GymEnv('CartPole-v1')), not an env."
            )
        if create_env_kwargs is not None and not isinstance(create_env_kwargs, Mapping):
            raise TypeError(
                f"EnvCreator: expected create_env_kwargs a dict, received "
                f"{type(create_env_kwargs).__name__}."
            )
        self.create_env_fn = create_env_fn
        self.create_env_kwargs: dict[str, Any] = dict(create_env_kwargs or {})
        env = build_env(create_env_fn, self.create_env_kwargs, "EnvCreator")
        try:
            self.meta_data = EnvMetaData.from_env(env)
        finally:
            env.close()

    def __call__(self, **kwargs: Any) -> EnvBase:
        """A new env: ``create_env_fn(**{**create_env_kwargs, **kwargs})``."""
        return build_env(self.create_env_fn, {**self.create_env_kwargs, **kwargs}, "EnvCreator")

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        try:
            state["create_env_fn"] = _pickler.dumps(self.create_env_fn)
        except Exception as err:
            raise TypeError(
                f"EnvCreator: the env function {self.create_env_fn!r} cannot be pickled "
                f"({err}). Fix: use a module-level function or a functools.partial of one."
            ) from err
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Only ever our own pickles, sent to our own worker processes.
        state["create_env_fn"] = pickle.loads(state["create_env_fn"])  # trusted: our own bytes
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return (
            f"EnvCreator({self.create_env_fn!r}, create_env_kwargs={self.create_env_kwargs}, "
            f"env_type={self.meta_data.env_type})"
        )
