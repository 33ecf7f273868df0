"""Tests of recurrl.trainers.distributions: the factorized categorical of multi-discrete
actions and the tanh-squashed, rescaled Gaussian of bounded continuous actions."""

from __future__ import annotations

import math

import pytest
import torch
from torch import distributions as D
from torch.distributions import Categorical

from recurrl.trainers.distributions import (
    FactorizedCategorical,
    FactorizedCategoricalSampler,
    ScaledTanhNormal,
    squashed_gaussian,
)

LOW, HIGH = torch.tensor([-1.0, 0.0]), torch.tensor([3.0, 0.5])


# ---------------------------------------------------------------- multi-discrete actions
NVEC = (3, 1, 4)


def _per_dim(logits: torch.Tensor) -> list[Categorical]:
    """The reference: one torch Categorical per dimension, sliced by hand."""
    return [Categorical(logits=logits[..., 0:3]), Categorical(logits=logits[..., 3:4]),
            Categorical(logits=logits[..., 4:8])]  # fmt: skip


def test_factorized_log_prob_and_entropy_are_the_sums_over_dimensions():
    torch.manual_seed(0)
    logits = torch.randn(5, 6, 8) * 3
    dist = FactorizedCategorical(logits, NVEC)
    action = torch.stack([torch.randint(0, n, (5, 6)) for n in NVEC], dim=-1)
    ref = _per_dim(logits)
    expected = sum(d.log_prob(action[..., k]) for k, d in enumerate(ref))
    assert dist.batch_shape == (5, 6) and dist.event_shape == (3,)
    torch.testing.assert_close(dist.log_prob(action), expected)
    torch.testing.assert_close(dist.entropy(), sum(d.entropy() for d in ref))
    # the probabilities of all 12 joint actions of one state sum to 1
    joint = torch.cartesian_prod(*(torch.arange(n) for n in NVEC))
    one = FactorizedCategorical(logits[0, 0].expand(len(joint), 8), NVEC)
    torch.testing.assert_close(one.log_prob(joint).exp().sum(), torch.tensor(1.0))


def test_factorized_greedy_is_the_per_dimension_argmax_and_samples_stay_in_range():
    torch.manual_seed(0)
    logits = torch.randn(200, 8)
    dist = FactorizedCategorical(logits, NVEC)
    expected = torch.stack([d.logits.argmax(-1) for d in _per_dim(logits)], dim=-1)
    assert torch.equal(dist.mode, expected) and dist.mode.shape == (200, 3)
    sample = dist.sample()
    assert sample.shape == (200, 3) and sample.dtype == torch.int64
    assert ((sample >= 0) & (sample < torch.tensor(NVEC))).all()
    assert sample[:, 0].unique().numel() == 3 and sample[:, 2].unique().numel() == 4
    # the sampler stores the log-probability the loss recomputes
    action, log_prob = FactorizedCategoricalSampler(NVEC)(logits)
    torch.testing.assert_close(log_prob, dist.log_prob(action))
    greedy, _ = FactorizedCategoricalSampler(NVEC, deterministic=True)(logits)
    assert torch.equal(greedy, expected)


def test_factorized_shapes_are_checked():
    with pytest.raises(ValueError, match=r"expected logits \[\*B, sum\(nvec\)\] = \[\*B, 8\]"):
        FactorizedCategorical(torch.zeros(2, 7), NVEC)
    with pytest.raises(ValueError, match=r"expected actions \[\*B, 3\]"):
        FactorizedCategorical(torch.zeros(2, 8), NVEC).log_prob(torch.zeros(2, dtype=torch.long))


# ---------------------------------------------------------------- bounded continuous actions
def test_log_prob_is_the_hand_computed_density_with_both_jacobians():
    torch.manual_seed(0)
    loc, scale = torch.randn(5, 2), torch.rand(5, 2) + 0.2
    action = LOW + (HIGH - LOW) * torch.rand(5, 2)
    half = (HIGH - LOW) / 2
    y = (action - (HIGH + LOW) / 2) / half
    u = 0.5 * torch.log((1 + y) / (1 - y))  # atanh
    normal = -((u - loc) ** 2) / (2 * scale**2) - torch.log(scale) - 0.5 * math.log(2 * math.pi)
    hand = (normal - torch.log(1 - y**2) - torch.log(half)).sum(-1)
    got = squashed_gaussian(loc, scale, LOW, HIGH).log_prob(action)
    assert got.shape == (5,)
    torch.testing.assert_close(got, hand, rtol=1e-4, atol=1e-4)
    # the same density as torch's own tanh-then-affine transformed Normal
    ref = D.TransformedDistribution(
        D.Normal(loc, scale),
        [D.TanhTransform(), D.AffineTransform((HIGH + LOW) / 2, half)],
    )
    torch.testing.assert_close(got, ref.log_prob(action).sum(-1), rtol=1e-4, atol=1e-4)


def test_samples_stay_in_the_bounds_and_keep_a_finite_log_prob():
    torch.manual_seed(0)
    loc = torch.tensor([[-40.0, 40.0], [40.0, -40.0], [0.0, 0.0]]).repeat(100, 1)
    dist = squashed_gaussian(loc, torch.full_like(loc, 7.0), LOW, HIGH)
    action = dist.sample()
    assert ((action >= LOW) & (action <= HIGH)).all()
    assert torch.isfinite(dist.log_prob(action)).all()
    # on the bounds exactly (tanh rounds to +-1): clamped, still finite
    assert torch.isfinite(dist.log_prob(torch.stack([LOW, HIGH]).repeat(150, 1))).all()


def test_entropy_estimate_is_unbiased_and_differentiable():
    torch.manual_seed(0)
    loc = torch.full((20_000, 1), 0.3)
    log_std = torch.zeros(1, requires_grad=True)
    d = ScaledTanhNormal(loc, log_std.exp().expand_as(loc), LOW[:1], HIGH[:1])
    estimate = d.entropy().mean()
    estimate.backward()
    assert log_std.grad is not None and log_std.grad.abs() > 0
    with torch.no_grad():  # Monte Carlo of -E[log p(a)] from fresh samples
        reference = -d.log_prob(d.sample()).mean()
    assert abs(estimate.item() - reference.item()) < 0.05
