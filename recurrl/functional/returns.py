"""Return and advantage estimators on ``[*B, T]`` tensors: GAE, TD(lambda), TD(0).

Pure tensor code (no TensorDict). Time is the last dim by default; pass ``time_dim=-2`` for
``[*B, T, 1]`` tensors (the layout of TensorDict entries such as ``("next", "reward")``).

Flags, all boolean and shaped like ``reward``:

* ``terminated[t]``: ``s_{t+1}`` is terminal; its value is 0 (no bootstrap).
* ``done[t]``: the trajectory stops after step ``t`` (terminated, truncated, or the end of a
  replayed slice). The recursion never looks past a ``done`` step; a done but not
  terminated step bootstraps with ``next_state_value[t]``.

The last step ``T - 1`` is always treated as done for the recursion (the data ends there), so
it bootstraps with ``next_state_value[T - 1]`` unless terminated.

The flags *select*: a terminal step never reads ``next_state_value`` and a done step never
reads the step after it, so a NaN or Inf there (a terminal observation a critic cannot
value, the next trajectory of the same row) stays out of the result. A 0/1 factor would
not do: ``0 * NaN = NaN``. With finite inputs the numbers are those of the factor form.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["generalized_advantage_estimate", "td0_return_estimate", "td_lambda_return_estimate"]


def _to_time_last(name: str, x: Tensor, shape: torch.Size, time_dim: int) -> Tensor:
    if x.shape != shape:
        raise ValueError(
            f"{name}: expected shape {list(shape)} (the shape of reward), received "
            f"{list(x.shape)}. Fix: give every input the same [*B, T] (or [*B, T, 1]) shape."
        )
    return x.movedim(time_dim, -1)


def _prepare(time_dim: int, reward: Tensor, **tensors: Tensor) -> tuple[Tensor, ...]:
    if reward.dim() == 0:
        raise ValueError("reward: expected at least one (time) dim, received a scalar.")
    shape = reward.shape
    out = [reward.movedim(time_dim, -1)]
    for name, x in tensors.items():
        x = _to_time_last(name, x, shape, time_dim)
        if name in ("done", "terminated"):
            x = x.bool()
        out.append(x)
    return tuple(out)


def td0_return_estimate(
    gamma: float,
    next_state_value: Tensor,
    reward: Tensor,
    terminated: Tensor,
    *,
    time_dim: int = -1,
) -> Tensor:
    """One-step TD target ``r_t + gamma * (1 - terminated_t) * V(s_{t+1})``.

    Args:
        gamma: discount.
        next_state_value: ``[*B, T]`` ``V(s_{t+1})``.
        reward: ``[*B, T]``.
        terminated: ``[*B, T]`` bool.
        time_dim: the time dim (``-1``, or ``-2`` for ``[*B, T, 1]``). Unused by TD(0) but
            accepted for a uniform signature.

    Returns:
        ``[*B, T]`` value target, same shape as ``reward``.

    Examples:
        >>> import torch
        >>> td0_return_estimate(0.5, torch.tensor([2.0, 2.0]), torch.tensor([1.0, 1.0]),
        ...                     torch.tensor([False, True]))
        tensor([2., 1.])
    """
    _prepare(time_dim, reward, next_state_value=next_state_value, terminated=terminated)
    term = terminated.bool()
    not_term = (~term).to(reward.dtype)
    return reward + (gamma * not_term * next_state_value).masked_fill(term, 0.0)


def generalized_advantage_estimate(
    gamma: float,
    lmbda: float,
    state_value: Tensor,
    next_state_value: Tensor,
    reward: Tensor,
    done: Tensor,
    terminated: Tensor,
    *,
    time_dim: int = -1,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimate (Schulman et al. 2016, arXiv:1506.02438).

    ``delta_t = r_t + gamma (1 - terminated_t) V(s_{t+1}) - V(s_t)`` and
    ``A_t = delta_t + gamma lmbda (1 - done_t) A_{t+1}``; ``value_target = A + V(s_t)``.

    Args:
        gamma: discount.
        lmbda: GAE lambda.
        state_value: ``[*B, T]`` ``V(s_t)``.
        next_state_value: ``[*B, T]`` ``V(s_{t+1})``.
        reward: ``[*B, T]``.
        done: ``[*B, T]`` bool, True where the trajectory stops after step ``t``.
        terminated: ``[*B, T]`` bool, True where ``s_{t+1}`` is terminal.
        time_dim: the time dim (``-1``, or ``-2`` for ``[*B, T, 1]``).

    Returns:
        ``(advantage, value_target)``, each shaped like ``reward``.

    Examples:
        >>> import torch
        >>> r = torch.tensor([0.0, 0.0, 1.0])
        >>> v = torch.zeros(3)
        >>> flag = torch.tensor([False, False, True])
        >>> adv, target = generalized_advantage_estimate(0.5, 1.0, v, v, r, flag, flag)
        >>> adv
        tensor([0.2500, 0.5000, 1.0000])
    """
    r, v, nv, d, term = _prepare(time_dim, reward, state_value=state_value,
                                 next_state_value=next_state_value, done=done,
                                 terminated=terminated)  # fmt: skip
    not_term = (~term).to(r.dtype)
    not_done = (~d).to(r.dtype)
    delta = r + (gamma * not_term * nv).masked_fill(term, 0.0) - v
    adv = torch.empty_like(delta)
    carry = torch.zeros_like(delta[..., 0])
    for t in range(delta.shape[-1] - 1, -1, -1):
        carry = delta[..., t] + (gamma * lmbda * not_done[..., t] * carry).masked_fill(
            d[..., t], 0.0
        )
        adv[..., t] = carry
    adv = adv.movedim(-1, time_dim)
    return adv, adv + state_value


def td_lambda_return_estimate(
    gamma: float,
    lmbda: float,
    next_state_value: Tensor,
    reward: Tensor,
    done: Tensor,
    terminated: Tensor,
    *,
    time_dim: int = -1,
) -> Tensor:
    """TD(lambda) return: ``G_t = r_t + gamma (1 - terminated_t) [(1 - lmbda) V(s_{t+1}) +
    lmbda G_{t+1}]``, with ``G_{t+1}`` replaced by ``V(s_{t+1})`` where ``done_t``.

    Args:
        gamma: discount.
        lmbda: lambda (0: TD(0); 1: Monte-Carlo return bootstrapped at trajectory ends).
        next_state_value: ``[*B, T]`` ``V(s_{t+1})``.
        reward: ``[*B, T]``.
        done: ``[*B, T]`` bool.
        terminated: ``[*B, T]`` bool.
        time_dim: the time dim (``-1``, or ``-2`` for ``[*B, T, 1]``).

    Returns:
        ``[*B, T]`` value target, shaped like ``reward``.

    Examples:
        >>> import torch
        >>> nv = torch.tensor([10.0, 10.0])
        >>> r = torch.tensor([1.0, 1.0])
        >>> truncated_end = torch.tensor([False, True])
        >>> td_lambda_return_estimate(0.5, 1.0, nv, r, truncated_end, torch.zeros(2).bool())
        tensor([4., 6.])
    """
    r, nv, d, term = _prepare(time_dim, reward, next_state_value=next_state_value, done=done,
                              terminated=terminated)  # fmt: skip
    not_term = (~term).to(r.dtype)
    not_done = (~d).to(r.dtype)
    out = torch.empty_like(r)
    carry = nv[..., -1]  # G_T := V(s_T): the last step bootstraps
    for t in range(r.shape[-1] - 1, -1, -1):
        boot = nv[..., t]
        later = boot + (lmbda * not_done[..., t] * (carry - boot)).masked_fill(d[..., t], 0.0)
        carry = r[..., t] + (gamma * not_term[..., t] * later).masked_fill(term[..., t], 0.0)
        out[..., t] = carry
    return out.movedim(-1, time_dim)
