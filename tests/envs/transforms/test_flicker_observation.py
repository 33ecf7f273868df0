"""Tests of recurrl.envs.transforms.FlickerObservation."""

import pytest
import torch
from tensordict import TensorDict

from recurrl.envs import Bounded, FlickerObservation, TransformedEnv, Unbounded
from recurrl.testing import CountingEnv


def _observations(transform, batch=(64,), steps=20):
    env = TransformedEnv(CountingEnv(batch), transform)
    return env.rollout(steps)["next", "observation"]


def test_hides_whole_observations_at_the_rate_p():
    obs = _observations(FlickerObservation(0.3, seed=0), batch=(256,), steps=40)
    full = _observations(FlickerObservation(0.0, seed=0), batch=(256,), steps=40)
    hidden = (obs == 0).all(-1) & (full != 0).any(-1)
    shown = (obs == full).all(-1)
    assert bool((hidden | shown).all())  # an observation is either kept whole or zeroed whole
    assert abs(hidden.float().mean().item() - 0.3) < 0.02


def test_p_zero_changes_nothing():
    full = TransformedEnv(CountingEnv((8,)), FlickerObservation(0.0)).rollout(5)
    plain = CountingEnv((8,)).rollout(5)
    assert torch.equal(full["next", "observation"], plain["next", "observation"])


def test_the_draws_follow_the_seed():
    a = _observations(FlickerObservation(0.5, seed=1))
    b = _observations(FlickerObservation(0.5, seed=1))
    c = _observations(FlickerObservation(0.5, seed=2))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_each_agent_flickers_on_its_own():
    transform = FlickerObservation(0.5, seed=0)
    obs = torch.arange(1.0, 1 + 512 * 3 * 4).reshape(512, 3, 4)  # [B, n_agents, F], no zeros
    out = transform._apply_transform(obs)
    hidden = (out == 0).all(-1)  # [B, n_agents]
    assert bool(((out == 0).any(-1) == hidden).all())  # an agent's features go together
    # agents of one row are hidden independently: rows with some but not all agents hidden
    mixed = hidden.any(-1) & ~hidden.all(-1)
    assert mixed.float().mean().item() > 0.6  # 1 - 2 * 0.5**3 = 0.75 expected
    # feature_dims=2 hides a whole row (all agents) together
    rows = FlickerObservation(0.5, seed=0, feature_dims=2)._apply_transform(obs)
    row_hidden = (rows == 0).flatten(1).all(-1)
    assert bool(((rows == 0).flatten(1).any(-1) == row_hidden).all())


def test_reset_outputs_flicker_too():
    transform = FlickerObservation(0.5, out_key="seen", seed=0)
    reset = TensorDict({"observation": torch.ones(256, 3)}, [256])
    seen = transform._reset(TensorDict({}, [256]), reset)["seen"]
    hidden = (seen == 0).all(-1)
    assert 0.35 < hidden.float().mean().item() < 0.65
    assert bool((seen[~hidden] == 1).all())
    assert torch.equal(reset["observation"], torch.ones(256, 3))  # the input is left as it was


def test_spec_is_unchanged_and_bounds_must_hold_zero():
    env = TransformedEnv(CountingEnv((2,)), FlickerObservation(0.5))
    assert env.observation_spec["observation"] == Unbounded((2, 3))
    transform = FlickerObservation(0.5)
    ok = Bounded(-torch.ones(3), torch.ones(3), shape=(3,))
    assert transform._transform_spec(ok) == ok
    with pytest.raises(ValueError, match=r"bounds exclude 0.*Fix"):
        transform._transform_spec(Bounded(torch.ones(3), 2 * torch.ones(3), shape=(3,)))


@pytest.mark.parametrize("p", [-0.1, 1.0, 2, True, "0.5", float("nan")])
def test_bad_probabilities_are_refused(p):
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        FlickerObservation(p)


@pytest.mark.parametrize("dims", [-1, 1.0, True])
def test_bad_feature_dims_are_refused(dims):
    with pytest.raises(ValueError, match="feature_dims an int >= 0"):
        FlickerObservation(0.5, feature_dims=dims)
