"""``ClipPPOLoss``: clipped PPO (Schulman et al. 2017, arXiv:1707.06347) for recurrent actors.

Actor convention (no probabilistic wrapper needed): the actor network writes distribution
parameters, ``"logits"`` (``Categorical``) or ``"loc"``/``"scale"`` (``Normal`` or
``TanhNormal``, independent over the last action dim); the collected batch holds
``"action"`` and ``"sample_log_prob"`` (the behaviour policy's log-probability), and
``"advantage"``/``"value_target"`` written by :class:`~recurrl.objectives.GAE`. Actor and
critic may share a recurrent trunk (both run it, in recurrent mode, on the same batch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torch import Tensor
from torch import distributions as D
from torch.nn import functional as F

from recurrl.objectives.common import (
    LossModule,
    masked_mean,
    masked_normalize,
    per_step,
    real_steps,
)

__all__ = ["ClipPPOLoss"]

_DISTRIBUTIONS = ("auto", "categorical", "normal", "tanh_normal")
_CRITIC_LOSSES = ("l2", "smooth_l1")
_TANH_EPS = 1e-6


def _tanh_normal(loc: Tensor, scale: Tensor) -> D.Distribution:
    base = D.Normal(loc, scale)
    return D.TransformedDistribution(base, [D.TanhTransform(cache_size=1)])


class ClipPPOLoss(LossModule):
    """Clipped PPO loss with a value loss and an entropy bonus, masked over padded steps.

    Args:
        actor_network: TensorDict module writing ``"logits"`` or ``"loc"`` and ``"scale"``.
        critic_network: TensorDict module writing ``"state_value"`` ``[*B, 1]``.

    Keyword Args:
        clip_epsilon: ratio clip range. Default 0.2.
        entropy_coef: weight of ``loss_entropy = -entropy_coef * entropy``. Default 0.01.
        critic_coef: weight of the value loss. Default 1.0.
        normalize_advantage: normalize the advantage over real steps. Default False.
        clip_value: if given, clip ``V - V_old`` to ``[-clip_value, clip_value]`` and take the
            larger of the clipped/unclipped losses (``V_old`` = ``"state_value"`` stored by
            ``GAE``). Default None.
        distribution: ``"auto"`` (``"categorical"`` if the actor writes logits, else
            ``"normal"``), ``"categorical"``, ``"normal"``, ``"tanh_normal"``, or a callable
            ``(loc, scale) -> Distribution`` over the actor's ``loc``/``scale`` whose
            ``log_prob`` of an action gives one value per step (e.g. a tanh-squashed
            Gaussian rescaled to the action's bounds, wrapped in ``Independent(d, 1)``);
            its ``entropy()`` is the entropy bonus.
        loss_critic_type: ``"l2"`` (``0.5 (V - target)^2``) or ``"smooth_l1"``.

    Returns a TensorDict with ``loss_objective``, ``loss_critic``, ``loss_entropy`` (sum them
    to train) and the detached diagnostics ``entropy``, ``kl_approx`` (mean of ``log
    pi_old - log pi``), ``clip_fraction``.

    Batch shapes: ``[B]`` (flat slices), ``[N, T]``; with ``("collector", "mask")`` padded
    steps are excluded from every term. Actions ``[*B]`` (categorical) or ``[*B, A]``.

    Agents (MAPPO/IPPO): with the keys set to a group's entries (``set_keys(advantage=
    ("agents", "advantage"), action=("agents", "action"), ...)``, all at once with
    :func:`~recurrl.objectives.multiagent_ppo_loss`) every term is per agent ``[*B,
    n_agents]``: the advantage ``[*B, n_agents, 1]`` sets the shape, actions are ``[*B,
    n_agents]`` (categorical) or ``[*B, n_agents, A]``, a value of the env row ``[*B, 1]``
    holds for all its agents; steps where ``mask=("agents", "mask")`` is False are excluded
    from every term and from the advantage normalization, as are padded steps.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule as Mod
        >>> actor = Mod(torch.nn.Linear(3, 2), ["obs"], ["logits"])
        >>> critic = Mod(torch.nn.Linear(3, 1), ["obs"], ["state_value"])
        >>> td = TensorDict({"obs": torch.randn(8, 3), "action": torch.randint(0, 2, (8,)),
        ...     "sample_log_prob": torch.full((8,), -0.7), "advantage": torch.randn(8, 1),
        ...     "value_target": torch.randn(8, 1)}, [8])
        >>> out = ClipPPOLoss(actor, critic)(td)
        >>> sorted(out.keys())
        ['clip_fraction', 'entropy', 'kl_approx', 'loss_critic', 'loss_entropy', 'loss_objective']
        >>> (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
    """

    @dataclass
    class _AcceptedKeys:
        """Key names read from the batch and written by the actor/critic."""

        advantage: NestedKey = "advantage"
        value_target: NestedKey = "value_target"
        value: NestedKey = "state_value"
        action: NestedKey = "action"
        sample_log_prob: NestedKey = "sample_log_prob"
        logits: NestedKey = "logits"
        loc: NestedKey = "loc"
        scale: NestedKey = "scale"
        mask: NestedKey = ("collector", "mask")

    def __init__(
        self,
        actor_network: TensorDictModuleBase,
        critic_network: TensorDictModuleBase,
        *,
        clip_epsilon: float = 0.2,
        entropy_coef: float = 0.01,
        critic_coef: float = 1.0,
        normalize_advantage: bool = False,
        clip_value: float | None = None,
        distribution: str | Callable[[Tensor, Tensor], D.Distribution] = "auto",
        loss_critic_type: str = "l2",
    ) -> None:
        super().__init__()
        for name, net in (("actor_network", actor_network), ("critic_network", critic_network)):
            if not isinstance(net, TensorDictModuleBase):
                raise ValueError(
                    f"ClipPPOLoss: {name} must be a tensordict.nn module, received "
                    f"{type(net).__name__}. Fix: wrap it in TensorDictModule(net, in_keys, "
                    f"out_keys)."
                )
        if not callable(distribution) and distribution not in _DISTRIBUTIONS:
            raise ValueError(
                f"ClipPPOLoss: distribution must be one of {_DISTRIBUTIONS} or a callable "
                f"(loc, scale) -> Distribution, received {distribution!r}."
            )
        if loss_critic_type not in _CRITIC_LOSSES:
            raise ValueError(
                f"ClipPPOLoss: loss_critic_type must be one of {_CRITIC_LOSSES}, received "
                f"{loss_critic_type!r}."
            )
        if clip_epsilon <= 0 or (clip_value is not None and clip_value <= 0):
            raise ValueError(
                f"ClipPPOLoss: clip_epsilon and clip_value must be positive, received "
                f"clip_epsilon={clip_epsilon!r}, clip_value={clip_value!r}."
            )
        self.actor_network = actor_network
        self.critic_network = critic_network
        self.clip_epsilon = float(clip_epsilon)
        self.entropy_coef = float(entropy_coef)
        self.critic_coef = float(critic_coef)
        self.normalize_advantage = normalize_advantage
        self.clip_value = clip_value
        self.distribution = distribution
        self.loss_critic_type = loss_critic_type

    # ------------------------------------------------------------------ distribution
    def get_distribution(self, params: TensorDictBase) -> D.Distribution:
        """The action distribution from the actor's output (``[*B]`` batch, events last)."""
        k = self.tensor_keys
        kind = self.distribution
        if callable(kind):
            return kind(_actor_param(params, k.loc, "loc"), _actor_param(params, k.scale, "scale"))
        if kind == "auto":
            kind = "categorical" if k.logits in params.keys(True) else "normal"
        if kind == "categorical":
            return D.Categorical(logits=_actor_param(params, k.logits, "logits"))
        loc = _actor_param(params, k.loc, "loc")
        scale = _actor_param(params, k.scale, "scale")
        base = D.Normal(loc, scale) if kind == "normal" else _tanh_normal(loc, scale)
        return D.Independent(base, 1)

    def _log_prob_and_entropy(self, dist: D.Distribution, action: Tensor) -> tuple[Tensor, Tensor]:
        if isinstance(dist, D.Categorical):
            if action.dim() == dist.logits.dim():  # [*B, 1]
                action = action.squeeze(-1)
            return dist.log_prob(action.long()), dist.entropy()
        # any other distribution (a subclass's get_distribution) gives [*B] log-probs itself
        if isinstance(getattr(dist, "base_dist", None), D.TransformedDistribution):
            action = action.clamp(-1 + _TANH_EPS, 1 - _TANH_EPS)
            # no closed form: one-sample estimate -log pi(a~pi) (differentiable, rsample)
            entropy = -dist.log_prob(dist.rsample())
            return dist.log_prob(action), entropy
        return dist.log_prob(action), dist.entropy()

    # ------------------------------------------------------------------ terms
    def _critic_loss(self, td: TensorDictBase, mask: Tensor | None, steps: torch.Size) -> Tensor:
        k = self.tensor_keys
        out = self.critic_network(td.copy())
        value = _per_step_or_row(out, k.value, "ClipPPOLoss critic", steps)
        target = per_step(td, k.value_target, "ClipPPOLoss", steps).detach()
        loss = self._distance(value, target)
        if self.clip_value is not None:
            what = "ClipPPOLoss (clip_value needs the stored values)"
            old = _per_step_or_row(td, k.value, what, steps)
            old = old.detach()
            clipped = old + (value - old).clamp(-self.clip_value, self.clip_value)
            loss = torch.maximum(loss, self._distance(clipped, target))
        return self.critic_coef * masked_mean(loss, mask)

    def _distance(self, value: Tensor, target: Tensor) -> Tensor:
        if self.loss_critic_type == "l2":
            return 0.5 * (value - target).pow(2)
        return F.smooth_l1_loss(value, target, reduction="none")

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        k = self.tensor_keys
        td = tensordict
        steps = _steps_of(td, k.advantage)
        mask = real_steps(td, k.mask, steps)
        what = "ClipPPOLoss (run GAE on the batch first)"
        adv = per_step(td, k.advantage, what, steps).detach()
        if self.normalize_advantage:
            adv = masked_normalize(adv, mask)
        old_log_prob = per_step(td, k.sample_log_prob, "ClipPPOLoss", steps).detach()
        action = td.get(k.action, None)
        if action is None:
            raise KeyError(f"ClipPPOLoss: action key {k.action!r} not found in the batch.")
        dist = self.get_distribution(self.actor_network(td.copy()))
        log_prob, entropy = self._log_prob_and_entropy(dist, action)
        if log_prob.shape != steps:
            raise ValueError(
                f"ClipPPOLoss: log-probabilities have shape {list(log_prob.shape)}, expected "
                f"the steps' shape {list(steps)}. Check the action shape "
                f"{list(action.shape)} and the distribution parameters' shapes."
            )
        ratio = (log_prob - old_log_prob).exp()
        eps = self.clip_epsilon
        gain = torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
        ent = masked_mean(entropy, mask)
        return TensorDict(
            {
                "loss_objective": -masked_mean(gain, mask),
                "loss_critic": self._critic_loss(td, mask, steps),
                "loss_entropy": -self.entropy_coef * ent,
                "entropy": ent.detach(),
                "kl_approx": masked_mean(old_log_prob - log_prob, mask).detach(),
                "clip_fraction": masked_mean(
                    ((ratio - 1).abs() > eps).to(ratio.dtype), mask
                ).detach(),
            },
            batch_size=[],
        )


def _actor_param(params: TensorDictBase, key: NestedKey, what: str) -> Tensor:
    value = params.get(key, None)
    if value is None:
        raise KeyError(
            f"ClipPPOLoss: the actor did not write {what} key {key!r} (it wrote "
            f"{sorted(map(str, params.keys(True, True)))}). Expected 'logits' (categorical) "
            f"or 'loc' and 'scale' (normal); fix the actor's out_keys or loss.set_keys()."
        )
    return value


def _steps_of(td: TensorDictBase, advantage_key: NestedKey) -> torch.Size:
    """The shape of one loss term: the batch ``[*B]``, or ``[*B, n_agents]`` where the
    advantage is per agent (``[*B, n_agents, 1]``, e.g. under ``("agents", "advantage")``)."""
    adv = td.get(advantage_key, None)
    if adv is not None and adv.dim() == td.batch_dims + 2 and adv.shape[-1] == 1:
        return adv.shape[:-1]
    return td.batch_size


def _per_step_or_row(td: TensorDictBase, key: NestedKey, what: str, steps: torch.Size) -> Tensor:
    """``per_step`` at ``steps``; a value of the env row (``[*B, 1]``, one centralized value
    for every agent of the row) is the same for each of its agents."""
    x = td.get(key, None)
    if x is not None and len(steps) > td.batch_dims and x.dim() == td.batch_dims + 1:
        row = per_step(td, key, what)
        return row.reshape(*row.shape, *([1] * (len(steps) - td.batch_dims))).expand(steps)
    return per_step(td, key, what, steps)
