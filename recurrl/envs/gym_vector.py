"""GymVecEnv: N gymnasium envs (sync or async vector env) as one env of batch ``[N]``.

Autoreset: gymnasium's vector envs reset finished sub-envs on their own by default (on
the next ``step`` call, or within the same step); either way the observation returned
for a finished env is not the one recurrl expects at that point. We build the vector env
with ``autoreset_mode=AutoresetMode.DISABLED`` and turn ``env.reset(td)`` with a
``"_reset"`` mask into ``envs.reset(options={"reset_mask": mask})``, so a recurrl partial
reset is exactly one gymnasium partial reset: ``("next", "observation")`` of a finished
env is its terminal observation, and the reset observation appears at the next root.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.vector.async_vector_env import AsyncState
from tensordict import TensorDictBase

from recurrl.envs.common import EnvBase
from recurrl.envs.gym import GymEnv, import_env_package, tensor_to_numpy
from recurrl.envs.utils import get_reset_mask, reset_mask_any_all

__all__ = ["GymVecEnv"]

_VECTORIZATIONS = ("sync", "async")


class _RemoteTraceback(Exception):
    """Carries a worker's formatted traceback as the ``__cause__`` of the re-raised error.

    The pattern of ``concurrent.futures.process``: Python prints it above the error.
    """

    def __init__(self, traceback_text: str) -> None:
        super().__init__(traceback_text)
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        return self.traceback_text


class _AsyncVectorEnv(AsyncVectorEnv):
    """AsyncVectorEnv whose worker errors keep the worker's traceback.

    Gymnasium only logs the worker traceback and raises ``type(err)(err)`` in the main
    process; we raise the worker's exception with the traceback attached as its cause.
    """

    def _raise_if_errors(self, successes: Iterable[bool]) -> None:
        successes = list(successes)
        if all(successes):
            return
        errors = [self.error_queue.get() for _ in range(len(successes) - sum(successes))]
        for index, *_ in errors:  # the worker has exited; forget its pipe (as gymnasium)
            self.parent_pipes[index].close()
            self.parent_pipes[index] = None
        self._state = AsyncState.DEFAULT
        index, exc_type, value, trace = errors[-1]
        exc = value if isinstance(value, BaseException) else exc_type(value)
        raise exc from _RemoteTraceback(f"\n\nTraceback in gymnasium worker {index}:\n{trace}")


def _make_vector(
    env_id: str,
    num_envs: int,
    vectorization: str,
    vector_kwargs: dict[str, Any],
    make_kwargs: dict[str, Any],
) -> VectorEnv:
    import_env_package(env_id)
    try:
        gymnasium.spec(env_id)
    except gymnasium.error.Error as err:
        raise ValueError(
            f"GymVecEnv: gymnasium env id {env_id!r} was not found ({err}). List the "
            f"registered ids with gymnasium.pprint_registry()."
        ) from err
    env_fns = [functools.partial(gymnasium.make, env_id, **make_kwargs)] * num_envs
    kwargs = {**vector_kwargs, "autoreset_mode": AutoresetMode.DISABLED}
    if vectorization == "sync":
        return SyncVectorEnv(env_fns, **kwargs)
    return _AsyncVectorEnv(env_fns, **kwargs)


class GymVecEnv(GymEnv):
    """``num_envs`` copies of a gymnasium env, stepped together: batch ``[num_envs]``.

    ``GymEnv(env_id, num_envs=N, ...)`` returns this class. Specs are those of one env
    (``single_observation_space`` / ``single_action_space``) expanded to ``[N]``; keys and
    conversions are those of :class:`~recurrl.envs.GymEnv`.

    Partial resets map 1:1 to gymnasium's: the vector env runs with
    ``autoreset_mode=DISABLED`` and ``env.reset(td)`` with ``"_reset"`` calls
    ``envs.reset(options={"reset_mask": mask})``, resetting only those sub-envs. A
    finished sub-env must be reset before the next step (``rollout`` does it); stepping it
    raises an error naming it.

    Seeding: ``seed`` (or :meth:`set_seed`) is passed to the next reset; sub-env ``i`` gets
    ``seed + i``. Random actions use torch's global RNG.

    Args:
        env_name_or_instance: a registered env id, or a gymnasium ``VectorEnv`` built with
            ``autoreset_mode=AutoresetMode.DISABLED``.
        num_envs: number of sub-envs (required with an env id).
        vectorization: ``"sync"`` (all sub-envs in this process) or ``"async"`` (one worker
            process per sub-env; a worker's exception is re-raised here with the worker
            traceback as its ``__cause__``). :meth:`close` stops the workers.
        vector_kwargs: more arguments of ``SyncVectorEnv`` / ``AsyncVectorEnv`` (e.g.
            ``context``, ``shared_memory``); ``autoreset_mode`` is fixed.
        device: device of the tensors written.
        categorical_action_encoding: see :class:`~recurrl.envs.GymEnv`.
        seed: optional seed for the first reset.
        **make_kwargs: passed to ``gymnasium.make`` for every sub-env.

    Examples:
        >>> env = GymEnv("CartPole-v1", num_envs=3, seed=0)
        >>> type(env).__name__, env.batch_size
        ('GymVecEnv', torch.Size([3]))
        >>> env.observation_spec["observation"].shape, env.action_spec.shape
        (torch.Size([3, 4]), torch.Size([3]))
        >>> data = env.rollout(40, break_when_any_done=False)
        >>> data.batch_size
        torch.Size([3, 40])
        >>> env.close()
    """

    def __init__(
        self,
        env_name_or_instance: str | VectorEnv,
        *,
        num_envs: int | None = None,
        vectorization: str = "sync",
        vector_kwargs: dict[str, Any] | None = None,
        device: torch.device | str = "cpu",
        categorical_action_encoding: bool = True,
        seed: int | None = None,
        **make_kwargs: Any,
    ) -> None:
        if vectorization not in _VECTORIZATIONS:
            raise ValueError(
                f"GymVecEnv: expected vectorization in {_VECTORIZATIONS}, received "
                f"{vectorization!r}."
            )
        vector_kwargs = dict(vector_kwargs or {})
        if "autoreset_mode" in vector_kwargs:
            raise ValueError(
                "GymVecEnv: autoreset_mode is fixed to AutoresetMode.DISABLED (recurrl resets "
                "finished envs itself, through env.reset(td) with '_reset'); remove it."
            )
        envs = self._vector_env(
            env_name_or_instance, num_envs, vectorization, vector_kwargs, make_kwargs
        )
        EnvBase.__init__(self, device=device, batch_size=(envs.num_envs,))
        self._env = envs
        self.vectorization = vectorization if isinstance(env_name_or_instance, str) else None
        self._env_name = (
            env_name_or_instance
            if isinstance(env_name_or_instance, str)
            else type(envs.unwrapped).__name__
        )
        self._needs_reset = np.zeros(envs.num_envs, dtype=bool)
        self._setup(
            envs.single_observation_space,
            envs.single_action_space,
            categorical_action_encoding,
            seed,
        )

    @staticmethod
    def _vector_env(
        env: str | VectorEnv,
        num_envs: int | None,
        vectorization: str,
        vector_kwargs: dict[str, Any],
        make_kwargs: dict[str, Any],
    ) -> VectorEnv:
        if isinstance(env, str):
            if num_envs is None or int(num_envs) < 1:
                raise ValueError(f"GymVecEnv: expected num_envs >= 1, received {num_envs}.")
            return _make_vector(env, int(num_envs), vectorization, vector_kwargs, make_kwargs)
        if not isinstance(env, VectorEnv):
            raise TypeError(
                f"GymVecEnv: expected a gymnasium env id (str) or a gymnasium VectorEnv, "
                f"received {type(env).__name__}."
            )
        if make_kwargs or vector_kwargs or num_envs not in (None, env.num_envs):
            raise TypeError(
                "GymVecEnv: with a VectorEnv instance, pass no make/vector keyword arguments "
                "and num_envs=None (or the instance's num_envs)."
            )
        mode = env.metadata.get("autoreset_mode")
        if mode != AutoresetMode.DISABLED:
            raise ValueError(
                f"GymVecEnv: the VectorEnv has autoreset_mode {mode}, expected "
                f"AutoresetMode.DISABLED (recurrl resets finished envs itself). Fix: build it "
                f"with autoreset_mode=gymnasium.vector.AutoresetMode.DISABLED, or pass the "
                f"env id and num_envs."
            )
        return env

    @property
    def num_envs(self) -> int:
        """Number of sub-envs (``batch_size[0]``)."""
        return self.batch_size[0]

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        mask = get_reset_mask(tensordict, self.batch_size)
        options = dict(kwargs.pop("options", None) or {})
        reset: Any = slice(None)  # every sub-env
        if mask is not None and not reset_mask_any_all(mask)[1]:
            # EnvBase never calls _reset with an all-False mask (gymnasium rejects it).
            reset = mask.cpu().numpy().astype(np.bool_)
            options["reset_mask"] = reset
        obs, _info = self._env.reset(seed=self._take_seed(), options=options or None, **kwargs)
        self._needs_reset[reset] = False
        return self._reset_td(obs)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self._needs_reset.any():
            raise RuntimeError(
                f"GymVecEnv.step: sub-env(s) {np.flatnonzero(self._needs_reset).tolist()} "
                f"finished at the previous step and were not reset. Fix: reset them with "
                f"td['_reset'] = td['done'] and env.reset(td) (rollout does this)."
            )
        action = tensor_to_numpy(tensordict.get("action"), self._action_space, self.action_spec)
        obs, reward, terminated, truncated, _info = self._env.step(action)
        # In place: assigning an attribute of an nn.Module costs more than the step's bookkeeping.
        np.logical_or(terminated, truncated, out=self._needs_reset)
        return self._step_td(obs, reward, terminated, truncated)

    def extra_repr(self) -> str:
        return (
            f"env={self._env_name!r}, num_envs={self.num_envs}, "
            f"vectorization={self.vectorization!r}, {EnvBase.extra_repr(self)}"
        )
