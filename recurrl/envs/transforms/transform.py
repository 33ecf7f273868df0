"""Transform base class, Compose, TransformedEnv and find_transform."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any, TypeVar

from tensordict import NestedKey, TensorDict, TensorDictBase, unravel_key
from torch import nn

from recurrl.envs._torchrl import import_torchrl
from recurrl.envs.common import EnvBase
from recurrl.envs.specs import Composite
from recurrl.envs.utils import get_reset_mask, merge_reset, reset_mask_any_all

__all__ = ["Compose", "Transform", "TransformedEnv", "find_transform"]

T = TypeVar("T", bound="Transform")
_SPEC_HOOKS = {
    "observation": "transform_observation_spec",
    "state": "transform_state_spec",
    "reward": "transform_reward_spec",
    "done": "transform_done_spec",
    "action": "transform_action_spec",
}


class Transform(nn.Module):
    """Base class of env transforms: one hook pair, plus optional spec hooks.

    Override :meth:`_reset` and/or :meth:`_step` (the main hooks) and, when the transform
    adds, removes or changes keys, the matching ``transform_*_spec`` hook. Spec hooks
    receive a copy of the Composite they may edit in place, and return it.

    Args:
        in_keys: keys the transform reads.
        out_keys: keys the transform writes (default: ``in_keys``).

    Examples:
        >>> from recurrl.testing import CountingEnv
        >>> class AddOne(Transform):
        ...     def _step(self, tensordict, next_tensordict):
        ...         next_tensordict.set("observation", next_tensordict["observation"] + 1)
        ...         return next_tensordict
        >>> env = TransformedEnv(CountingEnv(), AddOne())
        >>> env.step(env.rand_action(env.reset()))["next", "observation"]
        tensor([2., 2., 2.])
    """

    def __init__(
        self,
        in_keys: list[NestedKey] | None = None,
        out_keys: list[NestedKey] | None = None,
    ) -> None:
        super().__init__()
        self.in_keys: list[NestedKey] = list(in_keys or [])
        self.out_keys: list[NestedKey] = list((in_keys or []) if out_keys is None else out_keys)
        # Kept out of nn.Module's registry: the env is not a child of its transforms.
        self.__dict__["_parent"] = None

    @property
    def parent(self) -> EnvBase | None:
        """The env this transform is attached to (``None`` when detached)."""
        return self.__dict__.get("_parent")

    def _require_parent(self, need: str) -> EnvBase:
        """The parent env, or ``ValueError`` saying that ``need`` requires one.

        Every use of a transform that needs its env (its specs, its device) goes through
        here, so a detached transform always fails the same way, with a ``ValueError``.
        """
        parent = self.parent
        if parent is None:
            raise ValueError(
                f"{type(self).__name__}: {need} needs the env the transform is attached to, "
                f"but it has no parent env. Fix: attach it first, with "
                f"TransformedEnv(env, transform) or env.append_transform(transform), and "
                f"use the env (env.reset() / env.step())."
            )
        return parent

    def _set_parent(self, env: EnvBase | None) -> None:
        current = self.parent
        if env is not None and current is not None and current is not env:
            raise ValueError(
                f"{type(self).__name__} is already attached to another env; a transform "
                f"belongs to one env. Fix: pass transform.clone()."
            )
        self.__dict__["_parent"] = env

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_parent"] = None  # never copy / pickle the env with its transform
        return state

    def clone(self: T) -> T:
        """A detached deep copy."""
        return copy.deepcopy(self)

    # --- main hooks ----------------------------------------------------------------------
    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        """Edit the output of ``reset``.

        Args:
            tensordict: the input of ``reset`` (``"_reset"`` bool ``[*B, 1]`` when partial;
                an empty TensorDict when ``reset()`` got none).
            tensordict_reset: what the base env (and earlier transforms) returned.
        """
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        """Edit the ``"next"`` content of a step.

        Args:
            tensordict: the root of the step (action, current observation and state).
            next_tensordict: the next-step content from the base env and earlier transforms,
                including keys the policy wrote under ``"next"``.
        """
        return next_tensordict

    # --- fused hooks (optional; the step loop of collection) -----------------------------
    # A transform class may give, in its own class body (a subclass does not inherit them),
    # these two faster forms of _step and of a _reset, for StepPlan (what a collector and
    # env.step_and_maybe_reset run). Each writes the values of the transform's out_keys
    # (top-level string keys) into ``new`` instead of into a TensorDict, reading what _step /
    # _reset read, and returns True; or returns False, and the env then calls _step /
    # _reset of every transform instead (nothing written to ``new`` is used). They must
    # give exactly what _step / _reset give; the env uses them only when every transform
    # of the env has them (tests compare the two paths).
    def _fused_step(
        self,
        tensordict: TensorDictBase,
        next_tensordict: TensorDictBase,
        new: dict[str, Any],
    ) -> bool:
        """:meth:`_step` writing into ``new`` (keys earlier transforms wrote are there too,
        not in ``next_tensordict``). Default: no fused form."""
        return False

    def _fused_reset(
        self,
        tensordict: TensorDictBase,
        tensordict_reset: TensorDictBase,
        new: dict[str, Any],
        mask: Any,
    ) -> bool:
        """:meth:`_reset` writing into ``new``: ``mask`` is ``None`` for a reset of every
        env, else the ``[*B]`` bool mask of a partial reset (some but not all envs), which
        is read from ``mask`` only: ``tensordict`` holds the current values and may lack
        ``"_reset"``. Default: no fused form."""
        return False

    # --- spec hooks (Composite in, Composite out) ----------------------------------------
    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        """Edit the observation Composite."""
        return observation_spec

    def transform_state_spec(self, state_spec: Composite) -> Composite:
        """Edit the state Composite."""
        return state_spec

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        """Edit the reward Composite (``"reward"`` entry)."""
        return reward_spec

    def transform_done_spec(self, done_spec: Composite) -> Composite:
        """Edit the done Composite."""
        return done_spec

    def transform_action_spec(self, action_spec: Composite) -> Composite:
        """Edit the action Composite (``"action"`` entry)."""
        return action_spec

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Not supported: a transform runs inside its env (``ValueError``).

        TorchRL's envs accept any callable as a transform and call it on every reset and
        step, so a recurrl transform appended to a TorchRL env fails here, at the first
        ``reset()``; the message names ``to_torchrl()``.
        """
        where = "its env" if self.parent is not None else "an env (it has no parent env)"
        raise ValueError(
            f"{type(self).__name__} is not called on a TensorDict: it runs inside {where}. "
            f"Fix: env = TransformedEnv(env, transform) (or env.append_transform(transform)), "
            f"then env.reset() / env.step(). In a TorchRL env (which calls any callable it is "
            f"given as a transform), append the TorchRL equivalent instead: "
            f"env.append_transform(transform.to_torchrl())."
        )

    def to_torchrl(self) -> Any:
        """The equivalent TorchRL transform (``torchrl.envs``), for a TorchRL env.

        A new, detached TorchRL transform configured as this one (keys, specs, initial
        values); the recurrl transform is left unchanged. TorchRL is imported here, and only
        here. Implemented by :class:`Compose`, :class:`~recurrl.envs.transforms.InitTracker`
        and :class:`~recurrl.envs.transforms.TensorDictPrimer` (what
        :func:`~recurrl.envs.get_env_transforms_from_module` and a module's
        ``make_tensordict_primer()`` return); other transforms raise ``NotImplementedError``.

        Returns:
            A ``torchrl.envs.Transform``.

        Raises:
            NotImplementedError: this transform has no TorchRL conversion.
            ImportError: torchrl is not installed.

        Examples:
            >>> from recurrl.envs.transforms import RewardSum
            >>> RewardSum().to_torchrl()
            Traceback (most recent call last):
            ...
            NotImplementedError: RewardSum.to_torchrl: no TorchRL conversion ...
        """
        raise NotImplementedError(
            f"{type(self).__name__}.to_torchrl: no TorchRL conversion is implemented for this "
            f"transform (only Compose, InitTracker and TensorDictPrimer convert). Fix: append "
            f"TorchRL's own transform of the same role (torchrl.envs.transforms) to the TorchRL "
            f"env."
        )

    def extra_repr(self) -> str:
        return f"in_keys={self.in_keys}, out_keys={self.out_keys}"


class Compose(Transform):
    """A sequence of transforms applied in order (hooks and spec hooks).

    Args:
        *transforms: the transforms.

    Examples:
        >>> from recurrl.envs.transforms import InitTracker, TensorDictPrimer
        >>> from recurrl.envs.specs import Unbounded
        >>> t = Compose(InitTracker(), TensorDictPrimer(rs_h=Unbounded((1, 4))))
        >>> len(t), type(t[0]).__name__
        (2, 'InitTracker')
    """

    def __init__(self, *transforms: Transform) -> None:
        super().__init__()
        for t in transforms:
            _check_transform(t)
        self.transforms = nn.ModuleList(transforms)

    @property
    def in_keys(self) -> list[NestedKey]:  # type: ignore[override]
        return [k for t in self.transforms for k in t.in_keys]

    @in_keys.setter
    def in_keys(self, value: list[NestedKey]) -> None:
        pass  # derived from the children

    @property
    def out_keys(self) -> list[NestedKey]:  # type: ignore[override]
        return [k for t in self.transforms for k in t.out_keys]

    @out_keys.setter
    def out_keys(self, value: list[NestedKey]) -> None:
        pass  # derived from the children

    def _set_parent(self, env: EnvBase | None) -> None:
        super()._set_parent(env)
        for t in self.transforms:
            t._set_parent(env)

    def __getitem__(self, index: int | slice) -> Transform:
        if isinstance(index, slice):
            return Compose(*self.transforms[index])
        return self.transforms[index]

    def __len__(self) -> int:
        return len(self.transforms)

    def __iter__(self) -> Iterator[Transform]:
        return iter(self.transforms)

    def append(self, transform: Transform) -> None:
        """Add ``transform`` at the end."""
        self.insert(len(self.transforms), transform)

    def insert(self, index: int, transform: Transform) -> None:
        """Add ``transform`` at position ``index``."""
        _check_transform(transform)
        transform._set_parent(self.parent)
        self.transforms.insert(index, transform)
        self._invalidate_parent_specs()

    def pop(self, index: int = -1) -> Transform:
        """Remove and return the transform at ``index`` (detached from the env)."""
        index = index % len(self.transforms)
        transform = self.transforms[index]
        del self.transforms[index]
        transform._set_parent(None)
        self._invalidate_parent_specs()
        return transform

    def _invalidate_parent_specs(self) -> None:
        # The env's specs (and what it caches from them) pass through these transforms.
        invalidate = getattr(self.parent, "_invalidate_specs", None)
        if invalidate is not None:
            invalidate()

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        for t in self._modules["transforms"]:  # no nn.Module.__getattr__ on the hot path
            tensordict_reset = t._reset(tensordict, tensordict_reset)
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for t in self._modules["transforms"]:
            next_tensordict = t._step(tensordict, next_tensordict)
        return next_tensordict

    def _chain(self, hook: str, spec: Composite) -> Composite:
        for t in self.transforms:
            spec = getattr(t, hook)(spec)
        return spec

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        return self._chain("transform_observation_spec", observation_spec)

    def transform_state_spec(self, state_spec: Composite) -> Composite:
        return self._chain("transform_state_spec", state_spec)

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        return self._chain("transform_reward_spec", reward_spec)

    def transform_done_spec(self, done_spec: Composite) -> Composite:
        return self._chain("transform_done_spec", done_spec)

    def transform_action_spec(self, action_spec: Composite) -> Composite:
        return self._chain("transform_action_spec", action_spec)

    def to_torchrl(self) -> Any:
        """A ``torchrl.envs.Compose`` of each transform's ``to_torchrl()``, in order.

        Examples:
            >>> import pytest; _ = pytest.importorskip("torchrl")  # the extra recurrl[torchrl]
            >>> from recurrl.envs.transforms import InitTracker, TensorDictPrimer
            >>> from recurrl.envs.specs import Unbounded
            >>> t = Compose(InitTracker(), TensorDictPrimer(rs_h=Unbounded((1, 4))))
            >>> [type(x).__qualname__ for x in t.to_torchrl()]
            ['InitTracker', 'TensorDictPrimer']
        """
        envs = import_torchrl("envs", "Compose.to_torchrl")
        return envs.Compose(*(t.to_torchrl() for t in self.transforms))

    def extra_repr(self) -> str:
        return ""


def _check_transform(transform: Any) -> None:
    if not isinstance(transform, Transform):
        raise TypeError(
            f"expected a recurrl Transform, received {type(transform).__name__}. "
            f"Fix: subclass recurrl.envs.transforms.Transform."
        )


def _iter_transforms(transform: Transform) -> Iterator[Transform]:
    yield transform
    if isinstance(transform, Compose):
        for t in transform.transforms:
            yield from _iter_transforms(t)


def _merged_on_partial_reset(transform: Transform) -> set[NestedKey]:
    """Keys whose partial-reset values the transforms already merged with the current ones.

    A transform class may promise, with a class attribute ``_partial_reset_merges = True``
    set in its own class body (a subclass does not inherit the promise), that on a partial
    reset its ``_reset`` writes each of its ``out_keys`` as the reset value for the envs
    being reset and the current value for the others, and writes no other key. When every
    transform of the env promises it, their ``out_keys`` need no merge afterwards;
    otherwise every key is merged (a later transform might rewrite one).
    """
    keys: set[NestedKey] = set()
    for t in _iter_transforms(transform):
        if isinstance(t, Compose):
            continue
        if not type(t).__dict__.get("_partial_reset_merges", False):
            return set()
        keys.update(unravel_key(k) for k in t.out_keys)
    return keys


class TransformedEnv(EnvBase):
    """An env whose outputs and specs go through a (Compose of) transform(s).

    Specs are the base env's specs passed through the transforms' spec hooks; they are
    computed once and recomputed when a transform is appended / inserted or a base spec is
    set. They are read-only here: set specs on the base env.

    Args:
        env: the base env.
        transform: optional first transform.

    Attributes:
        base_env: the wrapped env.
        transform: a :class:`Compose` of the transforms, in application order.

    Examples:
        >>> from recurrl.envs.specs import Unbounded
        >>> from recurrl.envs.transforms import InitTracker, TensorDictPrimer
        >>> from recurrl.testing import CountingEnv
        >>> env = TransformedEnv(CountingEnv(batch_size=(2,)), InitTracker())
        >>> env = env.append_transform(TensorDictPrimer(rs_h=Unbounded((1, 8))))
        >>> td = env.reset()
        >>> td["is_init"].squeeze(-1), td["rs_h"].shape
        (tensor([True, True]), torch.Size([2, 1, 8]))
        >>> "rs_h" in env.observation_spec and "rs_h" in env.state_spec
        True
    """

    def __init__(self, env: EnvBase, transform: Transform | None = None) -> None:
        if not isinstance(env, EnvBase):
            raise TypeError(
                f"TransformedEnv: expected an EnvBase, received {type(env).__name__}. "
                f"Fix: wrap gymnasium envs with recurrl.envs.GymEnv first."
            )
        super().__init__(device=env.device, batch_size=env.batch_size)
        self.base_env = env
        self._specs = {}
        self._spec_cache_version: Any = None
        # A Compose given here becomes env.transform itself (no Compose-in-Compose).
        given_compose = isinstance(transform, Compose) and transform.parent is None
        self.transform = transform if given_compose else Compose()
        self.transform._set_parent(self)
        if given_compose:
            try:
                self._get_spec("observation")  # fail now on conflicting transforms
            except Exception:
                self.transform._set_parent(None)
                raise
        elif transform is not None:
            self.append_transform(transform)

    @property
    def batch_locked(self) -> bool:  # type: ignore[override]
        return self._modules["base_env"].batch_locked

    # --- specs ---------------------------------------------------------------------------
    def _specs_version(self) -> Any:
        # _modules[...]: the submodules without nn.Module.__getattr__ (these run every step)
        return (self._modules["base_env"]._specs_version(), self._version)

    def _get_spec(self, name: str) -> Composite:
        version = self._specs_version()
        if version != self._spec_cache_version or not self._specs:
            self._specs = self._compute_specs()
            self._spec_cache_version = version
        return self._specs[name]

    def _compute_specs(self) -> dict[str, Composite]:
        specs = {}
        for name, hook in _SPEC_HOOKS.items():
            spec = getattr(self.transform, hook)(self.base_env._get_spec(name).clone())
            if not isinstance(spec, Composite) or spec.shape != self.batch_size:
                raise TypeError(
                    f"{hook} of {self.transform!r} must return a Composite of shape "
                    f"{tuple(self.batch_size)}, received {spec!r}."
                )
            specs[name] = spec
        return specs

    def _set_spec(self, name: str, spec: Any, leaf_key: str | None = None) -> None:
        raise RuntimeError(
            f"TransformedEnv specs are derived from the base env and the transforms; set "
            f"env.base_env.{name}_spec instead, or change it with a transform's "
            f"transform_{name}_spec hook."
        )

    def _invalidate_specs(self) -> None:
        self._version += 1

    # --- transforms ----------------------------------------------------------------------
    def append_transform(self, transform: Transform) -> TransformedEnv:  # type: ignore[override]
        """Append ``transform`` in place and return ``self``.

        Specs are recomputed immediately, so a conflicting transform (e.g. a duplicate
        primer) raises here and is not added.
        """
        return self.insert_transform(len(self.transform), transform)

    def insert_transform(self, index: int, transform: Transform) -> TransformedEnv:
        """Insert ``transform`` at position ``index`` in place and return ``self``."""
        _check_transform(transform)
        present = [t for child in self.transform for t in _iter_transforms(child)]
        if any(t is transform for t in present):
            raise ValueError(
                f"{type(transform).__name__} is already in this env; a transform instance "
                f"can be added once. Fix: pass transform.clone()."
            )
        self.transform.insert(index, transform)
        self._invalidate_specs()
        try:
            self._get_spec("observation")
        except Exception:
            position = next(i for i, t in enumerate(self.transform) if t is transform)
            self.transform.pop(position)
            self._invalidate_specs()
            raise
        return self

    # --- reset / step --------------------------------------------------------------------
    def _reset_proc(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        mask = get_reset_mask(tensordict, self.batch_size)
        if mask is None or tensordict is None:
            out = self.base_env._reset_proc(tensordict, **kwargs)
            self.base_env._check_output(out, "reset")
            if tensordict is None:
                tensordict = TensorDict({}, batch_size=self.batch_size, device=self.device)
            return self.transform._reset(tensordict, out)
        kept, to_merge = self._partial_reset_keys()
        if not reset_mask_any_all(mask)[0]:
            return tensordict.select(*kept, strict=False)
        # Partial reset: the input holds *transformed* values, so the non-reset envs are
        # merged back here, after the transforms, not by the base env (an in-place
        # transform would be applied twice, a reshaped key would not fit the base spec).
        base = self._modules["base_env"]
        out = base._reset_proc(tensordict.exclude(*kept), **kwargs)
        base._check_output(out, "reset")
        out = self._modules["transform"]._reset(tensordict, out)
        return merge_reset(mask, out, tensordict, to_merge)

    def _partial_reset_keys(self) -> tuple[list[NestedKey], list[NestedKey]]:
        """The observation, state and done keys, and those a partial reset must merge
        (not merged by the transforms already); cached per specs version, which every
        change of the transforms bumps."""
        version = self._specs_version()
        cached = self.__dict__.get("_partial_reset_cache")
        if cached is None or cached[0] != version:
            kept = [k for k, _ in self._keys("observation", "state", "done")]
            merged = _merged_on_partial_reset(self.transform)
            cached = (version, kept, [k for k in kept if unravel_key(k) not in merged])
            self.__dict__["_partial_reset_cache"] = cached
        return cached[1], cached[2]

    def _step_proc(self, tensordict: TensorDictBase) -> TensorDictBase:
        base = self._modules["base_env"]
        next_td = base._step_proc(tensordict)
        base._check_output(next_td, "step")
        return self._modules["transform"]._step(tensordict, next_td)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        return self._reset_proc(tensordict, **kwargs)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._step_proc(tensordict)

    def _set_seed(self, seed: int | None) -> None:
        self.base_env.set_seed(seed)

    def _close(self) -> None:
        self.base_env.close()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.transform._set_parent(self)  # parents are dropped when transforms are copied

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            base = self.__dict__.get("_modules", {}).get("base_env")
            if base is None or name.startswith("_"):
                raise
            return getattr(base, name)


def find_transform(env: EnvBase, cls: type[T]) -> list[T]:
    """All transforms of class ``cls`` in ``env`` (through Compose and nested envs).

    ``env.transform`` (the Compose every TransformedEnv holds) is not itself listed.

    Args:
        env: any env; a plain env has none.
        cls: the transform class (subclasses match too).

    Returns:
        The matching transforms, innermost env first, in application order.

    Examples:
        >>> from recurrl.envs.transforms import InitTracker
        >>> from recurrl.testing import CountingEnv
        >>> env = TransformedEnv(CountingEnv(), InitTracker())
        >>> [type(t).__name__ for t in find_transform(env, InitTracker)]
        ['InitTracker']
        >>> find_transform(CountingEnv(), InitTracker)
        []
    """
    if not isinstance(env, TransformedEnv):
        return []
    found = find_transform(env.base_env, cls)
    for child in env.transform:  # env.transform itself is the container, not a match
        found += [t for t in _iter_transforms(child) if isinstance(t, cls)]
    return found
