"""Values of ``s_t`` and ``s_{t+1}`` from one (possibly recurrent) network.

A recurrent network's value of ``s_{t+1}`` depends on the hidden state after step ``t``. For
a step ``t`` followed by ``t + 1`` in the same trajectory, that is exactly the network's
output at ``t + 1`` of the recurrent-mode pass (same observation ``("next", obs)[t] ==
obs[t + 1]``, same hidden state), so it is read from the shifted output. At a trajectory end
(the last step, the step before an ``is_init``, or a ``done`` step) there is no ``t + 1`` in
the batch: the network runs one step in sequential mode on the ``"next"`` sub-TensorDict with
the hidden state ``("next", h)`` that the recurrent pass just computed (exact at trajectory
ends, by the recurrent-mode contract) and ``is_init`` False.

A ``done`` step not followed by ``is_init`` (data that does not mark resets) is made a
trajectory end for this pass, so no state crosses it.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torch import Tensor, nn

from recurrl.modules.recurrent import RecurrentModule
from recurrl.modules.recurrent_mode import set_recurrent_mode

__all__ = ["restart_from_reached_state", "state_keys_of", "values_and_next_values"]

IS_INIT_KEY = "is_init"


def state_keys_of(network: nn.Module) -> list[NestedKey]:
    """The hidden-state keys of every recurrent module inside ``network``."""
    keys: list[NestedKey] = []
    for m in network.modules():
        if isinstance(m, RecurrentModule):
            keys.extend(k for k in m.state_keys if k not in keys)
    return keys


def _flag(td: TensorDictBase, key: NestedKey, what: str) -> Tensor:
    x = td.get(key, None)
    if x is None:
        raise KeyError(
            f"{what}: key {key!r} not found. Value estimation needs episode boundaries: "
            f"('next', 'done'), and 'is_init' (written by InitTracker) for recurrent "
            f"networks. Fix: collect with a recurrl Collector / sample with SliceSampler, or "
            f"rename keys with set_keys()."
        )
    if x.dim() == td.batch_dims:
        x = x.unsqueeze(-1)
    return x.bool()


def _effective_is_init(is_init: Tensor, done: Tensor) -> Tensor:
    """``is_init`` ``[*B, T, 1]``, also True at every step that follows a done step."""
    eff = is_init.clone()
    eff[..., 1:, :] |= done[..., :-1, :]
    return eff


def values_and_next_values(
    network: TensorDictModuleBase,
    td: TensorDictBase,
    out_key: NestedKey,
    *,
    is_init_key: NestedKey = "is_init",
    done_key: NestedKey = ("next", "done"),
    what: str = "value estimator",
) -> tuple[Tensor, Tensor]:
    """Run ``network`` over ``td`` ``[*B, T]`` and return ``(value, next_value)``.

    ``value`` (the network's ``out_key`` at every step, ``[*B, T, *F]``) keeps its graph;
    ``next_value`` (same shape) is the value of ``s_{t+1}`` and is computed without gradient.
    ``td`` is not modified.
    """
    if td.batch_dims < 1:
        raise ValueError(f"{what}: expected a TensorDict with a time dim, batch_size=[].")
    if td.get(is_init_key, None) is None and not state_keys_of(network):
        # feed-forward network on data without InitTracker: done alone marks boundaries
        done = _flag(td, done_key, what)
        is_init = torch.zeros_like(done)
    else:
        is_init = _flag(td, is_init_key, what)
    eff = _effective_is_init(is_init, _flag(td, done_key, what))
    work = td.copy()
    work.set(is_init_key, eff)
    work.set(IS_INIT_KEY, eff)  # what recurrent modules read, whatever the loss calls it
    with set_recurrent_mode(True):
        out = network(work)
    value = out.get(out_key)
    with torch.no_grad():
        nxt = td.get("next").copy()
        for key in state_keys_of(network):
            nxt.set(key, out.get(("next", key)).detach())
        nxt.set(IS_INIT_KEY, torch.zeros_like(eff))
        with set_recurrent_mode(False):
            one_step = network(nxt).get(out_key)
        tdim = td.batch_dims - 1
        t = value.shape[tdim]
        shifted = torch.cat([value.narrow(tdim, 1, t - 1), value.narrow(tdim, t - 1, 1)], tdim)
        ends = torch.ones_like(eff)
        ends[..., :-1, :] = eff[..., 1:, :]
        ends = ends.reshape(*td.batch_size, *([1] * (value.dim() - td.batch_dims)))
        next_value = torch.where(ends, one_step, shifted.detach())
    return value, next_value


def restart_from_reached_state(
    network: TensorDictModuleBase,
    td: TensorDictBase,
    cut: Tensor,
    *,
    is_init_key: NestedKey = "is_init",
    done_key: NestedKey = ("next", "done"),
    what: str = "value estimator",
) -> TensorDictBase:
    """A copy of ``td`` in which every step marked by ``cut`` ``[*B, T]`` starts a sequence
    (``is_init`` True) from the hidden state ``network`` reached at the step before it,
    detached: a recurrent-mode pass over the copy gives the same outputs as over ``td`` but
    no gradient crosses a cut (R2D2's stop-gradient at the end of the burn-in).

    The reached state is ``("next", h)`` of one recurrent-mode pass without gradient in which
    the cut steps already start sequences, so the step before each is a trajectory end, where
    ``("next", h)`` is exact. Steps that start a trajectory anyway (``is_init``, or after a
    done step) and ``t = 0`` are never cut: they restart from their stored state. A network
    without recurrent modules gets ``td`` back.
    """
    keys = state_keys_of(network)
    if not keys:
        return td
    eff = _effective_is_init(_flag(td, is_init_key, what), _flag(td, done_key, what))
    cut = cut.reshape(eff.shape).bool() & ~eff
    cut[..., 0, :] = False
    starts = eff | cut
    work = td.copy()
    work.set(is_init_key, starts)
    work.set(IS_INIT_KEY, starts)
    with torch.no_grad(), set_recurrent_mode(True):
        out = network(work)
    tdim = td.batch_dims - 1
    t = cut.shape[tdim]
    restarted = td.copy()
    for key in keys:
        reached = out.get(("next", key)).detach()
        before = torch.cat([reached.narrow(tdim, 0, 1), reached.narrow(tdim, 0, t - 1)], tdim)
        where = cut.reshape(*cut.shape, *([1] * (reached.dim() - cut.dim())))
        restarted.set(key, torch.where(where, before, td.get(key)))
    restarted.set(is_init_key, starts)
    return restarted
