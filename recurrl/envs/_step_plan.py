"""The step loop of collection, planned once: step, next root, partial reset.

A collector (and :meth:`EnvBase.step_and_maybe_reset`) runs the same three operations at
every step: ``env.step``, ``env.step_mdp`` and, where an env finished, ``env.reset`` of
those envs. The public methods re-derive at every call what does not change between calls
(which keys ride to the next root, the reset mask's form, the key lists of a partial
reset, the public methods' argument checks) and a ``TransformedEnv`` adds a level of
indirection to each. :class:`StepPlan` derives those once and then calls the very hooks the
public methods call, in the same order, with the same arguments: the base env's
``_step_proc`` / ``_reset_proc``, the transforms' ``_step`` / ``_reset`` and the output
checks. It is therefore the same computation, not a second implementation of it; tests
compare it with the public path over random transforms, masks and keys.

The planned path is taken only once the env and its base env have had their first calls
validated in full (``_check_output`` checks the first calls of each kind against the
specs), for a ``TransformedEnv`` whose base env is not itself transformed and whose keys are
top-level strings; anything else goes through the public methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase

from recurrl.envs.utils import (
    RESET_KEY,
    count_true,
    merge_reset,
    prime_reset_mask,
    set_next,
    tensordict_of_checked,
    update_checked,
    write_checked,
)

if TYPE_CHECKING:
    from recurrl.envs.common import EnvBase

__all__ = ["MdpPlan", "StepPlan"]


class MdpPlan:
    """``env.step_mdp`` with its key bookkeeping done once instead of at every step.

    ``step_mdp`` filters every leaf key by prefix at every step; while the top-level keys of
    the step (and of its ``"next"``) are the same, the root keys to keep and the ``"next"``
    keys to promote are the same, so they are listed once and reused. Only built when every
    key involved is a top-level string (:meth:`build` returns ``None`` otherwise).
    """

    def __init__(self, keep: list[str], promote: list[str]) -> None:
        self.keep = keep
        self.promote = promote

    @classmethod
    def build(cls, env: EnvBase, td: TensorDictBase) -> MdpPlan | None:
        """The plan for steps holding the keys of ``td`` (a step with ``"next"``)."""
        promoted = [*env.observation_keys, *env.state_keys, *env.done_keys]
        dropped = [*env.action_keys, *env.reward_keys]
        if not all(isinstance(k, str) for k in (*promoted, *dropped)):
            return None
        next_keys = set(td.get("next").keys())
        promote = [k for k in dict.fromkeys(promoted) if k in next_keys]
        skip = {"next", RESET_KEY, *dropped, *promote}
        return cls([k for k in td.keys() if k not in skip], promote)  # noqa: SIM118

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        if type(td) is TensorDict:
            # A plain TensorDict's get(str) is a lookup in its dict: done directly (eight
            # gets a step cost several µs); a missing key takes the generic path's error.
            inner = td._tensordict
            nxt = inner.get("next")
            if type(nxt) is TensorDict:
                try:
                    source = {k: inner[k] for k in self.keep}
                    next_inner = nxt._tensordict
                    for k in self.promote:
                        source[k] = next_inner[k]
                except KeyError:
                    pass
                else:
                    return tensordict_of_checked(source, td._batch_size, td._device)
        nxt = td.get("next")
        source = {k: td.get(k) for k in self.keep}
        for k in self.promote:
            source[k] = nxt.get(k)
        return tensordict_of_checked(source, td.batch_size, td.device)


class StepPlan:
    """``step``, next root and partial reset of one env, planned once (see the module doc).

    Get one with ``env._step_plan()`` (cached per specs version). The env's batch is
    ``[*B]``.

    Examples:
        >>> from recurrl.envs import TransformedEnv
        >>> from recurrl.envs.transforms import InitTracker
        >>> from recurrl.testing import CountingEnv
        >>> env = TransformedEnv(CountingEnv(batch_size=[2], max_steps=2), InitTracker())
        >>> plan = env._step_plan()
        >>> root = env.reset()
        >>> for _ in range(3):
        ...     td, root = plan(env.rand_action(root))
        >>> root["is_init"].squeeze(-1).tolist()
        [False, False]
    """

    def __init__(self, env: EnvBase) -> None:
        from recurrl.envs.common import _FULL_CHECKS, EnvBase
        from recurrl.envs.transforms.transform import Compose, TransformedEnv, _iter_transforms

        self.env = env
        self.batch_size = env.batch_size
        self._full = _FULL_CHECKS
        keys = ["done"] if "done" in env.done_spec else env.done_keys
        self.done_keys: list[tuple[str, ...]] = [("next", *_as_tuple(k)) for k in keys]
        #: the single done key's name under "next" when it is a plain string, else None
        only = self.done_keys[0] if len(self.done_keys) == 1 else ()
        self._next_done = only[1] if len(only) == 2 else None
        self.action_keys: list[NestedKey] = list(env.action_keys)
        self.base: EnvBase | None = None
        self._ready = {"step": False, "reset": False}
        self._mdp: tuple[tuple, MdpPlan | None] | None = None
        if not isinstance(env, TransformedEnv):
            return
        base = env.base_env
        if (
            isinstance(base, TransformedEnv)
            or base.device != env.device
            or type(base)._reset_proc is not EnvBase._reset_proc
            or type(env)._reset_proc is not TransformedEnv._reset_proc
            or type(env)._step_proc is not TransformedEnv._step_proc
        ):
            return  # an env that changes the plumbing keeps it
        kept, to_merge = env._partial_reset_keys()
        base_kept = [k for k, _ in base._keys("observation", "state", "done")]
        names = (*kept, *base_kept, *self.action_keys, *env.reward_keys)
        if not all(isinstance(k, str) for k in names) or not set(base_kept) <= set(kept):
            return
        self.base = base
        self.transform = env.transform
        self.kept, self.to_merge = kept, to_merge
        self._kept_set = frozenset(kept)
        # Transforms with fused forms in their own class body (see Transform._fused_step).
        leaves = [t for t in _iter_transforms(env.transform) if not isinstance(t, Compose)]
        self.fused = [t for t in leaves if _has_fused(t)] if all(map(_has_fused, leaves)) else None

    @property
    def planned(self) -> bool:
        """Whether steps and resets skip the public methods' plumbing (``False``: the
        public methods run; same results)."""
        return self.base is not None

    def _is_ready(self, kind: str) -> bool:
        # The first calls of each kind go through the public methods, which validate them
        # in full against the specs; afterwards the planned path runs the same hooks.
        if self._ready[kind]:
            return True
        env, base = self.env, self.base
        ready = min(env._checked_calls[kind], base._checked_calls[kind]) >= self._full
        self._ready[kind] = ready
        return ready

    # --- the three operations ------------------------------------------------------------
    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """``env.step(tensordict)``: the same TensorDict (``"next"`` written) and errors."""
        env, base = self.env, self.base
        if (
            base is None
            or not self._is_ready("step")
            or not isinstance(tensordict, TensorDictBase)
            or tensordict.batch_size != self.batch_size
            or not self._has_actions(tensordict)
        ):
            return env.step(tensordict)  # argument errors are the public method's
        next_td = base._step_proc(tensordict)
        base._check_output(next_td, "step")
        new: dict = {}
        if self.fused is not None and all(
            t._fused_step(tensordict, next_td, new) for t in self.fused
        ):
            write_checked(next_td, new)
        else:
            next_td = self.transform._step(tensordict, next_td)
        env._check_output(next_td, "step")
        set_next(tensordict, next_td)
        return tensordict

    def _has_actions(self, tensordict: TensorDictBase) -> bool:
        keys = self.action_keys
        if type(tensordict) is TensorDict and len(keys) == 1 and type(keys[0]) is str:
            return tensordict._tensordict.get(keys[0]) is not None  # get(str), directly
        return all(tensordict.get(k, None) is not None for k in keys)

    def done(self, tensordict: TensorDictBase) -> torch.Tensor:
        """``[*B]`` bool: the envs whose step in ``tensordict`` finished an episode (any
        done key set; ``"done"`` alone when the env has it)."""
        flag = None
        if type(tensordict) is TensorDict and self._next_done is not None:
            nxt = tensordict._tensordict.get("next")  # get(str) of plain TensorDicts, directly
            if type(nxt) is TensorDict:
                flag = nxt._tensordict.get(self._next_done)
        flags = [flag] if flag is not None else [tensordict.get(k) for k in self.done_keys]
        if len(flags) == 1:
            flag = flags[0]  # [*B, 1]: the usual case
            if flag.shape[-1:] == (1,):
                return flag.squeeze(-1)
            return flag.reshape(*self.batch_size, -1).any(-1)
        return torch.cat([f.reshape(*self.batch_size, -1) for f in flags], -1).any(-1)

    def next_root(self, tensordict: TensorDictBase) -> TensorDictBase:
        """``env.step_mdp(tensordict)``: a new TensorDict, the root of the next step."""
        if type(tensordict) is TensorDict:
            nxt = tensordict._tensordict.get("next")
            if type(nxt) is TensorDict:  # plain TensorDicts: their keys are their dicts'
                signature = (tuple(tensordict._tensordict), tuple(nxt._tensordict))
            else:
                nxt = tensordict.get("next")
                signature = (tuple(tensordict.keys()), tuple(nxt.keys()))
        else:
            nxt = tensordict.get("next")
            signature = (tuple(tensordict.keys()), tuple(nxt.keys()))
        if self._mdp is None or self._mdp[0] != signature:
            self._mdp = (signature, MdpPlan.build(self.env, tensordict))
        plan = self._mdp[1]
        return plan(tensordict) if plan is not None else self.env.step_mdp(tensordict)

    def reset(
        self, root: TensorDictBase, done: torch.Tensor, count: int | None = None
    ) -> TensorDictBase:
        """Reset the envs flagged in ``done`` (``[*B]`` bool) and write the reset values into
        ``root``, as ``root["_reset"] = done[..., None]; root.update(env.reset(root))``
        (without leaving ``"_reset"``) does. ``count``, when the caller has it, is
        ``int(done.sum())``. Returns ``root``."""
        env, base = self.env, self.base
        flag = done.unsqueeze(-1)
        if base is None or not self._is_ready("reset") or root.batch_size != self.batch_size:
            root.set(RESET_KEY, flag)
            try:
                out = env.reset(root)
            finally:
                del root[RESET_KEY]
            root.update(out)
            return root
        if count is None:
            count = count_true(done)
        if not count:
            return root
        full = count == done.numel()
        if full:
            # Every env resets: the public method drops the mask and resets in full.
            out = self._base_reset(root.copy())
        else:
            # The base env sees no current values: they are the transformed ones, merged
            # back after the transforms (as TransformedEnv._reset_proc does). For a plain
            # root its input (root's other entries and the mask) is built at once.
            if type(root) is TensorDict and root._maybe_names() is None:
                kept = self._kept_set
                source = {k: v for k, v in root._tensordict.items() if k not in kept}
                source[RESET_KEY] = flag
                given = tensordict_of_checked(source, root.batch_size, root.device)
            else:
                given = root.copy()
                given.set(RESET_KEY, flag)
                given = given.exclude(*self.kept)
            # the mask's readers (env, base env, gymnasium wrapper) get `done` and its
            # count as they would read them from `flag`, without reading it again
            prime_reset_mask(flag, done, count)
            out = self._base_reset(given)
        mask = None if full else done
        new: dict = {}
        # The fused forms read the current values from root itself (they only read, and
        # take the mask as an argument); the hooks' fallback gets root's copy with the mask.
        if self.fused is not None and all(t._fused_reset(root, out, new, mask) for t in self.fused):
            write_checked(out, new)
        else:
            given = root.copy()
            if not full:
                given.set(RESET_KEY, flag)
            out = self.transform._reset(given, out)
        if not full:
            out = merge_reset(done, out, root, self.to_merge)
        env._check_output(out, "reset")
        update_checked(root, out)
        return root

    def _base_reset(self, given: TensorDictBase) -> TensorDictBase:
        """``base._reset_proc(given)`` for an input without current values of the base's
        keys (its merge has nothing to merge): ``_reset``, done keys completed, checked."""
        base = self.base
        out = base._completed_reset(base._reset(given))
        base._check_output(out, "reset")
        return out

    def __call__(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """``env.step_and_maybe_reset(tensordict)``: ``(tensordict, root)``."""
        tensordict = self.step(tensordict)
        root = self.next_root(tensordict)
        done = self.done(tensordict)
        count = count_true(done)
        if count:
            root = self.reset(root, done, count)
        return tensordict, root


def _has_fused(transform: object) -> bool:
    own = type(transform).__dict__
    return "_fused_step" in own and "_fused_reset" in own


def _as_tuple(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)
