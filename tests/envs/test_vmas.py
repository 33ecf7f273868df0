"""VmasEnv: VMAS scenarios with the key convention, against the raw VMAS env."""

from __future__ import annotations

import pytest
import torch

vmas = pytest.importorskip("vmas", reason="pip install 'recurrl[vmas]'")

from recurrl.envs import VmasEnv, check_env_specs, make_multiagent_env  # noqa: E402


def _raw(num_envs: int, continuous: bool = True, max_steps: int = 5):
    return vmas.make_env(
        "balance", num_envs=num_envs, device="cpu", continuous_actions=continuous, seed=0,
        max_steps=max_steps, terminated_truncated=True,
    )  # fmt: skip


@pytest.mark.parametrize("continuous", [True, False])
def test_specs_and_shapes(continuous):
    env = VmasEnv("balance", num_envs=4, continuous_actions=continuous, max_steps=3, seed=0)
    td = env.reset()
    assert td["agents", "observation"].shape == (4, 3, 16) and td["state"].shape == (4, 48)
    assert td["agents", "mask"].all()
    if continuous:
        assert env.action_spec.shape == (4, 3, 2) and env.action_spec.dtype == torch.float32
    else:
        assert env.action_spec.shape == (4, 3) and env.action_spec.dtype == torch.int64
    check_env_specs(env, seed=0, steps=7)


@pytest.mark.parametrize("continuous", [True, False])
def test_same_seed_same_observations_and_rewards_as_raw_vmas(continuous):
    env = VmasEnv("balance", num_envs=3, continuous_actions=continuous, max_steps=5, seed=0)
    raw = _raw(3, continuous)
    # VMAS keeps one random state for all its envs in a process: seed right before a reset
    env.set_seed(0)
    td = env.reset()
    obs = raw.reset(seed=0)
    torch.testing.assert_close(td["agents", "observation"], torch.stack(obs, 1))
    torch.testing.assert_close(td["state"], torch.cat(obs, -1))
    torch.manual_seed(0)
    for _ in range(5):
        td = env.step(env.rand_action(td))
        actions = [td["agents", "action"][:, j] for j in range(3)]
        obs, rew, term, trunc, _ = raw.step(actions)
        torch.testing.assert_close(td["next", "agents", "observation"], torch.stack(obs, 1))
        torch.testing.assert_close(td["next", "agents", "reward"], torch.stack(rew, 1)[..., None])
        assert td["next", "terminated"].squeeze(-1).tolist() == term.tolist()
        done = (term | trunc).reshape(3, 1, 1).expand(3, 3, 1)
        assert (td["next", "agents", "done"] == done).all()
        td = env.step_mdp(td)
    assert td["done"].all() and td["truncated"].all() and td["agents", "done"].all()


def test_partial_reset_resets_only_the_masked_rows():
    env = VmasEnv("balance", num_envs=3, max_steps=4, seed=0)
    raw = _raw(3, max_steps=4)
    env.set_seed(0)
    td = env.reset()
    raw.reset(seed=0)
    torch.manual_seed(1)
    for _ in range(2):
        td = env.step(env.rand_action(td))
        raw.step([td["agents", "action"][:, j] for j in range(3)])
        td = env.step_mdp(td)
    before = td["agents", "observation"].clone()
    td["_reset"] = torch.tensor([[False], [True], [False]])
    env.set_seed(5)
    out = env.reset(td)
    raw.seed(5)
    expected = torch.stack(raw.reset_at(1), 1)
    torch.testing.assert_close(out["agents", "observation"], expected)
    torch.testing.assert_close(out["agents", "observation"][[0, 2]], before[[0, 2]])
    # row 1 restarted its horizon: it finishes two steps after the others
    td.update(out)
    del td["_reset"]
    data = env.rollout(4, auto_reset=False, tensordict=td, break_when_any_done=False)
    assert data["next", "done"].squeeze(-1).tolist() == [
        [False, True, False, False],
        [False, False, False, True],
        [False, True, False, False],
    ]


def test_env_ids_and_scenario_kwargs():
    env = make_multiagent_env("vmas:balance", 2, seed=0, max_episode_steps=3, n_agents=4)
    assert isinstance(env, VmasEnv) and env.reset()["agents"].batch_size == (2, 4)
    assert env.rollout(10).shape == (2, 3)
    with pytest.raises(ValueError, match="group_map"):
        VmasEnv("balance", num_envs=1, group_map="everyone")
