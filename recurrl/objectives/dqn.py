"""``DQNLoss``: (double) DQN for recurrent Q-networks on replayed slices, with burn-in.

The Q-network writes ``"action_value"`` ``[*B, num_actions]``. It runs in recurrent mode
over the batch; ``Q(s_{t+1}, .)`` is read from the same pass at ``t + 1`` inside a
trajectory and from one sequential step on ``("next", ...)`` with the recomputed
``("next", h)`` at trajectory ends (see ``recurrl/objectives/value/_next_state.py``), for the
online network (double DQN's argmax) and the target network alike.

Burn-in (R2D2, Kapturowski et al. 2019): the first ``burn_in`` steps of every sequence (from
``t = 0`` and from every ``is_init``, i.e. every replayed slice start) only warm the hidden
state up from the stored one and are masked out of the loss, for flat ragged slices, padded
slices (``("collector", "mask")``) and ``[B, T]`` batches alike; the target network runs
over the same slices from the same stored states. By default gradients still flow back into
them through the hidden state of later steps; ``burn_in_stop_gradient=True`` stops them
there, as R2D2 does. Optionally, sequences that start an episode (exact zero state) are not
burned in (``burn_in_episode_starts=False``).

Targets are one-step or ``n_steps``-step returns cut at every sequence end, optionally
through R2D2's value rescaling (``value_rescale=True``: ``h(sum_i gamma^i r_i + gamma^n
h^-1(Q'))``, :func:`~recurrl.functional.signed_hyperbolic`).

Prioritized replay: a batch with ``"_weight"`` (per step, from
:class:`~recurrl.data.PrioritizedSliceSampler`) weights each step's loss by it, and every
call writes the per-step ``|TD error|`` into the input TensorDict under ``"td_error"`` (0 at
the steps out of the loss), for the replay buffer's priority update.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torch import Tensor, nn
from torch.nn import functional as F

from recurrl.functional.returns import td0_return_estimate
from recurrl.functional.value_rescale import signed_hyperbolic, signed_parabolic
from recurrl.modules.q_value import action_space_name
from recurrl.objectives.common import (
    LossModule,
    burn_in_mask,
    masked_mean,
    per_step,
    step_mask,
)
from recurrl.objectives.value._next_state import (
    restart_from_reached_state,
    values_and_next_values,
)

__all__ = ["DQNLoss"]

_LOSSES = ("smooth_l1", "l2", "l1")


def _next(key: NestedKey) -> tuple[str, ...]:
    return ("next", *((key,) if isinstance(key, str) else key))


class DQNLoss(LossModule):
    """(Double) DQN loss for a possibly recurrent Q-network.

    Args:
        value_network: TensorDict module writing ``"action_value"`` ``[*B, num_actions]``.

    Keyword Args:
        double_dqn: pick the next action with the online network and evaluate it with the
            target network. Default True.
        gamma: discount. Default 0.99.
        burn_in: steps at the start of every sequence (from ``t = 0`` and from every
            ``is_init``, i.e. every replayed slice start) that only warm up the hidden state
            from the stored one: they are masked out of the loss. Default 0, as tapes
            (:class:`~recurrl.data.TapeSampler`) need: each of their sequences is a whole
            episode from its exact initial state.
        n_steps: multi-step target ``sum_{i<m} gamma^i r_{t+i} + gamma^m Q'(s_{t+m})`` with
            ``m = n_steps``, or fewer where the sequence ends first (a ``done`` step, the
            step before an ``is_init``, the batch end: bootstrapped there unless terminated).
            Default 1 (the one-step DQN target).
        burn_in_episode_starts: also burn in sequences that start an episode. With False, a
            sequence whose first step has ``"step_count"`` 0 (an episode start: its stored
            state is the exact initial state, not a stale one) is not burned in; else
            episodes shorter than ``burn_in`` steps, and the first ``burn_in`` steps of every
            episode, would never be trained. Needs ``"step_count"`` in the batch (written by
            :class:`~recurrl.envs.StepCounter`). Default True (R2D2: every sequence).
        delay_value: keep a target network (``loss.target_value_network``, synced by
            :class:`HardUpdate`/:class:`SoftUpdate`); else bootstrap with the online network
            (without gradient). Default True.
        loss_function: ``"smooth_l1"``, ``"l2"`` or ``"l1"``. Default ``"smooth_l1"``.
        value_rescale: R2D2's invertible value rescaling (Pohlen et al. 2018): the network
            regresses ``h(G)`` and targets are ``h(sum_{i<m} gamma^i r_{t+i} + gamma^m
            h^-1(Q'(s_{t+m})))`` with ``h`` = :func:`~recurrl.functional.signed_hyperbolic`,
            ``h^-1`` = :func:`~recurrl.functional.signed_parabolic`. Q-values are then in
            the rescaled space (greedy actions are unchanged: ``h`` is increasing). Default
            False.
        burn_in_stop_gradient: R2D2's stop-gradient at the end of the burn-in: the online
            network's trained steps start from the hidden state the burn-in reached,
            detached, so no gradient reaches the burn-in steps (their inputs, or the stored
            state). Costs one more pass of the online network without gradient. Default False
            (gradients flow back through the burn-in via the hidden state).
        value_rescale_eps: the ``eps`` of ``h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x``.
            Default ``1e-3`` (R2D2).
        action_space: how ``"action"`` is read: ``"categorical"`` (an index ``[*B]`` or
            ``[*B, 1]``), ``"one_hot"`` (``[*B, num_actions]``, any dtype), or the env's
            action spec (``Categorical`` / ``OneHot``), as the reference takes it. Default
            ``None``: floating and bool actions are one-hot, integer ones indices.

    Prioritized replay (keys ``priority_weight`` = ``"_weight"`` and ``priority`` =
    ``"td_error"``, renamed with :meth:`set_keys`): if the batch has ``"_weight"`` ``[*B]``
    (or ``[*B, 1]``), as :class:`~recurrl.data.PrioritizedSliceSampler` writes per step,
    the loss is ``sum_t w_t l_t / K`` over the ``K`` steps in the loss (:meth:`loss_mask`):
    the mean of the weighted step losses, not divided by the sum of the weights. The
    sampler already divides the weights by their largest possible value, so ``w <= 1`` and
    the weights only scale steps down, as in prioritized replay (Schaul et al. 2015).
    Every call also writes ``|target - Q(s, a)|`` per step into the input TensorDict under
    ``"td_error"`` (``[*B]``, detached, 0 at burn-in and padded steps); the priority of a
    replayed slice is computed from it over the :meth:`loss_mask` steps only
    (:func:`~recurrl.functional.sequence_priority`).

    Batch: ``"action"`` (integer ``[*B]``/``[*B, 1]`` or one-hot ``[*B, num_actions]``),
    ``"is_init"``, ``("next", "reward"|"done"|"terminated")``, optionally
    ``("collector", "mask")``. Returns a TensorDict with ``"loss"`` and the detached
    ``"td_error"`` mean.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> q = TensorDictModule(torch.nn.Linear(2, 3), ["obs"], ["action_value"])
        >>> td = TensorDict({"obs": torch.randn(6, 2), "action": torch.randint(0, 3, (6,)),
        ...     "is_init": torch.zeros(6, 1, dtype=torch.bool),
        ...     "next": {"obs": torch.randn(6, 2), "reward": torch.ones(6, 1),
        ...              "done": torch.zeros(6, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(6, 1, dtype=torch.bool)}}, [6])
        >>> loss = DQNLoss(q, burn_in=2)
        >>> loss(td)["loss"].backward()
    """

    @dataclass
    class _AcceptedKeys:
        """Key names; ``reward``/``done``/``terminated`` are read under ``"next"``."""

        action_value: NestedKey = "action_value"
        action: NestedKey = "action"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"
        is_init: NestedKey = "is_init"
        mask: NestedKey = ("collector", "mask")
        step_count: NestedKey = "step_count"
        priority: NestedKey = "td_error"
        priority_weight: NestedKey = "_weight"

    def __init__(
        self,
        value_network: TensorDictModuleBase,
        *,
        double_dqn: bool = True,
        gamma: float = 0.99,
        burn_in: int = 0,
        delay_value: bool = True,
        loss_function: str = "smooth_l1",
        n_steps: int = 1,
        burn_in_episode_starts: bool = True,
        value_rescale: bool = False,
        value_rescale_eps: float = 1e-3,
        burn_in_stop_gradient: bool = False,
        action_space: str | object | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(value_network, TensorDictModuleBase):
            raise ValueError(
                f"DQNLoss: value_network must be a tensordict.nn module writing "
                f"'action_value', received {type(value_network).__name__}. Fix: "
                f"TensorDictModule(net, in_keys=[...], out_keys=['action_value'])."
            )
        if loss_function not in _LOSSES:
            raise ValueError(
                f"DQNLoss: loss_function must be one of {_LOSSES}, received {loss_function!r}."
            )
        if not isinstance(burn_in, int) or isinstance(burn_in, bool) or burn_in < 0:
            raise ValueError(
                f"DQNLoss: expected burn_in to be an int >= 0 (steps masked out at every "
                f"sequence start), received {burn_in!r}."
            )
        if not isinstance(n_steps, int) or isinstance(n_steps, bool) or n_steps < 1:
            raise ValueError(
                f"DQNLoss: expected n_steps to be an int >= 1 (1: one-step target), received "
                f"{n_steps!r}."
            )
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"DQNLoss: expected gamma in [0, 1], received {gamma!r}.")
        if not isinstance(value_rescale, bool):
            raise ValueError(
                f"DQNLoss: expected value_rescale to be a bool, received {value_rescale!r}."
            )
        if (
            isinstance(value_rescale_eps, bool) or not isinstance(value_rescale_eps, (int, float))
            or not value_rescale_eps >= 0
        ):  # fmt: skip
            raise ValueError(
                f"DQNLoss: expected value_rescale_eps to be a number >= 0, received "
                f"{value_rescale_eps!r}; fix: value_rescale_eps=1e-3 (R2D2)."
            )
        self.value_network = value_network
        self.target_value_network: nn.Module | None = None
        if delay_value:
            target = copy.deepcopy(value_network)
            target.requires_grad_(False)
            self.target_value_network = target
        self.double_dqn = double_dqn
        self.gamma = float(gamma)
        self.burn_in = burn_in
        self.n_steps = n_steps
        self.burn_in_episode_starts = bool(burn_in_episode_starts)
        self.delay_value = delay_value
        self.loss_function = loss_function
        self.value_rescale = value_rescale
        self.burn_in_stop_gradient = bool(burn_in_stop_gradient)
        self.value_rescale_eps = float(value_rescale_eps)
        self.action_space = (
            None if action_space is None else action_space_name(action_space, owner="DQNLoss")
        )

    def _target_network_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        if self.target_value_network is None:
            return []
        return [(self.value_network, self.target_value_network)]

    def _chosen(self, q: Tensor, action: Tensor, batch_dims: int) -> Tensor:
        one_hot = action.dtype.is_floating_point or action.dtype == torch.bool
        if self.action_space is not None:
            one_hot = self.action_space == "one_hot"
        if one_hot:
            if action.shape != q.shape:
                raise ValueError(
                    f"DQNLoss: a one-hot action must have the shape of the action values "
                    f"{list(q.shape)}, received {list(action.shape)}."
                )
            return (q * action.to(q.dtype)).sum(-1)
        if action.dim() == batch_dims + 1 and action.shape[-1] == 1:
            action = action.squeeze(-1)
        if action.dim() != batch_dims:
            raise ValueError(
                f"DQNLoss: integer actions must be [*B] or [*B, 1] with batch dims "
                f"{list(q.shape[:batch_dims])}, received {list(action.shape)}."
            )
        return q.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)

    def _next_q(self, td: TensorDictBase, q_next_online: Tensor) -> Tensor:
        k = self.tensor_keys
        kw = {"is_init_key": k.is_init, "done_key": _next(k.done), "what": "DQNLoss"}
        if self.target_value_network is None:
            q_next_target = q_next_online
        else:
            with torch.no_grad():
                _, q_next_target = values_and_next_values(
                    self.target_value_network, td, k.action_value, **kw
                )
        if self.double_dqn:
            best = q_next_online.argmax(-1, keepdim=True)
            return q_next_target.gather(-1, best).squeeze(-1)
        return q_next_target.max(-1).values

    def _n_step(self, td: TensorDictBase, target: Tensor, q_next: Tensor, reward: Tensor,
                term: Tensor) -> Tensor:  # fmt: skip
        """Extend the one-step ``target`` to ``n_steps`` steps inside every sequence."""
        k = self.tensor_keys
        rows = (lambda x: x.unsqueeze(0)) if td.batch_dims == 1 else (lambda x: x)
        done = rows(per_step(td, _next(k.done), "DQNLoss").bool())
        is_init = td.get(k.is_init, None)
        ends = done.clone()  # no step t + 1 of the same sequence after t
        ends[..., -1] = True
        if is_init is not None:
            ends[..., :-1] |= rows(per_step(td, k.is_init, "DQNLoss").bool())[..., 1:]
        one_step, q_next, reward = rows(target), rows(q_next), rows(reward)
        not_term = (~rows(term)).to(reward.dtype)
        g = one_step
        for _ in range(self.n_steps - 1):
            later = torch.cat([g[..., 1:], g[..., -1:]], -1)  # G_{t+1}; unused at ends
            g = torch.where(ends, one_step, reward + self.gamma * not_term * later)
        return g.reshape(target.shape)

    def _burned_in(self, td: TensorDictBase) -> Tensor:
        """``[*B]`` True at the first ``burn_in`` steps of every sequence (not of those that
        start an episode, with ``burn_in_episode_starts=False``)."""
        k = self.tensor_keys
        is_init = td.get(k.is_init, None)
        if is_init is None:
            raise KeyError(
                f"DQNLoss: burn_in={self.burn_in} needs {k.is_init!r} marking every sequence "
                f"(slice) start. Fix: sample with SliceSampler from data collected with "
                f"InitTracker, or use burn_in=0."
            )
        is_init = per_step(td, k.is_init, "DQNLoss").bool()
        burned = burn_in_mask(is_init, self.burn_in)
        if self.burn_in_episode_starts:
            return burned
        step_count = td.get(k.step_count, None)
        if step_count is None:
            raise KeyError(
                f"DQNLoss: burn_in_episode_starts=False needs {k.step_count!r} (steps since the "
                f"episode start) in the batch. Fix: add StepCounter() to the env, rename the key "
                f"with set_keys(step_count=...), or use burn_in_episode_starts=True."
            )
        step_count = per_step(td, k.step_count, "DQNLoss")
        idx = torch.arange(is_init.shape[-1], device=is_init.device).expand_as(is_init)
        starts = is_init.clone()
        starts[..., 0] = True
        first = torch.where(starts, idx, torch.zeros_like(idx)).cummax(-1).values
        fresh = step_count.gather(-1, first) == 0  # the sequence starts an episode
        return burned & ~fresh

    def loss_mask(self, tensordict: TensorDictBase) -> Tensor:
        """``[*B]`` bool: the steps that enter the loss (and the priorities): real steps
        (``("collector", "mask")``) that are not burned in.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from tensordict.nn import TensorDictModule
            >>> q = TensorDictModule(torch.nn.Linear(2, 3), ["obs"], ["action_value"])
            >>> is_init = torch.tensor([True, False, False, True, False])
            >>> td = TensorDict({"is_init": is_init.unsqueeze(-1)}, [5])
            >>> DQNLoss(q, burn_in=1).loss_mask(td)
            tensor([False,  True,  True, False,  True])
        """
        mask = step_mask(tensordict, self.tensor_keys.mask)
        if self.burn_in:
            keep = ~self._burned_in(tensordict)
            mask = keep if mask is None else mask & keep
        if mask is None:
            mask = torch.ones(tensordict.batch_size, dtype=torch.bool, device=tensordict.device)
        return mask

    def _weights(self, td: TensorDictBase) -> Tensor | None:
        """``[*B]`` importance weights of a prioritized sample, or None."""
        key = self.tensor_keys.priority_weight
        if td.get(key, None) is None:
            return None
        return per_step(td, key, "DQNLoss")

    def _distance(self, q: Tensor, target: Tensor) -> Tensor:
        if self.loss_function == "smooth_l1":
            return F.smooth_l1_loss(q, target, reduction="none")
        if self.loss_function == "l2":
            return (q - target).pow(2)
        return (q - target).abs()

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        k = self.tensor_keys
        td = tensordict
        kw = {"is_init_key": k.is_init, "done_key": _next(k.done), "what": "DQNLoss"}
        online = td
        if self.burn_in and self.burn_in_stop_gradient:
            burned = self._burned_in(td)
            cut = torch.zeros_like(burned)  # the first step after each burn-in
            cut[..., 1:] = burned[..., :-1] & ~burned[..., 1:]
            online = restart_from_reached_state(self.value_network, td, cut, **kw)
        q, q_next_online = values_and_next_values(self.value_network, online, k.action_value, **kw)
        action = td.get(k.action, None)
        if action is None:
            raise KeyError(f"DQNLoss: action key {k.action!r} not found in the batch.")
        q_sa = self._chosen(q, action, td.batch_dims)
        with torch.no_grad():
            q_next = self._next_q(td, q_next_online)
            if self.value_rescale:  # bootstrap in the raw return space
                q_next = signed_parabolic(q_next, self.value_rescale_eps)
            reward = per_step(td, _next(k.reward), "DQNLoss").to(q.dtype)
            term = per_step(td, _next(k.terminated), "DQNLoss").bool()
            target = td0_return_estimate(self.gamma, q_next, reward, term)
            if self.n_steps > 1:
                target = self._n_step(td, target, q_next, reward, term)
            if self.value_rescale:
                target = signed_hyperbolic(target, self.value_rescale_eps)
        mask = self.loss_mask(td)
        step_loss = self._distance(q_sa, target)
        weight = self._weights(td)
        if weight is not None:  # mean of w_t * l_t over the K steps in the loss
            step_loss = step_loss * weight.to(step_loss.dtype)
        loss = masked_mean(step_loss, mask)
        with torch.no_grad():
            error = (q_sa - target).abs().masked_fill(~mask, 0.0)
        # as the reference: written into the input for the buffer's priority update
        td.set(k.priority, error)
        return TensorDict({"loss": loss, "td_error": masked_mean(error, mask)}, batch_size=[])
