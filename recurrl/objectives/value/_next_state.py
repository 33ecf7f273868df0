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


def _steps(flag: Tensor, batch_dims: int) -> Tensor:
    """``[*B, T, 1]`` -> ``[*B, T]``; an agent-level ``[*B, T, n, 1]`` -> ``[*B, T, n]``."""
    return flag.squeeze(-1) if flag.dim() > batch_dims and flag.shape[-1] == 1 else flag


def _match(flag: Tensor, shape: torch.Size, batch_dims: int) -> Tensor:
    """A step flag at the level of ``shape``: an env-level ``[*B, T]`` flag holds for every
    agent of ``[*B, T, n]``; an agent-level one holds for its env row where any agent's
    does."""
    if flag.shape == shape:
        return flag
    if flag.dim() == batch_dims and len(shape) > batch_dims:
        return flag.reshape(*flag.shape, *([1] * (len(shape) - batch_dims))).expand(shape)
    if flag.dim() > batch_dims and len(shape) == batch_dims:
        return flag.flatten(batch_dims).any(-1)
    raise ValueError(
        f"value estimator: a step flag of shape {list(flag.shape)} does not fit steps of "
        f"shape {list(shape)} (env-level [*B, T] or agent-level [*B, T, n_agents] expected)."
    )


def _restarts(is_init: Tensor, done: Tensor, tdim: int) -> Tensor:
    """``is_init`` (step-shaped), also True at every step that follows a done step."""
    eff = is_init.clone()
    t = eff.shape[tdim]
    if t > 1:
        eff.narrow(tdim, 1, t - 1).logical_or_(done.narrow(tdim, 0, t - 1))
    return eff


def _init_keys_of(network: nn.Module) -> list[NestedKey]:
    """The ``is_init`` key of every recurrent module inside ``network`` (``"is_init"``, or
    ``(group, "is_init")`` for a module with an agent dim)."""
    keys: list[NestedKey] = []
    for m in network.modules():
        if isinstance(m, RecurrentModule) and m.in_keys and m.in_keys[-1] not in keys:
            keys.append(m.in_keys[-1])
    return keys


def _module_restarts(
    td: TensorDictBase, init_key: NestedKey, fallback_done: Tensor, what: str
) -> Tensor:
    """Where a module reading ``init_key`` restarts: its ``is_init``, and the steps after a
    done of its level (``("next", *group, "done")``, else ``fallback_done``); an agent
    module also restarts wherever its env row does."""
    bd, tdim = td.batch_dims, td.batch_dims - 1
    key = (init_key,) if isinstance(init_key, str) else tuple(init_key)
    init = _steps(_flag(td, init_key, what), bd)
    done = td.get(("next", *key[:-1], "done"), None)
    done = fallback_done if done is None else _steps(done.bool(), bd)
    eff = _restarts(init, _match(done, init.shape, bd), tdim)
    if len(key) > 1 and td.get(IS_INIT_KEY, None) is not None:
        env_done = td.get(("next", "done"), None)
        env_done = _steps(env_done.bool(), bd) if env_done is not None else None
        env = _steps(_flag(td, IS_INIT_KEY, what), bd)
        env = _restarts(env, env_done if env_done is not None else torch.zeros_like(env), tdim)
        eff = eff | _match(env, eff.shape, bd)
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

    With agents, the flags may be per agent (``is_init_key=("agents", "is_init")``,
    ``done_key=("next", "agents", "done")``, ``[*B, T, n_agents, 1]``) and ``out_key`` an
    agent-level value ``[*B, T, n_agents, 1]``; every recurrent module restarts at its own
    ``is_init`` (env-level or per agent) and after the done steps of its level.
    """
    if td.batch_dims < 1:
        raise ValueError(f"{what}: expected a TensorDict with a time dim, batch_size=[].")
    bd, tdim = td.batch_dims, td.batch_dims - 1
    done = _steps(_flag(td, done_key, what), bd)
    init_keys = _init_keys_of(network)
    if td.get(is_init_key, None) is None and not init_keys:
        # feed-forward network on data without InitTracker: done alone marks boundaries
        is_init = torch.zeros_like(done)
    else:
        is_init = _steps(_flag(td, is_init_key, what), bd)
    if is_init.dim() > done.dim():
        done = _match(done, is_init.shape, bd)
    eff = _restarts(_match(is_init, done.shape, bd), done, tdim)
    work = td.copy()
    work.set(is_init_key, _match(eff, is_init.shape, bd).unsqueeze(-1))
    if eff.dim() == bd:
        work.set(IS_INIT_KEY, eff.unsqueeze(-1))  # what env-level modules read
    restarts = [eff]
    for key in init_keys:
        if key == IS_INIT_KEY and eff.dim() == bd:
            continue
        m_eff = _module_restarts(td, key, done, what)
        work.set(key, m_eff.unsqueeze(-1))
        restarts.append(m_eff)
    with set_recurrent_mode(True):
        out = network(work)
    value = out.get(out_key)
    with torch.no_grad():
        nxt = td.get("next").copy()
        for key in state_keys_of(network):
            nxt.set(key, out.get(("next", key)).detach())
        for key in {IS_INIT_KEY, *init_keys}:
            like = td.get(key, None)
            nxt.set(key, torch.zeros_like(eff.unsqueeze(-1) if like is None else like.bool()))
        with set_recurrent_mode(False):
            one_step = network(nxt).get(out_key)
        t = value.shape[tdim]
        shifted = torch.cat([value.narrow(tdim, 1, t - 1), value.narrow(tdim, t - 1, 1)], tdim)
        agents = [r.shape[bd] for r in restarts if r.dim() > bd]
        per_agent = bool(agents) and value.dim() >= bd + 2 and value.shape[bd] == agents[0]
        steps = value.shape[: bd + 1] if per_agent else td.batch_size
        starts = torch.stack([_match(r, steps, bd) for r in restarts]).any(0)
        ends = torch.ones_like(starts)
        ends.narrow(tdim, 0, t - 1).copy_(starts.narrow(tdim, 1, t - 1))
        ends = ends.reshape(*steps, *([1] * (value.dim() - len(steps))))
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
