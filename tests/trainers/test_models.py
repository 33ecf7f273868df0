"""ObservationNorm and ActorCritic's observation scaling (recurrl/trainers/models.py)."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from recurrl.trainers.config import ModelConfig
from recurrl.trainers.models import ActorCritic, ObservationNorm


def test_observation_norm_is_the_identity_until_fitted_then_standardizes():
    norm = ObservationNorm(2, extra_scale=3.0)
    x = torch.tensor([[1.0, -2.0], [3.0, 6.0], [5.0, 14.0]])
    assert torch.equal(norm(x), 3.0 * x)
    norm.fit(x)
    out = norm(x)
    torch.testing.assert_close(out.mean(0), torch.zeros(2))
    torch.testing.assert_close(out.std(0), torch.full((2,), 3.0))
    constant = ObservationNorm(1)
    constant.fit(torch.ones(4, 1))  # zero std: clamped, no division by zero
    assert torch.isfinite(constant(torch.ones(2, 1))).all()


def test_actor_critic_obs_norm_feeds_both_trunks_the_standardized_vector():
    torch.manual_seed(0)
    cfg = ModelConfig(memory="none", hidden_size=8)
    model = ActorCritic(cfg, 2, 2, obs_scale=1.0, obs_norm=True)
    assert model.obs_norm is not None
    obs = torch.randn(16, 2) * torch.tensor([0.1, 5.0]) + torch.tensor([1.0, -3.0])
    model.obs_norm.fit(obs)
    td = TensorDict(observation=obs, batch_size=[16])
    model.actor(td)
    model.critic(td)
    torch.testing.assert_close(td["scaled_observation"].mean(0), torch.zeros(2), atol=1e-5, rtol=0)
    torch.testing.assert_close(td["scaled_observation"].std(0), torch.ones(2))
    # saved with the model: a fresh model loading the state dict normalizes the same way
    fresh = ActorCritic(cfg, 2, 2, obs_scale=1.0, obs_norm=True)
    fresh.load_state_dict(model.state_dict())
    torch.testing.assert_close(fresh.obs_norm.loc, model.obs_norm.loc)
    plain = ActorCritic(cfg, 2, 2, obs_scale=10.0)
    assert plain.obs_norm is None
    td = TensorDict(observation=obs, batch_size=[16])
    plain.actor(td)
    torch.testing.assert_close(td["scaled_observation"], 10.0 * obs)
