"""The action distributions of ``recurrl train``'s policies and their samplers: categorical
(one or several factors), and the tanh-squashed Gaussian rescaled to an action box, with the
bounds and heads that build them. Re-exported by :mod:`recurrl.trainers.models`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import distributions as D
from torch import nn
from torch.distributions import Categorical
from torch.nn import functional as F

from recurrl.modules import MLP

__all__ = [
    "BoundedActions",
    "CategoricalSampler",
    "FactorizedCategorical",
    "FactorizedCategoricalSampler",
    "GaussianParams",
    "ScaledTanhNormal",
    "TanhNormalSampler",
    "check_action_bounds",
    "gaussian_head",
    "squashed_gaussian",
]

#: range of the Gaussian's log standard deviation (before the tanh)
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
#: squashed actions are clamped to (-1 + eps, 1 - eps) before atanh (as ClipPPOLoss does)
TANH_EPS = 1e-6


class CategoricalSampler(nn.Module):
    """``logits -> (action, sample_log_prob)``: a sample (or the mode) of ``Categorical``."""

    def __init__(self, deterministic: bool = False) -> None:
        super().__init__()
        self.deterministic = deterministic

    def forward(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dist = Categorical(logits=logits)
        action = dist.mode if self.deterministic else dist.sample()
        return action, dist.log_prob(action)


class FactorizedCategorical(D.Distribution):
    """A product of independent categoricals: the policy of a ``MultiDiscrete`` action.

    ``logits`` ``[*B, sum(nvec)]`` are the ``K = len(nvec)`` dimensions' logits one after
    the other (dimension ``k`` owns ``nvec[k]`` of them). An action is an int ``[*B, K]``
    (entry ``k`` in ``[0, nvec[k])``); ``log_prob`` and ``entropy`` are ``[*B]``, the sums
    of the dimensions' (independence); :attr:`mode` is the per-dimension argmax (a product
    of independent factors is largest where each factor is). Batch shape ``[*B]``, event
    shape ``[K]``.

    Examples:
        >>> d = FactorizedCategorical(torch.tensor([[0.0, 9.0, 0.0, 0.0, 9.0]]), [2, 3])
        >>> d.mode.tolist(), d.sample().shape, d.log_prob(torch.tensor([[1, 2]])).shape
        ([[1, 2]], torch.Size([1, 2]), torch.Size([1]))
        >>> round(FactorizedCategorical(torch.zeros(5), [2, 3]).entropy().item(), 4)  # log 6
        1.7918
    """

    arg_constraints: dict = {}

    def __init__(self, logits: torch.Tensor, nvec: Sequence[int]) -> None:
        self.nvec = tuple(int(n) for n in nvec)
        if not self.nvec or min(self.nvec) < 1 or logits.shape[-1:] != (sum(self.nvec),):
            raise ValueError(
                f"FactorizedCategorical: expected logits [*B, sum(nvec)] = [*B, "
                f"{sum(self.nvec)}] for nvec={list(self.nvec)} (non-empty, counts >= 1), "
                f"received logits of shape {list(logits.shape)}."
            )
        self.logits = logits
        self.parts = [
            Categorical(logits=part, validate_args=False)
            for part in logits.split(self.nvec, dim=-1)
        ]
        super().__init__(logits.shape[:-1], torch.Size([len(self.nvec)]), validate_args=False)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008
        with torch.no_grad():
            return torch.stack([p.sample(sample_shape) for p in self.parts], dim=-1)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if value.shape[-1:] != (len(self.nvec),):
            raise ValueError(
                f"FactorizedCategorical: expected actions [*B, {len(self.nvec)}] (one index "
                f"per dimension of nvec={list(self.nvec)}), received {list(value.shape)}."
            )
        value = value.long()
        return sum(p.log_prob(value[..., k]) for k, p in enumerate(self.parts))

    def entropy(self) -> torch.Tensor:
        return sum(p.entropy() for p in self.parts)

    @property
    def mode(self) -> torch.Tensor:
        """The most likely action: each dimension's argmax, ``[*B, K]``."""
        return torch.stack([p.logits.argmax(-1) for p in self.parts], dim=-1)


class FactorizedCategoricalSampler(nn.Module):
    """``logits -> (action, sample_log_prob)``: a sample (or the mode) of
    :class:`FactorizedCategorical`; action int ``[*B, K]``, log-prob ``[*B]``.

    Examples:
        >>> action, log_prob = FactorizedCategoricalSampler([4, 4])(torch.zeros(3, 8))
        >>> action.shape, action.dtype, round(log_prob[0].item(), 4)  # -2 log 4
        (torch.Size([3, 2]), torch.int64, -2.7726)
    """

    def __init__(self, nvec: Sequence[int], deterministic: bool = False) -> None:
        super().__init__()
        self.nvec = tuple(int(n) for n in nvec)
        self.deterministic = deterministic

    def forward(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dist = FactorizedCategorical(logits, self.nvec)
        action = dist.mode if self.deterministic else dist.sample()
        return action, dist.log_prob(action)


def _log_dtanh(u: torch.Tensor) -> torch.Tensor:
    """``log(1 - tanh(u)^2)``, computed stably as ``2 (log 2 - u - softplus(-2u))``."""
    return 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))


class ScaledTanhNormal(D.Distribution):
    """``low + (high - low) (tanh(u) + 1) / 2`` with ``u ~ Normal(loc, scale)``, per entry.

    Every sample lies strictly inside ``[low, high]``. The density of an action ``a``
    (``y = (2a - high - low) / (high - low)``, ``u = atanh(y)``) is
    ``Normal(loc, scale).pdf(u) / ((1 - y^2) (high - low) / 2)``: the tanh's and the
    rescaling's Jacobians. ``y`` is clamped to ``(-1 + 1e-6, 1 - 1e-6)`` first, so actions on
    the bounds keep a finite log-probability. There is no closed-form entropy:
    :meth:`entropy` is the one-sample estimate ``-log p(a)``, ``a`` a reparameterized
    sample (differentiable). Batch shape ``[*B, A]`` (wrap it in ``Independent(d, 1)`` for
    one log-probability per action vector); ``low``/``high`` broadcast to ``loc``.

    Examples:
        >>> d = ScaledTanhNormal(torch.zeros(2, 1), torch.ones(2, 1), torch.tensor([-2.0]),
        ...                      torch.tensor([2.0]))
        >>> a = d.sample()
        >>> bool(((a > -2) & (a < 2)).all()), d.mode.tolist()
        (True, [[0.0], [0.0]])
        >>> d.log_prob(torch.zeros(2, 1)).flatten().tolist()  # log N(0; 0, 1) - log 2
        [-1.6120857000350952, -1.6120857000350952]
    """

    arg_constraints: dict = {}
    has_rsample = True

    def __init__(
        self, loc: torch.Tensor, scale: torch.Tensor, low: torch.Tensor, high: torch.Tensor
    ) -> None:
        self.loc, self.scale = loc, scale
        self.mid = (high + low) / 2
        self.half = (high - low) / 2
        super().__init__(loc.shape, validate_args=False)

    def _squash(self, u: torch.Tensor) -> torch.Tensor:
        return self.mid + self.half * torch.tanh(u)

    def _log_prob_pre(self, u: torch.Tensor) -> torch.Tensor:
        """Log-density of the action ``squash(u)``, from the pre-tanh value ``u``."""
        normal = D.Normal(self.loc, self.scale, validate_args=False)
        return normal.log_prob(u) - _log_dtanh(u) - torch.log(self.half)

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008
        shape = self._extended_shape(sample_shape)
        u = self.loc + self.scale * torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        return self._squash(u)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008
        with torch.no_grad():
            return self.rsample(sample_shape)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        y = ((value - self.mid) / self.half).clamp(-1 + TANH_EPS, 1 - TANH_EPS)
        return self._log_prob_pre(torch.atanh(y))

    def entropy(self) -> torch.Tensor:
        u = self.loc + self.scale * torch.randn_like(self.loc)
        return -self._log_prob_pre(u)

    @property
    def mode(self) -> torch.Tensor:
        """The squashed, rescaled mean ``squash(loc)`` (the greedy action)."""
        return self._squash(self.loc)


def squashed_gaussian(
    loc: torch.Tensor, scale: torch.Tensor, low: torch.Tensor, high: torch.Tensor
) -> D.Independent:
    """:class:`ScaledTanhNormal` with the action dim as the event: ``log_prob`` ``[*B]``."""
    return D.Independent(ScaledTanhNormal(loc, scale, low, high), 1, validate_args=False)


def check_action_bounds(
    who: str, action_bounds: tuple[object, object], n_actions: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(low, high)`` as float32 ``[n_actions]`` tensors, checked: finite, ``low < high``.

    Raises:
        ValueError: naming ``who``, on other shapes or bounds.

    Examples:
        >>> check_action_bounds("me", ([-1.0, 0.0], [1.0, 2.0]), 2)[1].tolist()
        [1.0, 2.0]
    """
    low, high = (torch.as_tensor(b, dtype=torch.float32) for b in action_bounds)
    if low.shape != (n_actions,) or high.shape != (n_actions,):
        raise ValueError(
            f"{who}: action_bounds must be two [{n_actions}] tensors (n_actions={n_actions}), "
            f"received shapes {list(low.shape)} and {list(high.shape)}."
        )
    finite = torch.isfinite(low).all() and torch.isfinite(high).all()
    if not (finite and (low < high).all()):
        raise ValueError(
            f"{who}: action_bounds must be finite with low < high, received "
            f"low={low.tolist()}, high={high.tolist()}. Fix: rescale the action space "
            f"(gymnasium.wrappers.RescaleAction) and register the wrapped env."
        )
    return low, high


class BoundedActions:
    """Mixin of the actor-critics (:class:`ActorCritic`, the multi-agent one): continuous
    actions in ``(low, high)`` bounds, kept as buffers (not in the state_dict: they come from
    the env), and the tanh-squashed Gaussian over them (:func:`squashed_gaussian`)."""

    continuous: bool

    def _set_action_bounds(
        self, action_bounds: tuple[object, object] | None, n_actions: int
    ) -> None:
        """Check and keep ``action_bounds`` (``None``: discrete actions)."""
        self.continuous = action_bounds is not None
        if action_bounds is not None:
            low, high = check_action_bounds(type(self).__name__, action_bounds, n_actions)
            self.register_buffer("action_low", low, persistent=False)  # type: ignore[attr-defined]
            self.register_buffer("action_high", high, persistent=False)  # type: ignore[attr-defined]

    def distribution(self, loc: torch.Tensor, scale: torch.Tensor) -> D.Distribution:
        """The continuous policy's distribution (:func:`squashed_gaussian`) for the actor's
        ``loc`` and ``scale`` ``[*B, A]``; ``log_prob`` of an action ``[*B, A]`` is ``[*B]``
        (any leading dims, e.g. ``[*B, n_agents]``)."""
        if not self.continuous:
            raise ValueError(
                f"{type(self).__name__}.distribution: this model has discrete actions (its "
                f"actor writes logits). Fix: build it with action_bounds for continuous actions."
            )
        return squashed_gaussian(loc, scale, self.action_low, self.action_high)  # type: ignore[attr-defined]


def gaussian_head(width: int, n_actions: int, action_std: str) -> nn.Sequential:
    """``[*B, width] -> (loc, scale)`` ``[*B, n_actions]`` each: an MLP and
    :class:`GaussianParams` (the std one parameter per entry, or per state with
    ``action_std="state"``).

    Examples:
        >>> loc, scale = gaussian_head(8, 2, "parameter")(torch.zeros(5, 8))
        >>> loc.shape, scale.shape
        (torch.Size([5, 2]), torch.Size([5, 2]))
    """
    state_scale = action_std == "state"
    outs = 2 * n_actions if state_scale else n_actions
    return nn.Sequential(MLP(width, outs, num_cells=width), GaussianParams(n_actions, state_scale))


class GaussianParams(nn.Module):
    """``x -> (loc, scale)`` of a Gaussian over ``n_actions`` entries.

    Args:
        n_actions: ``A``.
        state_scale: the scale is learned per state (``x`` is ``[*B, 2A]``: means, then
            log-stds); else ``x`` is ``[*B, A]`` (the means) and the log-std is one learned
            parameter per action entry, initialized to ``init_log_std``.

    The log-std is clamped to ``[LOG_STD_MIN, LOG_STD_MAX]`` = ``[-5, 2]``.

    Examples:
        >>> loc, scale = GaussianParams(3)(torch.zeros(4, 3))
        >>> loc.shape, scale.shape, scale[0, 0].item()
        (torch.Size([4, 3]), torch.Size([4, 3]), 1.0)
    """

    def __init__(self, n_actions: int, state_scale: bool = False, init_log_std: float = 0.0):
        super().__init__()
        self.n_actions = n_actions
        self.log_std = (
            None if state_scale else nn.Parameter(torch.full((n_actions,), float(init_log_std)))
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.log_std is None:
            loc, log_std = x.chunk(2, dim=-1)
        else:
            loc, log_std = x, self.log_std.expand_as(x)
        return loc, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp()


class TanhNormalSampler(nn.Module):
    """``(loc, scale) -> (action, sample_log_prob)``: a sample (or the mode) of
    :class:`ScaledTanhNormal` in ``[low, high]``; action ``[*B, A]``, log-prob ``[*B]``.

    The log-probability is computed from the action (as the loss recomputes it), so the
    first PPO ratio is exactly 1.
    """

    def __init__(self, low: torch.Tensor, high: torch.Tensor, deterministic: bool = False) -> None:
        super().__init__()
        self.low, self.high = low, high
        self.deterministic = deterministic

    def forward(self, loc: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dist = squashed_gaussian(loc, scale, self.low, self.high)
        action = dist.base_dist.mode if self.deterministic else dist.sample()
        return action, dist.log_prob(action)
