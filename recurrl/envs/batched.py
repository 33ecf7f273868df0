"""SerialEnv: N unbatched envs stepped in this process as one env of batch ``[N]``.

The batched contract is that of ``GymVecEnv(id, num_envs=N)``: specs are the sub-env's specs
expanded to ``[N]``; ``reset(td)`` with a ``"_reset"`` mask resets only those sub-envs (the
others keep the input's values, merged by :class:`~recurrl.envs.EnvBase`); stepping a
sub-env that finished without resetting it raises; sub-env ``i`` is seeded with
``seed + i``. :class:`_BatchedEnv` holds this shared logic; :class:`SerialEnv` and
:class:`~recurrl.envs.ParallelEnv` only say how the sub-envs are reset and stepped.

What a sub-env receives at each step (the same in both classes, so they give the same
results): the batch's values of the sub-env's action, observation, state and done keys,
and the ``"next"`` observation / state keys a policy already wrote (a recurrent state),
for the keys the batch holds. What comes back: the sub-env's ``"next"`` observation,
state, reward and done keys. Other keys do not cross the batch boundary.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from torch import nn

from recurrl.envs.common import EnvBase
from recurrl.envs.env_creator import EnvMetaData, build_env
from recurrl.envs.utils import get_reset_mask

__all__ = ["SerialEnv"]

EnvFn = Callable[..., EnvBase]


def per_worker_args(
    owner: str,
    num_workers: Any,
    create_env_fn: EnvFn | Sequence[EnvFn],
    create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
) -> tuple[list[EnvFn], list[dict[str, Any]]]:
    """One env function and one kwargs dict per worker, validated.

    A single kwargs dict is shared (the same object) by every worker, so callers can
    recognise identical workers.
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"{owner}: expected num_workers an int >= 1, received {num_workers!r}.")
    if callable(create_env_fn) and not isinstance(create_env_fn, EnvBase):
        fns = [create_env_fn] * num_workers
    elif isinstance(create_env_fn, Sequence) and not isinstance(create_env_fn, str):
        fns = list(create_env_fn)
        if len(fns) != num_workers or not all(callable(f) for f in fns):
            raise ValueError(
                f"{owner}: create_env_fn as a list needs one callable per worker "
                f"(num_workers={num_workers}), received {len(fns)} items."
            )
    else:
        raise TypeError(
            f"{owner}: expected create_env_fn a callable returning an env (or a list of "
            f"num_workers of them), received {type(create_env_fn).__name__}. Fix: pass the "
            f"function that builds the env (e.g. lambda: GymEnv('CartPole-v1')), not an env."
        )
    if create_env_kwargs is None or isinstance(create_env_kwargs, Mapping):
        shared = dict(create_env_kwargs or {})
        kwargs = [shared] * num_workers
    else:
        kwargs = [dict(k) for k in create_env_kwargs]
        if len(kwargs) != num_workers:
            raise ValueError(
                f"{owner}: create_env_kwargs as a list needs one dict per worker "
                f"(num_workers={num_workers}), received {len(kwargs)}."
            )
    return fns, kwargs


def check_metadata(owner: str, metas: Sequence[EnvMetaData]) -> EnvMetaData:
    """The sub-envs' common metadata; raises if a sub-env is batched or differs."""
    first = metas[0]
    if first.batch_size != torch.Size([]):
        raise ValueError(
            f"{owner}: expected unbatched sub-envs (batch_size []), received a "
            f"{first.env_type} of batch_size {list(first.batch_size)}. Fix: let each worker "
            f"build one env (e.g. GymEnv(id)), or use GymVecEnv(id, num_envs=N) alone."
        )
    for i, meta in enumerate(metas[1:], start=1):
        diff = meta.differences(first)
        if diff:
            raise ValueError(
                f"{owner}: sub-env {i} differs from sub-env 0 ({'; '.join(diff)}); every "
                f"sub-env must have the same specs, batch size and device. Fix: make the env "
                f"functions build envs of one kind (same spaces and transforms)."
            )
    return first


class _BatchedEnv(EnvBase):
    """Shared logic of :class:`SerialEnv` and :class:`~recurrl.envs.ParallelEnv`.

    Subclasses implement :meth:`_reset_workers`, :meth:`_step_workers`,
    :meth:`_seed_workers` and call :meth:`_setup` with the sub-envs' metadata.
    """

    def _setup(self, num_workers: int, meta: EnvMetaData) -> None:
        EnvBase.__init__(self, device=meta.device, batch_size=(num_workers,))
        self.num_workers = num_workers
        for name, spec in meta.specs.items():
            self._set_spec(name, spec.expand(num_workers, *spec.shape))
        self._needs_reset = np.zeros(num_workers, dtype=bool)
        root = self._keys("observation", "state", "done", "action")
        carried = self._keys("observation", "state")
        self._input_keys: list[NestedKey] = [_tuple(k) for k, _ in root]
        self._input_keys += [("next", *_tuple(k)) for k, _ in carried]
        self._reset_keys = [k for k, _ in self._keys("observation", "state", "done")]
        self._output_keys = [k for k, _ in self._keys("observation", "state", "reward", "done")]

    # --- what crosses the batch boundary ---------------------------------------------------
    def _present_inputs(self, tensordict: TensorDictBase) -> tuple[NestedKey, ...]:
        """The input keys the batch holds at this step (sent to every sub-env)."""
        get = tensordict.get
        return tuple(k for k in self._input_keys if get(k, None) is not None)

    def _done_rows(self, next_td: TensorDictBase) -> np.ndarray:
        keys = ["done"] if "done" in self.done_spec else self.done_keys
        flags = [next_td.get(k).reshape(self.num_workers, -1) for k in keys]
        return torch.cat(flags, -1).any(-1).cpu().numpy()

    # --- EnvBase hooks -----------------------------------------------------------------------
    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        mask = get_reset_mask(tensordict, self.batch_size)
        workers = (
            list(range(self.num_workers))
            if mask is None
            else torch.nonzero(mask.cpu()).flatten().tolist()
        )
        out = self._reset_workers(workers, kwargs)
        self._needs_reset[workers] = False
        return out

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self._needs_reset.any():
            raise RuntimeError(
                f"{type(self).__name__}.step: sub-env(s) "
                f"{np.flatnonzero(self._needs_reset).tolist()} finished at the previous step "
                f"and were not reset. Fix: reset them with td['_reset'] = td['done'] and "
                f"env.reset(td) (rollout and Collector do this)."
            )
        out = self._step_workers(tensordict, self._present_inputs(tensordict))
        np.copyto(self._needs_reset, self._done_rows(out))
        return out

    def _set_seed(self, seed: int | None) -> None:
        seeds = [None if seed is None else seed + i for i in range(self.num_workers)]
        self._seed_workers(seeds)

    @abc.abstractmethod
    def _reset_workers(self, workers: list[int], kwargs: dict[str, Any]) -> TensorDictBase:
        """Reset the listed sub-envs; a ``[N]`` TensorDict of the reset keys (the rows of
        the other sub-envs are ignored: EnvBase merges the input's values over them)."""

    @abc.abstractmethod
    def _step_workers(
        self, tensordict: TensorDictBase, present: tuple[NestedKey, ...]
    ) -> TensorDictBase:
        """Step every sub-env with the ``present`` input keys; the ``[N]`` next content."""

    @abc.abstractmethod
    def _seed_workers(self, seeds: list[int | None]) -> None:
        """Seed sub-env ``i`` with ``seeds[i]``."""

    def extra_repr(self) -> str:
        return f"num_workers={self.num_workers}, {EnvBase.extra_repr(self)}"


def missing_output_error(owner: str, missing: dict[int, list[NestedKey]]) -> RuntimeError:
    return RuntimeError(
        f"{owner}: sub-envs wrote different keys at one step (missing, per sub-env: "
        f"{missing}); a batch needs the same keys from every sub-env. Fix: make every "
        f"sub-env write each key of its state spec at every step, or none at all."
    )


def select_rows(
    owner: str, rows: Sequence[TensorDictBase], keys: Sequence[NestedKey]
) -> list[TensorDictBase]:
    """``rows`` restricted to ``keys``; a key missing in every row is dropped, one missing
    in only some rows raises."""
    missing = {i: [k for k in keys if row.get(k, None) is None] for i, row in enumerate(rows)}
    missing = {i: m for i, m in missing.items() if m}
    if missing:
        if len(missing) < len(rows) or len({tuple(m) for m in missing.values()}) > 1:
            raise missing_output_error(owner, missing)
        keys = [k for k in keys if k not in missing[0]]
    return [row.select(*keys) for row in rows]


class SerialEnv(_BatchedEnv):
    """``num_workers`` unbatched envs stepped one after the other here: batch ``[N]``.

    Specs are the sub-envs' specs expanded to ``[N]`` (every sub-env must have the same
    specs). ``reset(td)`` with ``"_reset"`` (bool ``[N, 1]``) resets only those sub-envs;
    a sub-env that finished must be reset before the next step (``rollout`` and
    ``Collector`` do it), stepping it raises. :meth:`set_seed` seeds sub-env ``i`` with
    ``seed + i``. Transforms may be inside the sub-envs (each a ``TransformedEnv``) or
    outside (``TransformedEnv(SerialEnv(...), ...)``).

    The sub-envs are ``self.envs`` (an ``nn.ModuleList``), so :meth:`state_dict` holds
    their buffers under ``"envs.<i>."``, the layout :class:`~recurrl.envs.ParallelEnv`
    also uses.

    Args:
        num_workers: number of sub-envs ``N``.
        create_env_fn: a callable building one unbatched env (called once per worker), or
            a list of ``N`` callables (one per worker; their envs must share specs).
            An :class:`~recurrl.envs.EnvCreator` is a callable too.
        create_env_kwargs: keyword arguments of ``create_env_fn``: one dict for every
            worker, or a list of ``N`` dicts.

    Examples:
        >>> from recurrl.envs import GymEnv
        >>> env = SerialEnv(2, lambda: GymEnv("CartPole-v1"))
        >>> env.batch_size, env.observation_spec["observation"].shape
        (torch.Size([2]), torch.Size([2, 4]))
        >>> _ = env.set_seed(0)  # sub-env i gets seed i
        >>> env.rollout(30, break_when_any_done=False).batch_size
        torch.Size([2, 30])
        >>> env.close()
    """

    def __init__(
        self,
        num_workers: int,
        create_env_fn: EnvFn | Sequence[EnvFn],
        create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        fns, kwargs = per_worker_args("SerialEnv", num_workers, create_env_fn, create_env_kwargs)
        envs = []
        try:
            for fn, kw in zip(fns, kwargs, strict=True):
                envs.append(build_env(fn, kw, "SerialEnv"))
            meta = check_metadata("SerialEnv", [EnvMetaData.from_env(e) for e in envs])
        except BaseException:
            for env in envs:
                env.close()
            raise
        self._setup(num_workers, meta)
        self.envs = nn.ModuleList(envs)
        self._last_reset = [unbatched_zeros(meta, self._reset_keys)] * num_workers

    def _reset_workers(self, workers: list[int], kwargs: dict[str, Any]) -> TensorDictBase:
        envs = self._modules["envs"]
        for i in workers:
            self._last_reset[i] = envs[i].reset(**kwargs).select(*self._reset_keys)
        return torch.stack(self._last_reset, 0)

    def _step_workers(
        self, tensordict: TensorDictBase, present: tuple[NestedKey, ...]
    ) -> TensorDictBase:
        rows = tensordict.select(*present).unbind(0)
        envs = self._modules["envs"]
        nexts = [env.step(row).get("next") for env, row in zip(envs, rows, strict=True)]
        return torch.stack(select_rows("SerialEnv", nexts, self._output_keys), 0)

    def _seed_workers(self, seeds: list[int | None]) -> None:
        for env, seed in zip(self._modules["envs"], seeds, strict=True):
            env.set_seed(seed)

    def _close(self) -> None:
        for env in self._modules["envs"]:
            env.close()


def unbatched_zeros(meta: EnvMetaData, keys: Sequence[NestedKey]) -> TensorDictBase:
    """One sub-env's zeros for ``keys`` (from its observation, state and done specs)."""
    zeros = TensorDict({}, batch_size=meta.batch_size)
    for name in ("done", "state", "observation"):
        zeros.update(meta.specs[name].zero())
    return zeros.select(*keys)


def _tuple(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)
