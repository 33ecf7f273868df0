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
import math
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv
from tensordict import TensorDictBase

from recurrl.envs.common import EnvBase
from recurrl.envs.gym import GymEnv, import_env_package, split_env_id, tensor_to_numpy
from recurrl.envs.gym_async import DEFAULT_STEP_TIMEOUT, _AsyncVectorEnv
from recurrl.envs.utils import get_reset_mask, reset_mask_any_all

__all__ = ["GymVecEnv"]

_VECTORIZATIONS = ("sync", "async")


class _Default:
    """The ``step_timeout`` not given: :data:`DEFAULT_STEP_TIMEOUT` for async, none for sync."""

    def __repr__(self) -> str:
        return f"<default: {DEFAULT_STEP_TIMEOUT} s with vectorization='async'>"


_DEFAULT = _Default()


def _step_timeout(step_timeout: Any, vectorization: str, from_id: bool) -> float | None:
    """The async workers' answer timeout, validated; sync envs and instances take none."""
    if isinstance(step_timeout, _Default):
        return DEFAULT_STEP_TIMEOUT
    if not from_id or vectorization != "async":
        given = "a VectorEnv instance" if not from_id else f"vectorization={vectorization!r}"
        raise ValueError(
            f"GymVecEnv: step_timeout bounds the wait on worker processes and needs an env id "
            f"with vectorization='async', received {given}. Fix: remove step_timeout."
        )
    if step_timeout is None:
        return None
    valid = isinstance(step_timeout, (int, float)) and not isinstance(step_timeout, bool)
    if not valid or not (0 < step_timeout < math.inf):
        raise ValueError(
            f"GymVecEnv: expected step_timeout a number of seconds > 0 (or None to wait "
            f"forever), received {step_timeout!r}."
        )
    return float(step_timeout)


def _make_vector(
    env_id: str,
    num_envs: int,
    vectorization: str,
    vector_kwargs: dict[str, Any],
    make_kwargs: dict[str, Any],
    step_timeout: float | None,
) -> VectorEnv:
    import_env_package(env_id)
    try:
        gymnasium.spec(split_env_id(env_id)[1])  # "module:EnvId": the id after the colon
    except gymnasium.error.Error as err:
        raise ValueError(
            f"GymVecEnv: gymnasium env id {env_id!r} was not found ({err}). List the "
            f"registered ids with gymnasium.pprint_registry()."
        ) from err
    env_fns = [functools.partial(gymnasium.make, env_id, **make_kwargs)] * num_envs
    kwargs = {**vector_kwargs, "autoreset_mode": AutoresetMode.DISABLED}
    if vectorization == "sync":
        return SyncVectorEnv(env_fns, **kwargs)
    return _AsyncVectorEnv(env_fns, step_timeout=step_timeout, **kwargs)


class GymVecEnv(GymEnv, batched=True):
    """``num_envs`` copies of a gymnasium env, stepped together: batch ``[num_envs]``.

    Build it with ``GymVecEnv(env_id, num_envs=N, ...)``; ``GymEnv(env_id, num_envs=N, ...)``
    (the reference library's spelling) is a documented alias that returns this class with
    the same arguments (``batched=True`` declares it the target). Specs are those of one env
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
            ``autoreset_mode=AutoresetMode.DISABLED`` (used as given: the worker safeguards
            below apply to async envs built here from an id).
        num_envs: number of sub-envs (required with an env id).
        vectorization: ``"sync"`` (all sub-envs in this process) or ``"async"`` (one worker
            process per sub-env). With ``"async"``: a worker's exception is re-raised here
            with the worker traceback as its ``__cause__``; a worker that dies (e.g. SIGKILL
            from the out-of-memory killer) raises
            :class:`~recurrl.envs.gym_async.WorkerDiedError` naming its index, pid and
            signal or exit code; after either, or a timeout, every worker is stopped and the
            env is closed. :meth:`close` stops the workers with bounded waits (ask, then
            SIGTERM, then SIGKILL) and always returns. Workers die with this process, even
            when it is SIGKILLed (see ``docs/implementation_details.md``).
        vector_kwargs: more arguments of ``SyncVectorEnv`` / ``AsyncVectorEnv`` (e.g.
            ``context``, ``shared_memory``); ``autoreset_mode`` and ``worker`` are fixed.
        step_timeout: async only: seconds each worker may take to answer one reset or step
            (its first answer includes making its env). A worker that does not answer in
            time raises ``TimeoutError`` naming it, and every worker is killed. ``None``
            waits forever; default :data:`~recurrl.envs.gym_async.DEFAULT_STEP_TIMEOUT`
            (300 s).
        device: device of the tensors written.
        categorical_action_encoding: see :class:`~recurrl.envs.GymEnv`.
        seed: optional seed for the first reset.
        policy: as for :class:`~recurrl.envs.GymEnv`: with a recurrent policy the
            constructor returns a :class:`~recurrl.envs.TransformedEnv` around the
            ``GymVecEnv`` (transforms at the batched level, ``[N]``).
        **make_kwargs: passed to ``gymnasium.make`` for every sub-env.

    Examples:
        >>> env = GymVecEnv("CartPole-v1", num_envs=3, seed=0)
        >>> type(env).__name__, env.batch_size
        ('GymVecEnv', torch.Size([3]))
        >>> env.observation_spec["observation"].shape, env.action_spec.shape
        (torch.Size([3, 4]), torch.Size([3]))
        >>> data = env.rollout(40, break_when_any_done=False)
        >>> data.batch_size
        torch.Size([3, 40])
        >>> env.close()

        One worker process per sub-env, each answer awaited at most 60 s:

        >>> env = GymVecEnv("CartPole-v1", num_envs=2, vectorization="async", step_timeout=60)
        >>> env.rollout(3).batch_size
        torch.Size([2, 3])
        >>> env.close()
    """

    def __init__(
        self,
        env_name_or_instance: str | VectorEnv,
        *,
        num_envs: int | None = None,
        vectorization: str = "sync",
        vector_kwargs: dict[str, Any] | None = None,
        step_timeout: float | _Default | None = _DEFAULT,
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
        if "worker" in vector_kwargs:
            raise ValueError(
                "GymVecEnv: the async worker function is recurrl's (gymnasium's worker in a "
                "process that dies with this one); remove 'worker' from vector_kwargs."
            )
        timeout = _step_timeout(step_timeout, vectorization, isinstance(env_name_or_instance, str))
        envs = self._vector_env(
            env_name_or_instance, num_envs, vectorization, vector_kwargs, make_kwargs, timeout
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
        step_timeout: float | None,
    ) -> VectorEnv:
        if isinstance(env, str):
            if num_envs is None or int(num_envs) < 1:
                raise ValueError(f"GymVecEnv: expected num_envs >= 1, received {num_envs}.")
            return _make_vector(
                env, int(num_envs), vectorization, vector_kwargs, make_kwargs, step_timeout
            )
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
        if np.count_nonzero(self._needs_reset):  # C-level count: any() costs a µs more
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
