"""EnvPoolEnv: an EnvPool batch of envs (stepped by C++ threads) as one env of batch ``[N]``.

EnvPool (the ``envpool`` package, optional extra ``recurrl[envpool]``) is imported on first
use. Its pools autoreset on the next step (``NEXT_STEP``: the step that finishes an env
returns its terminal observation, the next one resets it and ignores its action) and reset
any subset of envs with ``reset(env_id)``. So a recurrl partial reset is one EnvPool partial
reset, done before the next step, and EnvPool's own autoreset never runs: the contract is
that of :class:`~recurrl.envs.GymVecEnv` (see :mod:`recurrl.envs._autoreset`).
"""

from __future__ import annotations

import difflib
import functools
import warnings
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from recurrl.envs._autoreset import EngineResets, observation_rows
from recurrl.envs.common import EnvBase
from recurrl.envs.gym_vector import GymVecEnv
from recurrl.envs.utils import get_reset_mask, reset_mask_any_all

__all__ = ["EnvPoolEnv"]


def _envpool() -> Any:
    """The ``envpool`` module, imported on first use with an error that says what to install."""
    try:
        import envpool
    except ModuleNotFoundError as err:
        if err.name != "envpool":
            raise  # envpool is there, one of its own dependencies is not
        raise ModuleNotFoundError(
            "EnvPoolEnv needs the package envpool, which is not installed. Fix: pip install "
            '"recurrl[envpool]"',
            name="envpool",
        ) from err
    return envpool


def _partial_reset(engine: Any, mask: np.ndarray, seed: int | None, options: dict[str, Any]) -> Any:
    """EnvPool's partial reset, ``reset(env_id)``; its answer (the reset envs only, in the
    order of ``info["env_id"]``) scattered into a batch of ``N`` rows."""
    if options:
        raise ValueError(
            f"EnvPoolEnv.reset: EnvPool takes no reset options, received {sorted(options)}."
        )
    obs, info = engine.reset(np.flatnonzero(mask).astype(np.int32))
    n, space = engine.num_envs, engine.single_observation_space
    return observation_rows(obs, np.asarray(info["env_id"]), n, space)


class EnvPoolEnv(GymVecEnv):
    """``num_envs`` copies of an EnvPool env, stepped together by C++ threads: batch ``[N]``.

    Keys, specs and conversions are those of :class:`~recurrl.envs.GymVecEnv` of the same
    gymnasium id (EnvPool's gymnasium spaces), and so is the reset contract:
    ``("next", "observation")`` of a finished env is its terminal observation, its reset
    observation comes from ``env.reset(td)`` with ``"_reset"`` (an EnvPool
    ``reset(env_id)`` of those envs, done before the next step, so EnvPool's own autoreset
    never runs), any subset of envs may be reset, and stepping a finished env that was not
    reset raises. The pool runs in EnvPool's synchronous mode (``batch_size == num_envs``).

    Seeding: EnvPool fixes the seeds when the pool is built (sub-env ``i`` gets
    ``seed + i``, as ``GymVecEnv`` does). ``seed=None`` draws one at random; a later
    :meth:`set_seed` rebuilds the pool with the new seed at the next reset of every env
    (a partial reset leaves it pending). The dynamics are EnvPool's C++ ones: for
    CartPole they agree with gymnasium's to float32 precision from the same state, but the
    start states are drawn by EnvPool's own generators. EnvPool's flags are kept as they
    are: a step that ends the episode at the time limit is ``truncated`` only, where
    gymnasium reports it ``terminated`` and ``truncated``.

    Args:
        env_id: an EnvPool task id (``envpool.list_all_envs()``, e.g. ``"CartPole-v1"``).
        num_envs: number of envs ``N``.
        seed: seed of the pool (sub-env ``i`` gets ``seed + i``); ``None``: a random one.
        num_threads: EnvPool worker threads (``0``: EnvPool's default).
        device: device of the tensors written.
        categorical_action_encoding: see :class:`~recurrl.envs.GymEnv`.
        policy: as for :class:`~recurrl.envs.GymEnv`: with a recurrent policy the
            constructor returns a :class:`~recurrl.envs.TransformedEnv` around the
            ``EnvPoolEnv`` with the transforms it needs (``is_init``, its state keys).
        **make_kwargs: passed to ``envpool.make_gymnasium`` (e.g. ``max_episode_steps``).

    Raises:
        ModuleNotFoundError: envpool is not installed (``pip install "recurrl[envpool]"``).
        ValueError: ``env_id`` is not an EnvPool id (the message names close ones), or
            ``num_envs < 1``, or a ``batch_size`` other than ``num_envs`` (async mode).

    Examples:
        >>> import pytest; _ = pytest.importorskip("envpool")  # the extra recurrl[envpool]
        >>> env = EnvPoolEnv("CartPole-v1", num_envs=4, seed=0, num_threads=1)
        >>> env.batch_size, env.observation_spec["observation"].shape
        (torch.Size([4]), torch.Size([4, 4]))
        >>> data = env.rollout(30, break_when_any_done=False)
        >>> done = data["next", "done"].squeeze(-1)
        >>> bool(done.any()), bool((data["observation"][:, 1:][done[:, :-1]].abs() <= 0.05).all())
        (True, True)
        >>> env.close()
    """

    def __init__(
        self,
        env_id: str,
        *,
        num_envs: int,
        seed: int | None = None,
        num_threads: int = 0,
        device: torch.device | str = "cpu",
        categorical_action_encoding: bool = True,
        **make_kwargs: Any,
    ) -> None:
        envpool = _envpool()
        if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
            raise ValueError(f"EnvPoolEnv: expected num_envs an int >= 1, received {num_envs!r}.")
        if make_kwargs.get("batch_size", num_envs) != num_envs:
            raise ValueError(
                f"EnvPoolEnv: batch_size={make_kwargs['batch_size']} != num_envs={num_envs} is "
                f"EnvPool's asynchronous mode (each step returns whichever envs are ready), "
                f"which recurrl does not support. Fix: remove batch_size."
            )
        ids = envpool.list_all_envs()
        if env_id not in ids:
            close = difflib.get_close_matches(env_id, ids, n=5)
            raise ValueError(
                f"EnvPoolEnv: {env_id!r} is not an EnvPool env id (close ones: {close}; all: "
                f"envpool.list_all_envs()). Fix: an EnvPool id, or GymVecEnv({env_id!r}, "
                f"num_envs=N) for a gymnasium id."
            )
        make_pool = functools.partial(
            envpool.make_gymnasium,
            env_id,
            num_envs=num_envs,
            num_threads=num_threads,
            **make_kwargs,
        )
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0] % 2**31)
        self._init_engine(
            _build(make_pool, seed),
            name=env_id,
            vectorization=None,
            device=device,
            categorical_action_encoding=categorical_action_encoding,
            seed=None,  # the pool is built with it
            partial_reset=_partial_reset,
        )
        self._make_pool = make_pool
        self.num_threads = num_threads
        self.pool_seed = seed

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        seed = self._pending_seed
        if seed is not None:
            mask = get_reset_mask(tensordict, self.batch_size)
            if mask is None or reset_mask_any_all(mask)[1]:
                self._pending_seed = None
                self._rebuild(seed)
        return super()._reset(tensordict, **kwargs)

    def _take_seed(self) -> None:
        """EnvPool takes seeds only when the pool is built: :meth:`_reset` rebuilds it."""
        return None

    def _rebuild(self, seed: int) -> None:
        """A new pool with ``seed`` (built first: on failure the old one is kept)."""
        engine = _build(self._make_pool, seed)
        old = self._env
        self._env = engine
        self._resets = EngineResets(engine, type(self).__name__, _partial_reset)
        self.pool_seed = seed
        old.close()

    def extra_repr(self) -> str:
        return (
            f"env={self._env_name!r}, num_envs={self.num_envs}, num_threads={self.num_threads}, "
            f"seed={self.pool_seed}, {EnvBase.extra_repr(self)}"
        )


def _build(make: functools.partial, seed: int) -> Any:
    """``make(seed=seed)``, its spaces read once without gymnasium's float32-bounds warning
    (EnvPool builds float32 Boxes from float64 bounds)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
        engine = make(seed=seed)
        _ = engine.single_observation_space, engine.single_action_space
    return engine
