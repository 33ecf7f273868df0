"""GymVecEnv: N gymnasium envs (sync, async or a batched engine) as one env of batch ``[N]``.

Autoreset: gymnasium's vector envs reset finished sub-envs on their own by default (on
the next ``step`` call, or within the same step); either way the observation returned
for a finished env is not the one recurrl expects at that point. We build the Sync/Async
vector env with ``autoreset_mode=AutoresetMode.DISABLED`` and turn ``env.reset(td)`` with a
``"_reset"`` mask into ``envs.reset(options={"reset_mask": mask})``, so a recurrl partial
reset is exactly one gymnasium partial reset: ``("next", "observation")`` of a finished
env is its terminal observation, and the reset observation appears at the next root.

Batched engines that step all N envs in one call (``vectorization="vector_entry_point"``:
gymnasium's own implementations such as ``CartPoleVectorEnv``; a ``VectorEnv`` instance
in any autoreset mode; :class:`~recurrl.envs.EnvPoolEnv`) keep their own autoreset, which
:mod:`recurrl.envs._autoreset` maps onto the same contract.
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

from recurrl.envs._autoreset import EngineResets, PartialReset
from recurrl.envs.common import EnvBase
from recurrl.envs.gym import GymEnv, import_env_package, split_env_id, tensor_to_numpy
from recurrl.envs.gym_async import DEFAULT_STEP_TIMEOUT, _AsyncVectorEnv
from recurrl.envs.utils import get_reset_mask, reset_mask_any_all

__all__ = ["GymVecEnv", "vector_entry_point_ids"]

_VECTORIZATIONS = ("sync", "async", "vector_entry_point")


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


def vector_entry_point_ids() -> list[str]:
    """The registered gymnasium ids that have a ``vector_entry_point`` (their own batched
    implementation, used by ``GymVecEnv(id, vectorization="vector_entry_point")``).

    Examples:
        >>> "CartPole-v1" in vector_entry_point_ids()
        True
    """
    return sorted(k for k, spec in gymnasium.registry.items() if spec.vector_entry_point)


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
        spec = gymnasium.spec(split_env_id(env_id)[1])  # "module:EnvId": the id after the colon
    except gymnasium.error.Error as err:
        raise ValueError(
            f"GymVecEnv: gymnasium env id {env_id!r} was not found ({err}). List the "
            f"registered ids with gymnasium.pprint_registry()."
        ) from err
    if vectorization == "vector_entry_point":
        return _make_vector_entry_point(env_id, spec, num_envs, vector_kwargs, make_kwargs)
    env_fns = [functools.partial(gymnasium.make, env_id, **make_kwargs)] * num_envs
    kwargs = {**vector_kwargs, "autoreset_mode": AutoresetMode.DISABLED}
    if vectorization == "sync":
        return SyncVectorEnv(env_fns, **kwargs)
    return _AsyncVectorEnv(env_fns, step_timeout=step_timeout, **kwargs)


def _make_vector_entry_point(
    env_id: str,
    spec: gymnasium.envs.registration.EnvSpec,
    num_envs: int,
    vector_kwargs: dict[str, Any],
    make_kwargs: dict[str, Any],
) -> VectorEnv:
    """gymnasium's own batched implementation of ``env_id`` (``make_vec``), in the autoreset
    mode it has: :class:`EngineResets` maps it onto recurrl's resets."""
    if spec.vector_entry_point is None:
        raise ValueError(
            f"GymVecEnv: env id {env_id!r} has no vector_entry_point (a batched "
            f"implementation of its own); the registered ids that have one are "
            f"{vector_entry_point_ids()}. Fix: vectorization='sync' (or 'async') for "
            f"{env_id!r}."
        )
    if vector_kwargs:
        raise ValueError(
            f"GymVecEnv: vector_kwargs {sorted(vector_kwargs)} are arguments of gymnasium's "
            f"Sync/AsyncVectorEnv, not of the vector_entry_point implementation of "
            f"{env_id!r}. Fix: remove them (its own arguments go as keyword arguments)."
        )
    return gymnasium.make_vec(
        env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **make_kwargs
    )


class GymVecEnv(GymEnv, batched=True):
    """``num_envs`` copies of a gymnasium env, stepped together: batch ``[num_envs]``.

    Build it with ``GymVecEnv(env_id, num_envs=N, ...)``; ``GymEnv(env_id, num_envs=N, ...)``
    (the reference library's spelling) is a documented alias that returns this class with
    the same arguments (``batched=True`` declares it the target). Specs are those of one env
    (``single_observation_space`` / ``single_action_space``) expanded to ``[N]``; keys and
    conversions are those of :class:`~recurrl.envs.GymEnv`.

    Partial resets map 1:1 to gymnasium's: the Sync/Async vector env runs with
    ``autoreset_mode=DISABLED`` and ``env.reset(td)`` with ``"_reset"`` calls
    ``envs.reset(options={"reset_mask": mask})``, resetting only those sub-envs. A
    finished sub-env must be reset before the next step (``rollout`` does it); stepping it
    raises an error naming it.

    An engine with its own autoreset (``vectorization="vector_entry_point"``, a
    ``VectorEnv`` instance built with ``NEXT_STEP`` or ``SAME_STEP``) behaves the same:
    ``("next", "observation")`` of a finished env is its terminal observation and its reset
    observation comes from ``env.reset(td)``. A ``NEXT_STEP`` engine is reset early, at
    ``env.reset(td)``, by its partial reset (``reset_mask``, or the function
    :mod:`recurrl.envs._autoreset` registers for its class, e.g. ``CartPoleVectorEnv``), so
    its own autoreset never runs; a ``SAME_STEP`` engine's reset observations are cached at
    the step and handed out at ``env.reset(td)``. Engines with neither are refused (see
    ``docs/implementation_details.md``).

    Seeding: ``seed`` (or :meth:`set_seed`) is passed to the next reset; sub-env ``i`` gets
    ``seed + i`` with ``"sync"`` / ``"async"``. A ``vector_entry_point`` engine takes the
    seed as it does: ``CartPoleVectorEnv`` draws every sub-env's start from one generator
    seeded with ``seed`` (a seeded partial reset re-seeds it), so the same seed gives the
    same batch, but sub-env ``i`` does not start where ``"sync"``'s sub-env ``i`` does.
    Random actions use torch's global RNG.

    Args:
        env_name_or_instance: a registered env id, or a gymnasium ``VectorEnv`` (used as
            given: the worker safeguards below apply to async envs built here from an id)
            whose ``metadata["autoreset_mode"]`` is ``DISABLED`` (partial resets through
            ``reset_mask``), ``SAME_STEP``, or ``NEXT_STEP`` with a partial reset that
            recurrl knows (Sync/Async vector envs, ``CartPoleVectorEnv``).
        num_envs: number of sub-envs (required with an env id).
        vectorization: ``"sync"`` (all sub-envs in this process), ``"async"`` (one worker
            process per sub-env) or ``"vector_entry_point"`` (gymnasium's own batched
            implementation of the id, one numpy call for all sub-envs; ids that have one:
            :func:`vector_entry_point_ids`, e.g. ``CartPole-v1``; another id raises a
            ``ValueError`` naming them). With ``"async"``: a worker's exception is re-raised here
            with the worker traceback as its ``__cause__``; a worker that dies (e.g. SIGKILL
            from the out-of-memory killer) raises
            :class:`~recurrl.envs.gym_async.WorkerDiedError` naming its index, pid and
            signal or exit code; after either, or a timeout, every worker is stopped and the
            env is closed. :meth:`close` stops the workers with bounded waits (ask, then
            SIGTERM, then SIGKILL) and always returns. Workers die with this process, even
            when it is SIGKILLed (see ``docs/implementation_details.md``).
        vector_kwargs: more arguments of ``SyncVectorEnv`` / ``AsyncVectorEnv`` (e.g.
            ``context``, ``shared_memory``); ``autoreset_mode`` and ``worker`` are fixed.
            None with ``"vector_entry_point"``.
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
        **make_kwargs: passed to ``gymnasium.make`` for every sub-env (to the
            ``vector_entry_point`` constructor, e.g. ``max_episode_steps``).

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

        gymnasium's numpy CartPole, all sub-envs in one call:

        >>> env = GymVecEnv("CartPole-v1", num_envs=4, vectorization="vector_entry_point", seed=0)
        >>> type(env.env).__name__
        'CartPoleVectorEnv'
        >>> data = env.rollout(30, break_when_any_done=False)
        >>> done = data["next", "done"].squeeze(-1)
        >>> bool(done.any()), bool((data["observation"][:, 1:][done[:, :-1]].abs() <= 0.05).all())
        (True, True)
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
        from_id = isinstance(env_name_or_instance, str)
        self._init_engine(
            envs,
            name=env_name_or_instance if from_id else type(envs.unwrapped).__name__,
            vectorization=vectorization if from_id else None,
            device=device,
            categorical_action_encoding=categorical_action_encoding,
            seed=seed,
        )

    def _init_engine(
        self,
        envs: Any,
        *,
        name: str,
        vectorization: str | None,
        device: torch.device | str,
        categorical_action_encoding: bool,
        seed: int | None,
        partial_reset: PartialReset | None = None,
    ) -> None:
        """Set up the env around a built engine (shared with subclasses that build their own).

        ``partial_reset`` overrides the one :class:`EngineResets` finds for the engine.
        """
        resets = EngineResets(envs, type(self).__name__, partial_reset)
        EnvBase.__init__(self, device=device, batch_size=(envs.num_envs,))
        self._env = envs
        self._resets = resets
        self._same_step = resets.same_step
        self.vectorization = vectorization
        self._env_name = name
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
        return env  # its autoreset mode is checked by EngineResets

    @property
    def num_envs(self) -> int:
        """Number of sub-envs (``batch_size[0]``)."""
        return self.batch_size[0]

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        mask = get_reset_mask(tensordict, self.batch_size)
        options = dict(kwargs.pop("options", None) or {})
        if kwargs:
            raise TypeError(
                f"{type(self).__name__}.reset: unexpected keyword arguments {sorted(kwargs)}; "
                f"a vector env's reset takes options=dict(...) only."
            )
        reset: Any = None  # every sub-env
        if mask is not None and not reset_mask_any_all(mask)[1]:
            # EnvBase never calls _reset with an all-False mask (gymnasium rejects it).
            reset = mask.cpu().numpy().astype(np.bool_)
        obs = self._resets.reset(reset, self._take_seed(), options)
        self._needs_reset[slice(None) if reset is None else reset] = False
        return self._reset_td(obs)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if np.count_nonzero(self._needs_reset):  # C-level count: any() costs a µs more
            raise RuntimeError(
                f"GymVecEnv.step: sub-env(s) {np.flatnonzero(self._needs_reset).tolist()} "
                f"finished at the previous step and were not reset. Fix: reset them with "
                f"td['_reset'] = td['done'] and env.reset(td) (rollout does this)."
            )
        action = tensor_to_numpy(tensordict.get("action"), self._action_space, self.action_spec)
        obs, reward, terminated, truncated, info = self._env.step(action)
        # In place: assigning an attribute of an nn.Module costs more than the step's bookkeeping.
        np.logical_or(terminated, truncated, out=self._needs_reset)
        if self._same_step:  # the engine reset finished envs: report their terminal obs
            obs = self._resets.split_same_step(obs, info, self._needs_reset)
        return self._step_td(obs, reward, terminated, truncated)

    def load_simulator_state(self, blob: bytes) -> None:
        """As :meth:`~recurrl.envs.GymEnv.load_simulator_state`; the engine's resets then act
        on the loaded engine (reset observations cached from before are dropped)."""
        super().load_simulator_state(blob)
        self._resets = EngineResets(self._env, type(self).__name__, self._resets.partial_reset)

    def extra_repr(self) -> str:
        return (
            f"env={self._env_name!r}, num_envs={self.num_envs}, "
            f"vectorization={self.vectorization!r}, {EnvBase.extra_repr(self)}"
        )
