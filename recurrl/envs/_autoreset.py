"""A batched engine's own autoreset, mapped onto recurrl's reset contract.

recurrl's contract: ``("next", "observation")`` of a finished env is its terminal
observation, the env is not stepped again until ``env.reset(td)`` with ``"_reset"`` resets
it, and that reset returns its first observation, for exactly the envs in the mask.
Batched engines (gymnasium's ``vector_entry_point`` implementations, EnvPool, a user's
``VectorEnv``) reset finished envs on their own instead, in one of three ways:

* ``DISABLED``: they don't; ``reset(options={"reset_mask": mask})`` resets some envs.
  That is the contract already.
* ``NEXT_STEP``: the step that finishes an env returns its terminal observation (what
  recurrl reports), and the *next* step resets it, ignoring its action. The reset cannot be
  deferred to that step (the other envs would be stepped too), so the env is reset earlier,
  at ``env.reset(td)``, by the engine's partial reset: ``reset_mask`` where the engine has
  one, else a function registered here for the engine's class (gymnasium's
  ``CartPoleVectorEnv`` has none: :func:`cartpole_vector_reset` draws the reset state as its
  autoreset would). Once reset, the engine's pending autoreset is cleared, so it never
  fires. An engine with neither is refused.
* ``SAME_STEP``: the step that finishes an env resets it at once, returns the *reset*
  observation and puts the terminal one in ``infos["final_obs"]``. The terminal one is
  reported, and the reset one is cached and returned at the next ``env.reset(td)`` that
  resets that env (the engine is not asked to reset it twice). A partial reset of an env
  that is not finished needs the engine's partial reset, as above.

Every path raises if a finished env is stepped before ``env.reset(td)`` (in the vector env
class), so an engine's own autoreset never runs unseen. See ``docs/implementation_details.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.envs.classic_control.utils import maybe_parse_reset_bounds
from gymnasium.utils import seeding
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.vector.utils import concatenate, create_empty_array

__all__ = [
    "PARTIAL_RESETS",
    "EngineResets",
    "PartialReset",
    "cartpole_vector_reset",
    "observation_rows",
    "partial_reset_of",
    "reset_mask_option",
]

#: ``(engine, mask [N] bool, seed, options) -> observations [N, ...]``: reset the engine's
#: sub-envs in ``mask`` only and return the observations of a batch whose rows in ``mask``
#: are their reset observations (the other rows are ignored).
PartialReset = Callable[[Any, np.ndarray, "int | None", dict[str, Any]], Any]


def reset_mask_option(
    engine: VectorEnv, mask: np.ndarray, seed: int | None, options: dict[str, Any]
) -> Any:
    """gymnasium's partial reset, ``reset(options={"reset_mask": mask})`` (Sync/Async).

    Examples:
        >>> import gymnasium
        >>> envs = gymnasium.make_vec("CartPole-v1", 2, vectorization_mode="sync")
        >>> first, _ = envs.reset(seed=0)
        >>> obs = reset_mask_option(envs, np.array([False, True]), None, {})
        >>> bool((obs[0] == first[0]).all()), obs.shape
        (True, (2, 4))
    """
    obs, _info = engine.reset(seed=seed, options={**options, "reset_mask": mask})
    return obs


def cartpole_vector_reset(
    engine: CartPoleVectorEnv, mask: np.ndarray, seed: int | None, options: dict[str, Any]
) -> np.ndarray:
    """Reset some sub-envs of gymnasium's ``CartPoleVectorEnv`` (it has no ``reset_mask``).

    It draws their states exactly as the engine's own autoreset does at the step after
    they finish (one ``uniform(low, high, (4, k))`` from the engine's generator, in env
    order) and clears that pending autoreset; ``seed`` re-seeds the generator first and
    ``options`` ``low`` / ``high`` set the bounds, as its ``reset`` does.
    ``tests/envs/test_gym_vector.py`` pins the equality with the engine's autoreset.

    Examples:
        >>> envs = CartPoleVectorEnv(num_envs=3)
        >>> first, _ = envs.reset(seed=0)
        >>> obs = cartpole_vector_reset(envs, np.array([False, True, False]), None, {})
        >>> bool((obs[[0, 2]] == first[[0, 2]]).all()), bool((obs[1] != first[1]).any())
        (True, True)
    """
    if engine.state is None:
        raise RuntimeError("CartPoleVectorEnv: reset all sub-envs before a partial reset.")
    if seed is not None:
        engine.np_random, _ = seeding.np_random(seed)
    if options:
        engine.low, engine.high = maybe_parse_reset_bounds(options, -0.05, 0.05)
    state = engine.state
    state[:, mask] = engine.np_random.uniform(
        low=engine.low, high=engine.high, size=(4, int(np.count_nonzero(mask)))
    )
    engine.steps[mask] = 0
    engine.prev_done[mask] = False
    return state.T.astype(np.float32)


#: The partial reset of each engine class (looked up along the MRO of the engine's type).
#: gymnasium's ``SyncVectorEnv`` / ``AsyncVectorEnv`` take ``reset_mask`` in every
#: autoreset mode; gymnasium's ``vector_entry_point`` classes generally do not. Another
#: engine class is registered by adding its function here.
PARTIAL_RESETS: dict[type, PartialReset] = {
    SyncVectorEnv: reset_mask_option,
    AsyncVectorEnv: reset_mask_option,
    CartPoleVectorEnv: cartpole_vector_reset,
}


def partial_reset_of(engine: Any) -> PartialReset | None:
    """The partial reset registered for ``type(engine)`` or a base class, else ``None``.

    A gymnasium ``VectorWrapper`` around a Sync/Async vector env passes ``reset_mask``
    through, so it gets :func:`reset_mask_option` too.

    Examples:
        >>> import gymnasium
        >>> partial_reset_of(gymnasium.make_vec("CartPole-v1", 2, vectorization_mode="sync"))
        <function reset_mask_option at ...>
        >>> partial_reset_of(object()) is None
        True
    """
    for cls in type(engine).__mro__:
        if cls in PARTIAL_RESETS:
            return PARTIAL_RESETS[cls]
    inner = getattr(engine, "unwrapped", None)
    if inner is not None and inner is not engine:
        found = partial_reset_of(inner)
        return reset_mask_option if found is reset_mask_option else None
    return None


def _copy(obs: Any) -> Any:
    if isinstance(obs, dict):
        return {k: _copy(v) for k, v in obs.items()}
    return np.array(obs, copy=True)


def _put_rows(dst: Any, rows: np.ndarray, src: Any, src_rows: Any = slice(None)) -> None:
    """``dst[rows] = src[src_rows]``, through nested dicts of arrays."""
    if isinstance(dst, dict):
        for k in dst:
            _put_rows(dst[k], rows, src[k], src_rows)
    else:
        dst[rows] = src[src_rows]


class EngineResets:
    """The resets of one batched engine in recurrl's terms (see the module docstring).

    Args:
        engine: a gymnasium-style vector env of ``N`` sub-envs: ``reset(seed=, options=)``,
            ``step(actions)``, ``metadata["autoreset_mode"]``, ``single_observation_space``.
        owner: the class name used in error messages.
        partial_reset: the engine's partial reset; default :func:`partial_reset_of` (and
            :func:`reset_mask_option` for ``DISABLED`` engines, whose contract it is).

    Raises:
        ValueError: the engine declares no ``AutoresetMode``, or autoresets on the next step
            and has no partial reset (recurrl could not give the reset observation of a
            finished env before the others are stepped).

    Examples:
        >>> import gymnasium
        >>> envs = gymnasium.make_vec(
        ...     "CartPole-v1", 2, vectorization_mode="sync",
        ...     vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})
        >>> resets = EngineResets(envs, "Example")
        >>> resets.mode, resets.same_step
        (<AutoresetMode.SAME_STEP: 'SameStep'>, True)
        >>> resets.reset(None, 0, {}).shape
        (2, 4)
    """

    def __init__(self, engine: Any, owner: str, partial_reset: PartialReset | None = None):
        mode = engine.metadata.get("autoreset_mode")
        if not isinstance(mode, AutoresetMode):
            raise ValueError(
                f"{owner}: the vector env {type(engine).__name__} declares no autoreset mode "
                f"(metadata['autoreset_mode'] is {mode!r}), expected a gymnasium "
                f"AutoresetMode. Fix: set it in its metadata, or pass an env id."
            )
        if partial_reset is None:
            partial_reset = partial_reset_of(engine)
            if partial_reset is None and mode == AutoresetMode.DISABLED:
                partial_reset = reset_mask_option
        if partial_reset is None and mode == AutoresetMode.NEXT_STEP:
            raise ValueError(
                f"{owner}: {type(engine).__name__} resets a finished sub-env at its next step "
                f"(AutoresetMode.NEXT_STEP) and recurrl knows no way to reset some of its "
                f"sub-envs only, so the reset observation of a finished env could not be "
                f"given before the others are stepped again. Fix: use vectorization='sync' "
                f"(or 'async'), build the VectorEnv with autoreset_mode=DISABLED or "
                f"SAME_STEP, use recurrl.envs.EnvPoolEnv for an EnvPool pool, or register "
                f"its partial reset in recurrl.envs._autoreset.PARTIAL_RESETS."
            )
        self.engine, self.owner, self.mode = engine, owner, mode
        self.partial_reset = partial_reset
        #: SAME_STEP: the results hold reset observations the step put there for finished envs.
        self.same_step = mode == AutoresetMode.SAME_STEP
        n = int(engine.num_envs)
        #: SAME_STEP: sub-envs the engine already reset, whose reset observation is cached.
        self.cached = np.zeros(n, dtype=np.bool_)
        self._cache: Any = None

    def split_same_step(self, obs: Any, info: dict[str, Any], done: np.ndarray) -> Any:
        """SAME_STEP step results -> the observations to report (terminal for finished
        envs); the reset observations of the finished envs are cached.

        Args:
            obs: the step's observations ``[N, ...]`` (reset ones for finished envs).
            info: the step's infos, with ``"final_obs"`` (one entry per finished env).
            done: bool ``[N]``, terminated or truncated.
        """
        rows = np.flatnonzero(done)
        if rows.size == 0:
            return obs
        final = info.get("final_obs")
        if final is None:
            raise RuntimeError(
                f"{self.owner}.step: the vector env {type(self.engine).__name__} "
                f"(AutoresetMode.SAME_STEP) finished sub-env(s) {rows.tolist()} but gave no "
                f"infos['final_obs'] (their terminal observations)."
            )
        space = self.engine.single_observation_space
        stacked = concatenate(space, [final[i] for i in rows], create_empty_array(space, rows.size))
        self._cache = _copy(obs)
        self.cached[rows] = True
        terminal = _copy(obs)
        _put_rows(terminal, rows, stacked)
        return terminal

    def reset(self, mask: np.ndarray | None, seed: int | None, options: dict[str, Any]) -> Any:
        """Reset the sub-envs in ``mask`` (all with ``None``) and return observations whose
        rows in ``mask`` are their reset observations.

        Cached SAME_STEP reset observations are used unless a ``seed`` is given; the other
        envs of a partial reset go through the engine's partial reset.

        Raises:
            ValueError: a partial reset of a sub-env that has not finished, on an engine
                without a partial reset.
        """
        if mask is None:
            if self.same_step and seed is None and self.cached.all():
                self.cached[:] = False
                return self._cache  # every env was just reset by the engine itself
            self.cached[:] = False
            obs, _info = self.engine.reset(seed=seed, options=options or None)
            return obs
        if not self.same_step:  # nothing cached; the partial reset exists (see __init__)
            return self.partial_reset(self.engine, mask, seed, options)
        if seed is not None:
            self.cached[mask] = False  # reseeded: the engine's reset draws again
        fresh = mask & ~self.cached
        from_cache = mask & self.cached
        if not fresh.any():
            self.cached[mask] = False
            return self._cache
        if self.partial_reset is None:
            raise ValueError(
                f"{self.owner}.reset: sub-env(s) {np.flatnonzero(fresh).tolist()} have not "
                f"finished (or a seed was given), and {type(self.engine).__name__} resets "
                f"finished sub-envs itself (AutoresetMode.{self.mode.name}) but cannot reset "
                f"some sub-envs only. Fix: reset only finished envs (td['_reset'] = "
                f"td['done']) without a seed, or all of them, or use vectorization='sync'."
            )
        obs = self.partial_reset(self.engine, fresh, seed, options)
        if from_cache.any():
            obs = _copy(obs)
            _put_rows(obs, from_cache, self._cache, from_cache)
            self.cached[from_cache] = False
        return obs


def observation_rows(obs: Any, rows: np.ndarray, n: int, space: spaces.Space) -> Any:
    """The observations of sub-envs ``rows`` (``[k, ...]``) scattered into a batch of ``n``.

    For engines whose partial reset returns the reset envs' observations only (EnvPool).

    Examples:
        >>> out = observation_rows(np.ones((2, 3)), np.array([0, 2]), 3, spaces.Box(0, 1, (3,)))
        >>> out[[0, 2]].tolist(), out.shape
        ([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], (3, 3))
    """
    out = create_empty_array(space, n)
    _put_rows(out, rows, obs)
    return out
